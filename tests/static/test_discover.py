"""Which folders a scan walks: tool and environment folders are skipped, but a source package that happens to be
named like one (`env/`, `build/`, RL code's environment package) is walked, since a caller there decides what the
tree's call sites prove (a seventh breaker's bug_12: a caller in `env/` reading the weights was never read, and the
patch that dropped them was safe)."""

from __future__ import annotations

import pytest

from advisor.engine.static import scan_paths
from advisor.static.discover import discover


@pytest.mark.parametrize("name", ["env", "build", "dist", "venv"])
def test_a_package_named_like_a_tool_folder_is_walked(tmp_path, name):
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "step.py").write_text("x = 1\n")
    files, _ = discover([str(tmp_path)])
    assert str(tmp_path / name / "step.py") in files


@pytest.mark.parametrize("name", ["env", "venv", "build", "dist"])
def test_a_script_folder_named_like_a_tool_folder_is_walked(tmp_path, name):
    """Python 3 needs no `__init__.py`: scripts in `env/` are callers too (an eighth breaker's bug_07)."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "run.py").write_text("x = 1\n")
    assert str(tmp_path / name / "run.py") in discover([str(tmp_path)])[0]


@pytest.mark.parametrize("layout", [{"lib/pkg/mod.py": "x = 1\n"},  # a build's output
                                    {"pyvenv.cfg": "home = /usr/bin\n", "mod.py": "x = 1\n"},  # a virtualenv
                                    {"conda-meta/history": "", "mod.py": "x = 1\n"}])  # a conda environment
@pytest.mark.parametrize("name", ["env", "build", ".venv", "node_modules", "__pycache__"])
def test_tool_folders_and_environments_are_skipped(tmp_path, name, layout):
    folder = tmp_path / name
    for file, text in layout.items():
        (folder / file).parent.mkdir(parents=True, exist_ok=True)
        (folder / file).write_text(text)
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "deep.py").write_text("x = 1\n")
    files, _ = discover([str(tmp_path)])
    assert not any(name in path for path in files), files


ATTEND = '''
import torch


def attend(q, k, v):
    w = (q @ k.transpose(-2, -1) * 0.125).softmax(-1)
    return w @ v, w
'''


def test_a_caller_in_an_env_package_decides_what_is_proved(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "attention.py").write_text(ATTEND)
    (tmp_path / "model.py").write_text("from .attention import attend\n\n\ndef run(q, k, v):\n"
                                       "    out, _ = attend(q, k, v)\n    return out\n")
    [alone] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert alone.fix_safety == "safe", alone.reason  # the only caller drops the weights
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "__init__.py").write_text("")
    (tmp_path / "env" / "observe.py").write_text("from ..attention import attend\n\n\ndef observe(q):\n"
                                                 "    return attend(q, q, q)[1].mean(dim=1)\n")
    [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1).findings if f.kind == "attention"]
    assert finding.fix_safety != "safe", finding.extra["facts"]


MASKED_ATTEND = ("import torch\n\n\ndef attend(q, k, v, mask):\n    s = q @ k.transpose(-2, -1) * 0.5\n    s = s + mask\n"
          "    return torch.softmax(s, dim=-1) @ v\n")
CALLER = "import torch\nfrom attn import attend\n\n\ndef run(q, k, v):\n    return attend(q, k, v, {mask})\n"


@pytest.mark.parametrize("script", ["bin/train", "tools/train.pyw"])
def test_a_python_script_without_py_counts_for_call_site_facts(tmp_path, script):
    """Breaker round 17: `bin/train` (a `#!/usr/bin/env python3` entry script) passed a mask swallowing a whole
    row, and a proof from `model.py`'s call site alone made the patch safe (gradients 1.19 apart)."""
    (tmp_path / "attn.py").write_text(MASKED_ATTEND)
    (tmp_path / "model.py").write_text(CALLER.format(mask="torch.zeros(q.shape[0], 1, 1, k.shape[-2])"))

    def safety() -> str:
        [finding] = [f for f in scan_paths([str(tmp_path)], jobs=1, cache=False).findings if f.path.endswith("attn.py")]
        return finding.fix_safety

    assert safety() == "safe"
    (tmp_path / script).parent.mkdir()
    (tmp_path / script).write_text("#!/usr/bin/env python3\n" + CALLER.format(mask="torch.full((1,), -1e9)"))
    assert str(tmp_path / script) in discover([str(tmp_path)])[0]
    assert safety() == "unsafe"


@pytest.mark.parametrize("shebang", ["#!/usr/bin/env -S uv run --script", "#!/usr/bin/pypy3"])
def test_a_script_run_by_uv_or_pypy_is_walked(tmp_path, shebang):
    """Breaker round 18: a uv script's requests (a gradient penalty) went unseen."""
    (tmp_path / "train").write_text(shebang + "\nimport torch\n")
    assert discover([str(tmp_path)])[0] == [str(tmp_path / "train")]


def test_a_file_without_a_suffix_that_is_not_python_is_not_walked(tmp_path):
    (tmp_path / "LICENSE").write_text("MIT\n")
    (tmp_path / "run").write_text("#!/bin/sh\necho hi\n")
    assert discover([str(tmp_path)])[0] == []


def test_a_file_of_a_virtual_environment_is_in_one_whatever_its_folder(tmp_path):
    """Promise breaker round 30: `optimize --apply` wrote into `.venv/src/mypkg/attn.py`, pip's editable checkout of a
    dependency, which no `site-packages` part names."""
    from advisor.static.discover import in_environment

    (tmp_path / ".venv" / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "pkg").mkdir()
    assert in_environment(str(tmp_path / ".venv" / "src" / "mypkg" / "attn.py"))
    assert not in_environment(str(tmp_path / "pkg" / "attn.py"))
