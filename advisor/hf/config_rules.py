"""Attention configuration in the user's own code: Hugging Face settings that force the eager path, and the
deprecated SDPA kernel context manager.

The rules read calls and assignments only (never run anything) and resolve names through the file's imports,
so `from transformers import AutoModel as M; M.from_pretrained(..., attn_implementation="eager")` and
`import torch.backends.cuda as c; c.sdp_kernel(...)` are found alike. Library files (site-packages) are never
reported or patched: a one-line setting in the user's script switches the whole model instead.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import PurePath

import libcst as cst

from advisor.rewrite.apply import SourceEdit
from advisor.rewrite.backends import kernel_names
from advisor.rules import attention_config as units
from advisor.static.module_index import ParsedModule

LIBRARY_DIRS = ("site-packages", "dist-packages")
EAGER, SDPA_KERNEL_RULE = units.EAGER.code, units.SDP_KERNEL.code
OUTPUT_ATTENTIONS, BETTER_TRANSFORMER = units.OUTPUT_ATTENTIONS.code, units.BETTER_TRANSFORMER.code
LOADERS = ("from_pretrained", "from_config", "_from_config")
INFERENCE_CONTEXTS = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad")
# torch.backends.cuda.sdp_kernel's flags, in positional order, and the backend each enables
SDP_KERNEL_FLAGS = (("enable_flash", "FLASH_ATTENTION"), ("enable_math", "MATH"),
                    ("enable_mem_efficient", "EFFICIENT_ATTENTION"), ("enable_cudnn", "CUDNN_ATTENTION"))
BACKEND_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION")  # as sdp_kernel lists them


@dataclass
class ConfigMatch:
    rule: str
    node: cst.CSTNode  # where the finding points
    function: str
    message: str | None = None  # replaces the rule title when the site adds something (a flash_attention_2 hint)
    reason: str | None = None  # why there is no fix, or what an unsafe fix assumes
    edit: SourceEdit | None = None
    unsafe: bool = False


def is_library_file(path: str) -> bool:
    return any(part in LIBRARY_DIRS for part in PurePath(path).parts)


def find_config_issues(parsed: ParsedModule) -> list[ConfigMatch]:
    if is_library_file(parsed.path) or not units.FAMILY.might_match(parsed.source.lower()):
        return []
    collector = _Collector(parsed)
    parsed.module.visit(collector)
    wants_weights = collector.output_attentions_lines
    for match in collector.found:
        if match.rule == EAGER and match.edit is not None and wants_weights:
            match.unsafe = True
            match.reason = _join(match.reason, f"output_attentions=True at line {wants_weights[0]} needs the eager "
                                               "attention weights")
    return collector.found


class _Collector(cst.CSTVisitor):
    def __init__(self, parsed: ParsedModule) -> None:
        self.parsed = parsed
        self.found: list[ConfigMatch] = []
        self.scope: list[str] = []
        self.inference_depth = 0
        self.output_attentions_lines: list[int] = []
        self.on_cuda_half = _on_cuda_half(parsed)

    # where we are ----------------------------------------------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scope.append(node.name.value)
        if any(self._is_inference_context(d.decorator) for d in node.decorators):
            self.inference_depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope.pop()
        if any(self._is_inference_context(d.decorator) for d in original_node.decorators):
            self.inference_depth -= 1

    def visit_With(self, node: cst.With) -> None:
        if any(self._is_inference_context(item.item) for item in node.items):
            self.inference_depth += 1

    def leave_With(self, original_node: cst.With) -> None:
        if any(self._is_inference_context(item.item) for item in original_node.items):
            self.inference_depth -= 1

    def _is_inference_context(self, node: cst.BaseExpression) -> bool:
        target = node.func if isinstance(node, cst.Call) else node
        return self.parsed.imported_name(target) in INFERENCE_CONTEXTS

    @property
    def function(self) -> str:
        return ".".join(self.scope) or "<module>"

    # the rules ---------------------------------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        dotted = self.parsed.imported_name(node.func) or ""
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        if dotted == "torch.backends.cuda.sdp_kernel":
            self.found.append(self._sdp_kernel(node))
        elif method == "to_bettertransformer" or dotted.endswith("BetterTransformer.transform"):
            self.found.append(ConfigMatch(BETTER_TRANSFORMER, node, self.function))
        is_loader = method in LOADERS or dotted.startswith("transformers.")
        for arg in node.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword == "attn_implementation" and (is_loader or method == "set_attn_implementation"):
                self._eager(node, arg.value)
            elif keyword == "output_attentions" and _is_true(arg.value):
                self._output_attentions(node, is_loader or method == "generate")
        if method == "set_attn_implementation" and node.args and node.args[0].keyword is None:
            self._eager(node, node.args[0].value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Attribute) and \
                    target.target.attr.value in ("_attn_implementation", "attn_implementation"):
                self._eager(node, node.value)

    def _eager(self, site: cst.CSTNode, value: cst.BaseExpression) -> None:
        if not (isinstance(value, cst.SimpleString) and value.evaluated_value == "eager"):
            return
        quote = value.value[0]
        edit = SourceEdit(value, f"{quote}sdpa{quote}")
        hint = ' (or "flash_attention_2" with the flash_attn package: this script runs on CUDA in fp16/bf16)' \
            if self.on_cuda_half else ""
        message = f'transformers model loaded with eager attention: use attn_implementation="sdpa"{hint}'
        supported = _declares_sdpa(self.parsed.imported_name(site.func) if isinstance(site, cst.Call) else None)
        reason = None if supported else ("assumes the model family supports SDPA (the loaded class is not a "
                                         "concrete transformers class declaring it; transformers raises at load "
                                         "time otherwise)")
        self.found.append(ConfigMatch(EAGER, site, self.function, message=message, reason=reason, edit=edit,
                                      unsafe=not supported))

    def _output_attentions(self, node: cst.Call, loads_or_generates: bool) -> None:
        self.output_attentions_lines.append(self.parsed.line(node))
        if loads_or_generates or self.inference_depth:
            self.found.append(ConfigMatch(OUTPUT_ATTENTIONS, node, self.function,
                                          reason="returning attention weights forces the eager path; drop "
                                                 "output_attentions=True where they are not used"))

    def _sdp_kernel(self, node: cst.Call) -> ConfigMatch:
        flags = _sdp_kernel_flags(node)
        if isinstance(flags, str):
            return ConfigMatch(SDPA_KERNEL_RULE, node, self.function, reason=flags)
        names = kernel_names(self.parsed)
        if isinstance(names, str):
            return ConfigMatch(SDPA_KERNEL_RULE, node, self.function, reason=f"no fix: {names}")
        backends = ", ".join(f"{names.backend}.{b}" for b in BACKEND_ORDER if flags[b])
        edit = SourceEdit(node, f"{names.sdpa_kernel}([{backends}])",
                          (names.import_line,) if names.import_line else ())
        return ConfigMatch(SDPA_KERNEL_RULE, node, self.function, edit=edit)


def _sdp_kernel_flags(node: cst.Call) -> dict[str, bool] | str:
    """Backend -> enabled, from literal flags (an omitted flag is True, as in sdp_kernel's signature)."""
    enabled = {backend: True for _, backend in SDP_KERNEL_FLAGS}
    by_name = dict(SDP_KERNEL_FLAGS)
    for position, arg in enumerate(node.args):
        if arg.star or (arg.keyword is None and position >= len(SDP_KERNEL_FLAGS)):
            return "no fix: the flags are not plain arguments"
        name = arg.keyword.value if arg.keyword is not None else SDP_KERNEL_FLAGS[position][0]
        if name not in by_name or not isinstance(arg.value, cst.Name) or arg.value.value not in ("True", "False"):
            return f"no fix: `{name}` is not a literal True/False, so the backend list depends on run-time values"
        enabled[by_name[name]] = arg.value.value == "True"
    return enabled


def _on_cuda_half(parsed: ParsedModule) -> bool:
    """The script moves work to CUDA and uses fp16/bf16 somewhere (dtype arguments, .half(), .bfloat16())."""
    text = parsed.source
    cuda = any(token in text for token in ('"cuda', "'cuda", ".cuda()", 'device_map="auto"', "device_map='auto'"))
    half = any(token in text for token in ("float16", "bfloat16", ".half()"))
    return cuda and half


def _declares_sdpa(dotted: str | None) -> bool:
    """A concrete transformers model class whose `_supports_sdpa` is True (imports transformers, never user code)."""
    if not dotted or not dotted.startswith("transformers.") or not dotted.endswith(LOADERS):
        return False
    class_name = dotted.split(".")[-2]
    if class_name.startswith(("Auto", "TF", "Flax")):
        return False
    try:
        model_class = getattr(importlib.import_module("transformers"), class_name, None)
    except Exception:  # noqa: BLE001 - a broken install means "not proved", never a crash of the scan
        return False
    return getattr(model_class, "_supports_sdpa", False) is True


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _join(first: str | None, second: str) -> str:
    return second if first is None else f"{first}; {second}"
