"""ADV601: a transformers model loaded with (or set to) eager attention."""

from __future__ import annotations

import json
import os

from advisor.contracts.finding import display_path
from advisor.contracts.site_rule import SiteRule
from advisor.lazy import lazy_import
from advisor.contracts.rule import negative, positive
from advisor.rules.attention_config._links import HF_ATTENTION, HF_SDPA

config = lazy_import("advisor.hf.config_rules")
scope = lazy_import("advisor.patterns.scope")
tree_facts = lazy_import("advisor.static.tree_facts")

CHECKPOINT_CONFIGS = ("config.json", "generation_config.json")  # a checkpoint's files that may set output_attentions
FILE_READERS = {"load", "loads", "safe_load", "full_load", "from_json_file", "from_file", "read_json"}


def check(site):
    """`attn_implementation="eager"` given to a loader or `set_attn_implementation`, or assigned to a config's
    `attn_implementation`/`_attn_implementation`."""
    import libcst as cst

    values = []
    if isinstance(site.node, cst.Assign):
        values = [site.node.value for target in site.node.targets if isinstance(target.target, cst.Attribute)
                  and target.target.attr.value in ("_attn_implementation", "attn_implementation")]
    elif site.is_loader or site.method == "set_attn_implementation":
        values = [arg.value for arg in site.node.args if arg.keyword is not None
                  and arg.keyword.value == "attn_implementation"]
        if site.method == "set_attn_implementation" and site.node.args and site.node.args[0].keyword is None:
            values.append(site.node.args[0].value)
    return [_eager(site, value) for value in values
            if isinstance(value, cst.SimpleString) and value.evaluated_value == "eager"]


def _eager(site, value):
    """"sdpa" for "eager": safe for a concrete transformers class declaring SDPA support, when nothing in the file
    asks for the attention weights."""
    quote = value.value[0]
    hint = ' (or "flash_attention_2" with the flash_attn package: this script runs on CUDA in fp16/bf16)' \
        if _on_cuda_half(site.parsed.source) else ""
    reasons = () if _declares_sdpa(site.dotted) else (
        "assumes the model family supports SDPA (the loaded class is not a concrete transformers class declaring it; "
        "transformers raises at load time otherwise)",)
    wants_weights = _output_attentions_lines(site.parsed)
    if wants_weights:
        reasons += (f"output_attentions=True at line {wants_weights[0]} needs the eager attention weights",)
    loaded = _loaded_keywords(site.parsed)
    if loaded is not None:
        reasons += (f"the keywords passed at line {loaded} are read from a file, and may set output_attentions",)
    checkpoint = _checkpoint_asking(site.parsed)
    if checkpoint is not None:
        reasons += (f"`{checkpoint}` sets output_attentions: transformers refuses to load it under sdpa",)
    elsewhere = _output_attentions_elsewhere(site.parsed)
    if elsewhere is not None:
        reasons += (f"`{elsewhere}` mentions output_attentions: the model may be asked for the eager attention "
                    "weights there (transformers raises under sdpa)",)
    reasons += _fused_kernel_hazards(site)
    return site.match(RULE, message=f'transformers model loaded with eager attention: use attn_implementation="sdpa"'
                                    f'{hint}', reasons=reasons, edit=config.SourceEdit(value, f"{quote}sdpa{quote}"),
                      unsafe=bool(reasons))


def _fused_kernel_hazards(site) -> tuple[str, ...]:
    """What in the scanned tree SDPA's fused kernels fail where eager attention runs (breaker round 21), as for a
    hand-written block's patch: double backward or forward-mode AD asked (they have neither derivative), and SDPA's
    kernels restricted without its math kernel (`No available kernel` where a fused one refuses the call)."""
    asked = (site.autograd or tree_facts.TreeFacts.of_file(site.parsed)).autograd
    reasons = ()
    if asked:
        where = f" at {display_path(asked[0].path)}:{asked[0].line}" if asked[0].path is not None else ""
        reasons += (f"{asked[0].what}{where}: SDPA's fused kernels have no double backward or forward-mode "
                    "derivative",)
    restricted = scope.sdpa_kernels_restricted(site.parsed)
    if restricted is not None:
        reasons += (f"SDPA's kernels are restricted ({restricted}): the eager model ignores that, a fused kernel "
                    "may refuse the call and then none is available",)
    return reasons


