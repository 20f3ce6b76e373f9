"""ADV701: the deprecated torch.backends.cuda.sdp_kernel context manager."""

from __future__ import annotations

from advisor.contracts.site_rule import SiteRule
from advisor.lazy import lazy_import
from advisor.contracts.rule import positive

backends = lazy_import("advisor.rewrite.backends")
config = lazy_import("advisor.hf.config_rules")

# sdp_kernel's flags, in positional order, and the backend each enables
FLAGS = (("enable_flash", "FLASH_ATTENTION"), ("enable_math", "MATH"), ("enable_mem_efficient", "EFFICIENT_ATTENTION"),
         ("enable_cudnn", "CUDNN_ATTENTION"))
BACKEND_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")  # as sdp_kernel lists them


def check(site):
    """`sdp_kernel(...)` -> `sdpa_kernel([...])` with the backends its literal flags enable."""
    import libcst as cst

    if site.dotted != "torch.backends.cuda.sdp_kernel":
        return []
    flags = _flags(site.node)
    if isinstance(flags, str):
        return [site.match(RULE, reasons=(flags,))]
    if site.parsed.innermost(site.node, (cst.ExceptHandler, cst.ExceptStarHandler)) is not None:
        return [site.match(RULE, reasons=("no fix: the call is in an `except` block, the fallback of a torch whose "
                                          "import of torch.nn.attention may have failed there",))]
    names = backends.kernel_names(site.parsed, site.node)
    if isinstance(names, str):
        return [site.match(RULE, reasons=(f"no fix: {names}",))]
    listed = ", ".join(f"{names.backend}.{backend}" for backend in BACKEND_ORDER if flags[backend])
    edit = config.SourceEdit(site.node, f"{names.sdpa_kernel}([{listed}])",
                             (names.import_line,) if names.import_line else ())
    return [site.match(RULE, edit=edit)]


def _flags(node) -> dict[str, bool] | str:
    """Backend -> enabled, from literal flags (an omitted flag is True, as in sdp_kernel's signature)."""
    enabled = {backend: True for _, backend in FLAGS}
    by_name = dict(FLAGS)
    for position, arg in enumerate(node.args):
        if arg.star or (arg.keyword is None and position >= len(FLAGS)):
            return "no fix: the flags are not plain arguments"
        name = arg.keyword.value if arg.keyword is not None else FLAGS[position][0]
        value = config.literal_bool(arg.value)
        if name not in by_name or value is None:
            return f"no fix: `{name}` is not a literal True/False, so the backend list depends on run-time values"
        enabled[by_name[name]] = value
    return enabled


RULE = SiteRule(
    code="ADV701", kind="deprecated-api",
    title="torch.backends.cuda.sdp_kernel is deprecated: use torch.nn.attention.sdpa_kernel",
    summary="deprecated `torch.backends.cuda.sdp_kernel(...)`", fix="sdpa-kernel", fix_safety="safe",
    fix_summary="safe: `sdpa_kernel([...])` with the same backend list",
    what="Finds torch.backends.cuda.sdp_kernel(enable_flash=..., enable_math=..., enable_mem_efficient=..., "
         "enable_cudnn=...).",
    why="It emits a FutureWarning and will be removed; it is implemented as torch.nn.attention.sdpa_kernel over the "
        "list of the enabled backends.",
    fix_doc="Safe: the call becomes sdpa_kernel([...]) with the same backends (and the import it needs). Flags that "
            "are not literal True/False get no fix (the list would depend on run-time values).",
    examples=(
        positive('import torch\n\n\ndef run(f):\n    with torch.backends.cuda.sdp_kernel(enable_math=False):\n'
                 '        return f()\n',
                 fixed='import torch\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n\n\ndef run(f):\n'
                       '    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, '
                       'SDPBackend.CUDNN_ATTENTION]):\n        return f()\n'),
    ),
    references=("https://pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html",),
    tokens=('sdp_kernel',), check=check,
)
