"""Hugging Face attention configuration (ADV601-603) and the deprecated sdp_kernel (ADV701), on user scripts."""

from __future__ import annotations

import itertools
import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from advisor.cli import main
from advisor.engine.static import analyze_source, scan_paths

SERVING_SCRIPT = textwrap.dedent('''\
    """Serve a causal LM over HTTP (the model is loaded once at start-up)."""
    import torch
    from fastapi import FastAPI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    MODEL_ID = "meta-llama/Llama-3.2-1B-Instruct"

    app = FastAPI()
    tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
    model = AutoModelForCausalLM.from_pretrained(
        MODEL_ID,
        torch_dtype=torch.bfloat16,
        attn_implementation="eager",  # pinned when we debugged attention maps
        device_map="cuda",
    )
    model.eval()


    @app.post("/generate")
    @torch.inference_mode()
    def generate(prompt: str, max_new_tokens: int = 128) -> dict:
        inputs = tokenizer(prompt, return_tensors="pt").to("cuda")
        with torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False):
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return {"text": tokenizer.decode(output[0], skip_special_tokens=True)}
''')


def _findings(source: str, path: str = "serve.py", **options):
    return analyze_source(source, path, **options).findings


def _rules(source: str, path: str = "serve.py") -> list[str]:
    return [f.rule for f in _findings(source, path)]


def test_serving_script_gets_both_findings_with_fixes(tmp_path, capsys):
    script = tmp_path / "serve.py"
    script.write_text(SERVING_SCRIPT, encoding="utf-8")
    assert main(["scan", "--format", "json", str(script)]) == 1
    findings = {f["rule"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert set(findings) == {"ADV601", "ADV701"}
    eager, deprecated = findings["ADV601"], findings["ADV701"]
    assert eager["kind"] == "hf-attn-implementation" and deprecated["kind"] == "deprecated-api"
    assert eager["line"] == 10 and deprecated["line"] == 23 and deprecated["function"] == "generate"
    assert eager["fixable"] and eager["fix_safety"] == "unsafe" and "supports SDPA" in eager["reason"]
    assert "flash_attention_2" in eager["message"]  # CUDA + bf16 script
    assert deprecated["fixable"] and deprecated["fix_safety"] == "safe"
    assert main(["fix", "--apply", "--unsafe-fixes", str(script)]) == 0
    fixed = script.read_text(encoding="utf-8")
    changed = [line for line in fixed.splitlines() if line not in SERVING_SCRIPT.splitlines()]
    assert changed == ["from torch.nn.attention import SDPBackend, sdpa_kernel",
                       '    attn_implementation="sdpa",  # pinned when we debugged attention maps',
                       "    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):"]
    assert len(fixed.splitlines()) == len(SERVING_SCRIPT.splitlines()) + 1
    assert _rules(fixed) == []
    capsys.readouterr()
    assert main(["fix", "--apply", "--unsafe-fixes", str(script)]) == 0  # idempotent
    assert script.read_text(encoding="utf-8") == fixed


@pytest.mark.parametrize("code", [
    'from transformers import AutoModel as M\nm = M.from_pretrained("x", attn_implementation="eager")',
    'import transformers as tf\nm = tf.AutoModel.from_pretrained("x", attn_implementation="eager")',
    'from transformers import AutoModel, AutoConfig\n'
    'm = AutoModel.from_config(AutoConfig(), attn_implementation="eager")',
    'from transformers import LlamaConfig\nconfig = LlamaConfig(hidden_size=64, attn_implementation="eager")',
    'config._attn_implementation = "eager"  # attn_implementation',
    'def load(model):\n    model.set_attn_implementation("eager")',
    "def load(model):\n    model.set_attn_implementation(attn_implementation='eager')",
])
def test_eager_attention_is_found_in_every_spelling(code):
    (finding,) = _findings(code + "\n")
    assert finding.rule == "ADV601" and finding.fixable
    assert "sdpa" in finding.patch and "eager" not in finding.patch.splitlines()[-1]


@pytest.mark.parametrize("code", [
    'from transformers import AutoModel\nm = AutoModel.from_pretrained("x", attn_implementation="sdpa")',
    'from transformers import AutoModel\nm = AutoModel.from_pretrained("x", attn_implementation=IMPL)',
    'def f(db):\n    db.connect(attn_implementation="eager")',  # not a transformers loader
])
def test_other_attention_settings_are_left_alone(code):
    assert _rules(code + "\n") == []


def test_concrete_class_with_sdpa_support_gets_a_safe_fix_unless_weights_are_requested():
    loader = 'from transformers import LlamaForCausalLM\nm = LlamaForCausalLM.from_pretrained("x", ' \
             'attn_implementation="eager")\n'
    (finding,) = _findings(loader)
    assert finding.fix_safety == "safe" and finding.reason is None
    assert "flash_attention_2" not in finding.message  # nothing says CUDA + half precision
    with_weights = loader + "out = m(ids, output_attentions=True)\n"
    (finding,) = _findings(with_weights)
    assert finding.fix_safety == "unsafe" and "output_attentions=True at line 3" in finding.reason
    (finding,) = _findings(loader + "m.config.output_attentions = True\n")
    assert finding.fix_safety == "unsafe" and "output_attentions=True at line 3" in finding.reason
    # breaker round 16: the same file asking through a kwargs dict or setattr (the patched script's
    # `out.attentions[0]` raised IndexError)
    for asks in ('extra = {"output_attentions": True}\nout = m(ids, **extra)\n',
                 'setattr(m.config, "output_attentions", True)\n', "out = m(ids, output_attentions=save_maps)\n",
                 "m.config.output_attentions = flag\n"):  # a variable may be True when the script runs
        (finding,) = _findings(loader + asks)
        assert finding.fix_safety == "unsafe" and "at line 3" in finding.reason
    (finding,) = _findings(loader + "out = m(ids, output_attentions=False)\n")
    assert finding.fix_safety == "safe"


@pytest.mark.parametrize("asks", [True, False])
def test_a_checkpoint_beside_the_file_whose_config_asks_for_the_weights_leaves_the_fix_unsafe(tmp_path, asks):
    """Breaker round 16: `from_pretrained("ckpt", attn_implementation="eager")` of a checkpoint saved with
    `output_attentions: true` in its config.json: under sdpa transformers refuses to load it."""
    import json

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama", "output_attentions": asks}))
    source = 'from transformers import LlamaForCausalLM\nm = LlamaForCausalLM.from_pretrained("ckpt", ' \
             'attn_implementation="eager")\n'
    (finding,) = _findings(source, str(tmp_path / "load.py"))
    assert (finding.fix_safety == "unsafe") == asks
    assert ("config.json" in (finding.reason or "")) == asks


@pytest.mark.parametrize("config_name", ["config.json", "generation_config.json"])
def test_a_checkpoint_whose_generation_config_asks_for_the_weights_leaves_the_fix_unsafe(tmp_path, config_name):
    """Breaker round 19: `generation_config.json` with `output_attentions: true` makes `generate()` return the
    attention maps, which sdpa has none of."""
    import json

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / config_name).write_text(json.dumps({"output_attentions": True}))
    source = 'from transformers import LlamaForCausalLM\nm = LlamaForCausalLM.from_pretrained("ckpt", ' \
             'attn_implementation="eager")\n'
    (finding,) = _findings(source, str(tmp_path / "load.py"))
    assert finding.fix_safety == "unsafe" and config_name in finding.reason


@pytest.mark.parametrize("config_name", ["config.json", "generation_config.json"])
def test_a_checkpoint_saved_after_a_cached_scan_is_read_by_the_next_scan(tmp_path, config_name):
    """Promise round 32: a config beside the file was noted as read only where it was there already, so a scan
    cached before the checkpoint was saved kept its "safe" fix, and `fix --apply` wrote sdpa for a checkpoint
    transformers then refused to load."""
    (tmp_path / "load.py").write_text('from transformers import LlamaForCausalLM\nm = LlamaForCausalLM.'
                                      'from_pretrained("ckpt", attn_implementation="eager")\n')
    for _ in range(2):  # cold, then warm
        (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.rule == "ADV601"]
        assert finding.fix_safety == "safe"
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / config_name).write_text(json.dumps({"model_type": "llama", "output_attentions": True}))
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.rule == "ADV601"]
    assert finding.fix_safety == "unsafe" and config_name in finding.reason