def _output_attentions_lines(parsed) -> list[int]:
    """The lines that may ask for the weights: `output_attentions=True` passed, set on a config
    (`model.config.output_attentions = True`), or the name as a string (a kwargs dict, `setattr`)."""
    import libcst as cst

    passed = [parsed.line(call) for call in parsed.calls_and_classes[0]
              if any(arg.keyword is not None and arg.keyword.value == "output_attentions"
                     and not _off(arg.value) for arg in call.args)]  # a variable may be True (breaker round 16)
    assigned = [parsed.line(node) for node in parsed.nodes_of(cst.Assign) if not _off(node.value) and any(
        isinstance(target.target, cst.Attribute) and target.target.attr.value == "output_attentions"
        for target in node.targets)]
    named = [parsed.line(node) for node in parsed.nodes_of(cst.SimpleString)  # `{"output_attentions": True}`,
             if node.value.strip("\"'") == "output_attentions"]  # `setattr(cfg, "output_attentions", True)`: round 16
    return sorted(passed + assigned + named)


def _off(value) -> bool:
    """A literal False or None: the only values that surely ask for no weights."""
    return config.literal_bool(value) is False or getattr(value, "value", None) == "None"


def _checkpoint_asking(parsed) -> str | None:
    """A checkpoint folder beside the file that it names (`from_pretrained("ckpt")`) whose config.json sets
    output_attentions (transformers then refuses to load it under sdpa: breaker round 16), or whose
    generation_config.json does (`generate()` then returns the attention maps, which sdpa has none of: round 19).
    The configs are noted as read, also where they are not there yet (a file outside the scan is never reused
    from the cache), so an edit of one, or a checkpoint saved there later, drops a cached result (promise round 32)."""
    import libcst as cst

    folder = os.path.dirname(os.path.abspath(parsed.path))
    for node in parsed.nodes_of(cst.SimpleString):
        name = node.evaluated_value if isinstance(node.evaluated_value, str) else ""
        for config_name in CHECKPOINT_CONFIGS if name and len(name) < 4096 else ():
            config_file = os.path.join(folder, name, config_name)
            parsed.note_read(config_file)
            if os.path.isfile(config_file):
                if _asks_for_weights(config_file):
                    return display_path(config_file)
    return None


def _loaded_keywords(parsed) -> int | None:
    """The line of a call given `**settings` read from a file (`json.load`, `yaml.safe_load`, ...), directly or
    through a name the file binds to one: its keys are not in the source, and may ask for the weights."""
    import libcst as cst

    loaded = {target.target.value for node in parsed.nodes_of(cst.Assign) if _reads_a_file(node.value)
              for target in node.targets if isinstance(target.target, cst.Name)}
    for call in parsed.calls_and_classes[0]:
        for arg in call.args:
            if arg.star == "**" and (_reads_a_file(arg.value) or
                                     isinstance(arg.value, cst.Name) and arg.value.value in loaded):
                return parsed.line(call)
    return None


def _reads_a_file(value) -> bool:
    import libcst as cst

    return isinstance(value, cst.Call) and isinstance(value.func, (cst.Attribute, cst.Name)) and \
        (value.func.attr if isinstance(value.func, cst.Attribute) else value.func).value in FILE_READERS


def _asks_for_weights(config_file: str) -> bool:
    try:
        with open(config_file, encoding="utf-8") as handle:
            return bool(json.load(handle).get("output_attentions"))
    except (OSError, ValueError, AttributeError):
        return True  # unreadable: it may


def _output_attentions_elsewhere(parsed) -> str | None:
    """Another file of the scanned tree that names output_attentions (it may pass the model or its config there,
    and ask for the weights: breaker round 14, `out = m(ids, output_attentions=True)` in the training script)."""
    tree = parsed.tree
    others = [path for path in tree.mentioning("output_attentions")
              if os.path.realpath(path) != os.path.realpath(parsed.path)] if tree is not None else []
    return display_path(others[0]) if others else None