@pytest.mark.parametrize("call, safe", [("m.generate(ids, **settings)", False),
                                        ("m.generate(ids, **json.load(open('gen.json')))", False),
                                        ("m.generate(ids, **tokenizer(text))", True)])
def test_keywords_read_from_a_file_may_ask_for_the_weights(call, safe):
    """Breaker round 19: `generate(ids, **settings)` with settings loaded from JSON that set output_attentions."""
    source = ('import json\nfrom transformers import LlamaForCausalLM\nm = LlamaForCausalLM.from_pretrained("x", '
              'attn_implementation="eager")\nsettings = json.load(open("gen.json"))\n' + call + "\n")
    (finding,) = _findings(source)
    assert (finding.fix_safety == "safe") == safe, finding.reason


def test_sdp_kernel_gets_no_fix_where_its_names_are_taken_or_in_an_import_fallback():
    """Breaker round 19: the file defines its own `sdpa_kernel` (the fix would call it), or the call is the
    `except ImportError:` fallback where torch.nn.attention's names are unbound."""
    own = ("import torch\n\n\ndef sdpa_kernel(tag):\n    return tag\n\n\n"
           "def run():\n    return torch.backends.cuda.sdp_kernel(enable_math=False)\n")
    fallback = ("import torch\ntry:\n    from torch.nn.attention import SDPBackend, sdpa_kernel\nexcept ImportError:\n"
                "    def run():\n        return torch.backends.cuda.sdp_kernel(enable_math=False)\n")
    for source, why in ((own, "already used"), (fallback, "`except` block")):
        (finding,) = _findings(source)
        assert finding.patch is None and why in finding.reason, finding.reason


@pytest.mark.parametrize("asks", ["out = build('x')(ids, output_attentions=True)\n",
                                  "m = build('x')\nm.config.output_attentions = True\n"])
def test_weights_asked_for_in_another_file_of_the_scan_leave_the_fix_unsafe(tmp_path, asks):
    """A fourteenth breaker's: the loader in `model.py`, `output_attentions=True` in the training script; under
    sdpa transformers returns no weights (None) or raises at the config assignment."""
    (tmp_path / "model.py").write_text('from transformers import LlamaForCausalLM\n\n\ndef build(path):\n'
                                       '    return LlamaForCausalLM.from_pretrained(path, attn_implementation="eager")'
                                       '\n', encoding="utf-8")
    (tmp_path / "main.py").write_text("from model import build\n" + asks, encoding="utf-8")
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1, cache=False).findings if f.rule == "ADV601"]
    assert finding.fix_safety == "unsafe" and "main.py" in finding.reason
    (tmp_path / "main.py").write_text("from model import build\nm = build('x')\n", encoding="utf-8")
    (finding,) = [f for f in scan_paths([str(tmp_path)], jobs=1, cache=False).findings if f.rule == "ADV601"]
    assert finding.fix_safety == "safe"


def test_output_attentions_on_inference_paths():
    code = textwrap.dedent('''\
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained("x")

        def train_step(batch):
            return model(**batch, output_attentions=True)

        @torch.no_grad()
        def embed(batch):
            return model(**batch, output_attentions=True)

        def serve(batch):
            with torch.inference_mode():
                out = model(**batch, output_attentions=True)
            return model.generate(**batch, output_attentions=True)
    ''')
    found = [(f.rule, f.line, f.function) for f in _findings(code)]
    assert found == [("ADV602", 10, "embed"), ("ADV602", 14, "serve"), ("ADV602", 15, "serve")]
    assert all(not f.fixable and "eager" in f.reason for f in _findings(code))


def test_bettertransformer_conversions_are_reported_without_a_patch():
    code = textwrap.dedent('''\
        from optimum.bettertransformer import BetterTransformer
        from transformers import AutoModel
        model = AutoModel.from_pretrained("x")
        fast = BetterTransformer.transform(model)
        faster = model.to_bettertransformer()
    ''')
    findings = _findings(code)
    assert [(f.rule, f.line, f.kind) for f in findings] == [("ADV603", 4, "hf-attn-implementation"),
                                                          ("ADV603", 5, "hf-attn-implementation")]
    assert all(not f.fixable and f.patch is None for f in findings)


def _flags_inside(context) -> tuple[bool, bool, bool, bool]:
    with context:
        return (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled(),
                torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())


@pytest.mark.parametrize("flags", list(itertools.product((None, True, False), repeat=4))[::5])
def test_sdp_kernel_translation_enables_exactly_the_same_backends(flags):
    names = ("enable_flash", "enable_math", "enable_mem_efficient", "enable_cudnn")
    given = {name: value for name, value in zip(names, flags) if value is not None}
    call = "torch.backends.cuda.sdp_kernel(" + ", ".join(f"{k}={v}" for k, v in given.items()) + ")"
    source = f"import torch\nwith {call}:\n    pass\n"
    result = analyze_source(source, "ctx.py")
    (finding,) = result.findings
    assert finding.rule == "ADV701" and finding.fix_safety == "safe"
    new_call = result.fixed.splitlines()[2].removeprefix("with ").removesuffix(":")
    namespace: dict = {}
    exec(result.fixed.splitlines()[1], namespace)  # the added import
    with pytest.warns(FutureWarning):
        old = _flags_inside(torch.backends.cuda.sdp_kernel(**given))
    assert _flags_inside(eval(new_call, namespace)) == old


def test_sdp_kernel_with_run_time_flags_gets_no_fix():
    (finding,) = _findings("import torch.backends.cuda as cu\nctx = cu.sdp_kernel(enable_math=use_math)\n")
    assert finding.rule == "ADV701" and not finding.fixable and "enable_math" in finding.reason


def test_library_files_are_never_reported_or_patched(tmp_path, capsys):
    library = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "someserver"
    library.mkdir(parents=True)
    script = library / "serve.py"
    script.write_text(SERVING_SCRIPT, encoding="utf-8")
    assert main(["fix", "--apply", "--unsafe-fixes", str(script)]) == 0
    assert script.read_text(encoding="utf-8") == SERVING_SCRIPT
    import transformers.models.whisper.generation_whisper as whisper_generation

    installed = Path(whisper_generation.__file__)  # sets `_attn_implementation = "eager"` on a config
    copy = tmp_path / "user_copy.py"
    shutil.copyfile(installed, copy)
    capsys.readouterr()
    main(["scan", "--format", "json", "--select", "ADV6,ADV7", str(installed), str(copy)])
    found = json.loads(capsys.readouterr().out)["findings"]
    assert found and {f["path"] for f in found} == {str(copy)}  # the same text is reported only outside the library