def _on_cuda_half(text: str) -> bool:
    """The script moves work to CUDA and uses fp16/bf16 somewhere (dtype arguments, .half(), .bfloat16())."""
    cuda = any(token in text for token in ('"cuda', "'cuda", ".cuda()", 'device_map="auto"', "device_map='auto'"))
    return cuda and any(token in text for token in ("float16", "bfloat16", ".half()"))


def _declares_sdpa(dotted: str) -> bool:
    """A concrete transformers model class whose `_supports_sdpa` is True (imports the installed transformers,
    never user code)."""
    if not dotted.startswith("transformers.") or not dotted.endswith(config.LOADERS):
        return False
    class_name = dotted.split(".")[-2]
    if class_name.startswith(("Auto", "TF", "Flax")):
        return False
    return getattr(config.installed_class(class_name), "_supports_sdpa", False) is True


RULE = SiteRule(
    code="ADV601", kind="hf-attn-implementation", title="transformers model loaded with eager attention",
    summary="transformers model loaded with `attn_implementation=\"eager\"` (from_pretrained, from_config, configs, "
            "`_attn_implementation =`, `set_attn_implementation`)",
    fix="attn-implementation-sdpa", fix_safety="unsafe",
    fix_summary="`\"sdpa\"`: safe for a concrete class (of the installed transformers, never a folder of the scanned "
                "repository) declaring SDPA support and nothing in the file that may ask for the weights "
                "(`output_attentions=` anything but `False`/`None`, the name as a string: a kwargs dict, `setattr`; "
                "`**settings` read from a file by `json.load` and the like), "
                "no mention of it in another file of the scan, and no checkpoint folder beside the file that the "
                "file names whose `config.json` or `generation_config.json` sets it, and nothing in the scan that "
                "SDPA's fused kernels fail (double backward or forward-mode AD asked, SDPA's kernels restricted "
                "without its math kernel); else unsafe. Accepted, as "
                "for SDPA patches: a sample that is "
                "all padding gets transformers' sdpa values where eager gives uniform weights (its outputs differ, "
                "9e-3 measured on BERT; every other sample agrees to 1e-7)",
    what="Finds attn_implementation=\"eager\" in from_pretrained, from_config, a model config, "
         "config._attn_implementation or set_attn_implementation.",
    why="Every attention layer of the model then runs the hand-written matmul + softmax path: the L x S weights are "
        "materialised in every layer. \"sdpa\" runs torch's scaled_dot_product_attention (flash / memory-efficient "
        "kernels) with the same function; on a CUDA script in fp16/bf16, \"flash_attention_2\" is faster still.",
    fix_doc="Replaces \"eager\" by \"sdpa\" in the user's own code, never in library files. Safe only when the "
            "loaded class is a concrete transformers class that declares SDPA support and nothing in the file asks "
            "for the attention weights (output_attentions=True, or set on a config) and no other file of the scan "
            "names output_attentions, and nothing in the scan asks for double backward or forward-mode AD or "
            "restricts SDPA's kernels (SDPA's fused kernels fail there where eager attention runs); otherwise "
            "unsafe, saying which it could not prove.",
    examples=(
        positive('from transformers import LlamaForCausalLM\n'
                 'm = LlamaForCausalLM.from_pretrained("x", attn_implementation="eager")\n',
                 fixed='from transformers import LlamaForCausalLM\n'
                       'm = LlamaForCausalLM.from_pretrained("x", attn_implementation="sdpa")\n'),
        negative('from transformers import AutoModel\n'
                 'm = AutoModel.from_pretrained("x", attn_implementation="sdpa")\n'),
        negative('def f(db):\n    db.connect(attn_implementation="eager")\n'),
    ),
    references=(HF_ATTENTION, HF_SDPA),
    tokens=('attn_implementation',), check=check,
)
