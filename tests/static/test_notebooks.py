"""Jupyter notebooks: findings per cell with cell-relative lines, IPython magics never break the parse, and fixes
written back into the notebook's JSON without touching other cells, outputs or metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from advisor.cli import main
from advisor.static.notebook import notebook_code
from fixture_models import golden_path

ROOT = Path(__file__).resolve().parents[2]
NANOGPT = ROOT / "fixtures" / "attention" / "positive" / "01_nanogpt_causal.py"
GOLDEN = golden_path(NANOGPT)


def cell(kind: str, text: str) -> dict:
    lines = text.splitlines(keepends=True)
    extra = {"execution_count": None, "outputs": []} if kind == "code" else {}
    return {"cell_type": kind, "metadata": {}, "source": lines, **extra}


def write_notebook(path: Path, cells: list[dict]) -> Path:
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1))
    return path


def python_findings(capsys, path) -> list[dict]:
    main(["scan", str(path), "--format", "json"])
    return json.loads(capsys.readouterr().out)["findings"]


def test_findings_carry_their_cell_and_the_line_in_it_past_magics(capsys, workdir):
    attention = NANOGPT.read_text()
    [expected] = python_findings(capsys, NANOGPT)
    notebook = write_notebook(workdir / "model.ipynb", [
        cell("markdown", "# A model\nwith text\n"),
        cell("code", "%matplotlib inline\n!pip install einops\nimport torch\n"),
        cell("code", "%%bash\necho this is not python (\n"),
        cell("code", "for _ in range(2):\n    %timeit torch.ones(3)\n"),  # a magic alone in a block
        cell("code", attention),
    ])
    before = notebook.read_bytes()
    code = main(["scan", "model.ipynb", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["errors"] == [] and data["files_scanned"] == 1
    [finding] = data["findings"]
    assert finding["cell"] == 5 and finding["path"] == "model.ipynb"
    assert (finding["line"], finding["end_line"]) == (expected["line"], expected["end_line"])
    header = "--- a/model.ipynb:cell 5\t\n+++ b/model.ipynb:cell 5\t"  # a tab after a name with a space, as git
    assert finding["fixable"] and finding["patch"].startswith(header)
    assert main(["fix", "model.ipynb", "--apply"]) == 0
    after = json.loads(notebook.read_text())
    original = json.loads(before)
    fixed_source = "".join(after["cells"][4]["source"])
    assert "scaled_dot_product_attention" in fixed_source
    assert after["cells"][:4] == original["cells"][:4] and after["metadata"] == original["metadata"]
    assert fixed_source == GOLDEN.read_text()  # exactly what `fix` writes into the .py file
    # byte-identical outside the rewritten cell's source: the same text once that source is put back
    after["cells"][4]["source"] = original["cells"][4]["source"]
    assert json.dumps(after, indent=1) == before.decode()
    compile(fixed_source, "cell", "exec")
    assert main(["fix", "model.ipynb", "--apply"]) == 0 and json.loads(notebook.read_text()) == json.loads(
        json.dumps(json.loads(notebook.read_text())))  # idempotent: nothing left to fix
    capsys.readouterr()


def test_fixes_keep_magics_outputs_and_a_layout_they_cannot_reproduce_is_refused(capsys, workdir):
    attention = "%load_ext autoreload\n" + NANOGPT.read_text()
    code_cell = cell("code", attention)
    code_cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]
    code_cell["metadata"] = {"tags": ["keep"]}
    notebook = workdir / "nb.ipynb"
    document = {"cells": [code_cell], "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4,
                "nbformat_minor": 5}
    notebook.write_text(json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n")  # nbformat's
    assert main(["fix", "nb.ipynb", "--apply"]) == 0
    after = json.loads(notebook.read_text())
    source = "".join(after["cells"][0]["source"])
    assert source.startswith("%load_ext autoreload\n") and "scaled_dot_product_attention" in source
    assert after["cells"][0]["outputs"] == code_cell["outputs"] and after["cells"][0]["metadata"] == {"tags": ["keep"]}
    assert notebook.read_text().endswith("}\n")
    odd = workdir / "odd.ipynb"
    odd.write_text(json.dumps(document, indent=1).replace('"nbformat": 4', '"nbformat":  4'))  # by hand: no
    # json.dumps setting writes this back
    before = odd.read_bytes()
    assert main(["fix", "odd.ipynb", "--apply"]) == 2
    assert "not laid out as json.dumps writes it" in capsys.readouterr().err and odd.read_bytes() == before


@pytest.mark.parametrize("settings", [{"indent": 0}, {"indent": 3}, {"separators": (",", ":")},
                                      {"indent": 2, "separators": (",", ":")}], ids=["0", "3", "compact", "2 compact"])
def test_a_notebook_laid_out_by_any_json_dumps_indent_or_separators_is_written_back_in_it(capsys, workdir,
                                                                                          settings):
    """The layout is read from the file (its first inner line's indent, the default or compact separators), not
    picked from a list (promise round 34: indent 0 and 3 and compact notebooks were refused)."""
    document = {"cells": [cell("code", NANOGPT.read_text())], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook = workdir / "nb.ipynb"
    notebook.write_text(json.dumps(document, **settings))
    assert main(["fix", "nb.ipynb", "--apply"]) == 0
    after = json.loads(notebook.read_text())
    assert "scaled_dot_product_attention" in "".join(after["cells"][0]["source"])
    assert notebook.read_text() == json.dumps(after, **settings)


def test_a_notebook_whose_json_has_crlf_newlines_is_written_back_in_them(capsys, workdir):
    """git's autocrlf checkout on Windows turns the JSON's own newlines into CRLF; that was refused as a layout
    json.dumps cannot write, though it is json.dumps' text with each newline replaced."""
    other = cell("markdown", "# notes\n")
    document = {"cells": [other, cell("code", NANOGPT.read_text())], "metadata": {}, "nbformat": 4,
                "nbformat_minor": 5}
    notebook = workdir / "win.ipynb"
    notebook.write_text(json.dumps(document, indent=1) + "\n", newline="\r\n")
    assert main(["fix", "win.ipynb", "--apply"]) == 0, capsys.readouterr().err
    document["cells"][1] = cell("code", GOLDEN.read_text())
    assert notebook.read_bytes() == (json.dumps(document, indent=1) + "\n").replace("\n", "\r\n").encode()
    capsys.readouterr()


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_a_rewritten_cell_keeps_its_own_newlines(capsys, workdir, newline):
    """A cell written on Windows (CRLF) or old Mac (CR) keeps those newlines where advisor rewrites it."""
    text = NANOGPT.read_text().replace("\n", newline)
    lines = [line for line in text.split(newline)[:-1]]
    document = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                           "source": [line + newline for line in lines]}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook = workdir / "crlf.ipynb"
    notebook.write_text(json.dumps(document, indent=1), newline="")
    assert main(["fix", "crlf.ipynb", "--apply"]) == 0
    source = json.loads(notebook.read_bytes())["cells"][0]["source"]
    assert all(line.endswith(newline) and "\n" not in line.removesuffix(newline) for line in source)
    assert "".join(source) == GOLDEN.read_text().replace("\n", newline)
    capsys.readouterr()


def test_the_walk_reads_notebooks_but_not_their_checkpoints(capsys, workdir):
    write_notebook(workdir / "a.ipynb", [cell("code", NANOGPT.read_text())])
    (workdir / ".ipynb_checkpoints").mkdir()
    write_notebook(workdir / ".ipynb_checkpoints" / "a-checkpoint.ipynb", [cell("code", NANOGPT.read_text())])
    main(["scan", ".", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["files_scanned"] == 1 and [f["path"] for f in data["findings"]] == ["a.ipynb"]


def test_a_syntax_error_names_its_cell_and_line(capsys, workdir):
    write_notebook(workdir / "bad.ipynb", [cell("code", "x = 1\n"), cell("markdown", "text"),
                                           cell("code", "y = 2\ndef f(:\n")])
    code = main(["scan", "bad.ipynb", "--format", "json"])
    [error] = json.loads(capsys.readouterr().out)["errors"]
    assert code == 2 and "syntax error in cell 3 at line 2" in error["message"]


@pytest.mark.parametrize("raw, says", [
    ("{", "invalid JSON"), ('{"cells": 3}', "no list of cells"), ('[]', "no list of cells"),
    ('{"cells": [{"cell_type": "code", "source": 5}]}', "cell 1 has a source that is not text"),
    ('{"nbformat": 3, "worksheets": [{"cells": []}]}', "nbformat 3 (`jupyter nbconvert"),
    ('{"cells": [], "metadata": {"deep": ' + "[" * 5000 + "]" * 5000 + "}}", "nests too deep"),
])
def test_a_broken_notebook_is_one_error_entry(capsys, workdir, raw, says):
    """...and the scan goes on: a valid JSON nested past the decoder's recursion once ended the whole run, the tree's
    facts included, with nothing printed (a hostile user, round 22)."""
    (workdir / "x.ipynb").write_text(raw)
    (workdir / "attn.py").write_text("import torch\n\n\ndef f(q, k, v):\n"
                                     "    return (q @ k.transpose(-2, -1)).softmax(-1) @ v\n")
    main(["scan", ".", "--format", "json"])
    document = json.loads(capsys.readouterr().out)
    [error] = document["errors"]
    assert error["message"].startswith("not a Jupyter notebook") and says in error["message"]
    assert [finding["rule"] for finding in document["findings"]] == ["ADV101"]


@pytest.mark.parametrize("line, asks", [
    ("%time g, = torch.autograd.grad(m(x).sum(), x, create_graph=True)", True),
    ("%timeit -n 1 g, = torch.autograd.grad(m(x).sum(), x, create_graph=True)", False),  # options: not read
    ("%time g, = torch.autograd.grad(m(x).sum(), x)", False),
])
def test_a_time_magic_line_runs_its_statement_for_the_tree_s_facts(capsys, workdir, line, asks):
    """Breaker round 18: a gradient penalty (or a module hook) on a `%time` line was masked out of the tree's facts:
    `first-order-autograd` was proved and the patched model raised in the notebook's double backward."""
    shutil.copy(NANOGPT, workdir / "model.py")
    write_notebook(workdir / "train.ipynb", [cell("code", "import torch\nfrom model import make\nm, (x,) = make()\n"),
                                             cell("code", f"# timed\n{line}\n")])
    main(["scan", ".", "--format", "json"])
    [finding] = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["path"].endswith("model.py")]
    assumed = {fact["name"] for fact in finding["facts"]["assumed"]}
    assert ("first-order-autograd" in assumed) == asks, assumed
    assert (finding["fix_safety"] == "unsafe") == asks


def test_a_cell_holding_a_lone_surrogate_is_a_bad_file_not_an_internal_error(capsys, workdir):
    """Breaker round 18: JSON's `\\ud800` escape is valid JSON and no source text: it was an internal error."""
    (workdir / "x.ipynb").write_text('{"cells": [{"cell_type": "code", "source": "x = \'\\ud800\'\\n"}]}')
    code = main(["scan", "x.ipynb", "--format", "json"])
    [error] = json.loads(capsys.readouterr().out)["errors"]
    assert code == 2 and "lone surrogate" in error["message"] and not error.get("internal")


def test_masking_keeps_every_line_and_maps_back():
    raw = json.dumps({"cells": [cell("code", "a = 1\n!ls\n"), cell("markdown", "m"),
                                cell("code", "%%bash\nb = (\n"), cell("code", "%%time -o t\nc = 2\n%pwd\n")]})
    code = notebook_code(raw)
    assert code.text.splitlines() == ["a = 1", "_advisor_ipython(ls)  # (IPython magic)",
                                      "# advisor: notebook cell boundary",
                                      "# (IPython cell magic)", "# (IPython cell magic)",
                                      "# advisor: notebook cell boundary",  # `%%time` runs its body as Python
                                      "_advisor_ipython(time, o, t)  # (IPython magic)", "c = 2",
                                      "_advisor_ipython(pwd)  # (IPython magic)"]
    assert code.locate(1) == (1, 1) and code.locate(2) == (1, 2) and code.locate(5) == (3, 2)
    assert code.locate(8) == (4, 2)
    assert json.loads(code.with_code(code.text)) == json.loads(raw)  # nothing changed: the same cells
    changed = json.loads(code.with_code(code.text.replace("c = 2", "c = 3")))
    assert changed["cells"][3]["source"] == ["%%time -o t\n", "c = 3\n", "%pwd\n"]


def test_a_fix_that_moves_a_boundary_or_a_masked_line_is_never_written_back():
    raw = json.dumps({"cells": [cell("code", "a = 1\n!ls\n"), cell("code", "b = 2\n")]}, indent=1)
    code = notebook_code(raw)
    with pytest.raises(ValueError, match="boundary"):
        code.with_code(code.text.replace("# advisor: notebook cell boundary\n", ""))
    with pytest.raises(ValueError, match="masked IPython line"):
        code.with_code(code.text.replace("_advisor_ipython(ls)  # (IPython magic)\n", ""))
    changed = json.loads(code.with_code(code.text.replace("b = 2", "b = 3")))
    assert changed["cells"][1]["source"] == ["b = 3\n"] and changed["cells"][0]["source"] == ["a = 1\n", "!ls\n"]


def test_ipython_syntax_is_masked_only_where_a_statement_starts():
    """IPython's assigned magics and help requests are masked; a `%` or `!` that continues a bracket, or starts a
    line of a string, is Python and kept; a form feed or U+2028 in a string splits no line."""
    source = ("files = !ls\nt, u = %timeit -o f()\nlen?\n??len\ny = (a\n     % b)\nz = x \\\n  != 2\n"
              "s = '''\n!not a shell line\n'''\nw = 'a\fb\u2028c'\n")
    code = notebook_code(json.dumps({"cells": [cell("code", source)]}))
    masked = [f"_advisor_ipython({names})  # (IPython magic)" for names in ("files, ls", "t, u, timeit, o, f", "len",
                                                                              "len")]
    assert code.text.split("\n")[:-1] == masked + source.split("\n")[4:-1]
    compile(code.text, "nb", "exec")
    changed = json.loads(code.with_code(code.text.replace("y = (a", "y = (c")))
    assert "".join(changed["cells"][0]["source"]) == source.replace("y = (a", "y = (c")


def test_the_text_table_places_a_notebook_finding_in_its_cell(capsys, workdir, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    write_notebook(workdir / "nb.ipynb", [cell("markdown", "# m\n"), cell("code", NANOGPT.read_text())])
    [expected] = python_findings(capsys, NANOGPT)
    main(["scan", "nb.ipynb"])
    assert f"nb.ipynb:cell 2:{expected['line']}" in capsys.readouterr().out


@pytest.mark.parametrize("magic", ["%time print(s.shape)", "!echo {s.shape}", "%time s = s * 0"])
def test_a_magic_line_that_names_an_intermediate_keeps_it(capsys, workdir, magic):
    """IPython runs a magic's Python (`%time print(s.shape)`, `!echo {s.shape}`): masked as a call reading every
    name it spells, so the scores it reads are used outside the block and no fix deletes them (a round-4 promise
    breaker's notebook: the fix deleted `s` and the cell raised NameError)."""
    source = f"import torch\ndef attend(q, k, v):\n    s = q @ k.transpose(-2, -1) / 8.0\n    {magic}\n" \
             "    return s.softmax(dim=-1) @ v\n"
    write_notebook(workdir / "nb.ipynb", [cell("code", source)])
    main(["scan", "nb.ipynb", "--format", "json"])
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert finding["rule"] == "ADV103" and "`s` is also used" in finding["reason"], finding


PLAIN_ATTENTION = ("from math import sqrt\nfrom torch import softmax\n\n\ndef attend(q, k, v):\n"
                   "    att = (q @ k.transpose(-2, -1)) / sqrt(q.shape[-1])\n    return softmax(att, dim=-1) @ v\n")


@pytest.mark.parametrize("first", ["%%capture\n%pip install torch\n", "%%bash\necho hi\n"])
def test_an_added_import_never_goes_above_a_cell_magic(capsys, workdir, first):
    """Breaker round 16: the fix's `import torch.nn.functional as F` went to the top of cell 1, above its
    `%%capture`, which IPython then ran as a line magic (UsageError). Masked IPython lines count as the module's
    opening imports, so the import joins the imports after them; a fix that still put code above a cell magic is
    refused, not written."""
    notebook = write_notebook(workdir / "nb.ipynb", [cell("code", first), cell("code", PLAIN_ATTENTION)])
    assert main(["fix", "nb.ipynb", "--apply"]) == 0
    capsys.readouterr()
    cells = ["".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]]
    assert cells[0] == first and "import torch.nn.functional" in cells[1]
    assert "scaled_dot_product_attention" in cells[1]
    code = notebook_code(json.dumps({"cells": [cell("code", first), cell("code", "x = 1\n")]}))
    with pytest.raises(ValueError, match="must stay its cell's first line"):
        code.with_code("import os\n" + code.text)


def test_an_added_import_is_bound_before_a_module_level_call_above_a_late_import(workdir):
    """Breaker round 16: the import went after the module's last import; a script calling the fixed function
    above a late `import` (a `# noqa: E402`) raised NameError."""
    import subprocess
    import sys

    script = workdir / "late.py"
    script.write_text(PLAIN_ATTENTION + "\n\nimport torch\nq = torch.randn(1, 2, 4, 8)\nprint(attend(q, q, q).shape)\n"
                      "import json  # noqa: E402\n")
    assert main(["fix", "late.py", "--apply"]) == 0
    ran = subprocess.run([sys.executable, "late.py"], cwd=workdir, capture_output=True, text=True)
    assert "scaled_dot_product_attention" in script.read_text() and ran.returncode == 0, ran.stderr


def test_a_fixed_cell_of_mixed_newlines_keeps_each_line_s_own(workdir, capsys):
    """Breaker round 16: every newline of a fixed cell became the cell's first (CRLF and LF mixed by a paste), so
    lines the fix never touched changed; a `.py` file of the same lines kept them."""
    source = ["import torch\r\n", "\n", "\r\n", "def f(x):\n", "    a = 1\r\n", "    y = x.contiguous().contiguous()\n",
              "    return y, a\r\n"]
    notebook = workdir / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": [{**cell("code", ""), "source": source}], "metadata": {}, "nbformat": 4,
                                    "nbformat_minor": 5}, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    assert main(["fix", "nb.ipynb", "--apply"]) == 0
    capsys.readouterr()
    after = json.loads(notebook.read_text())["cells"][0]["source"]
    assert after == [*source[:5], "    y = x.contiguous()\n", source[6]]


@pytest.mark.parametrize("magic_cell", [
    "  %matplotlib inline\nimport torch\n",  # indented at the top: IPython runs it
    "!pip install einops \\\n    rich\nimport torch\n",  # a shell line continued by a backslash
    "files = !ls \\\n    -la\nimport torch\n",
    "\n%%bash\necho this is not python (\n",  # a blank line above a cell magic: IPython skips it
    "\n%%time\nimport torch\n",
])
def test_magics_ipython_runs_never_break_the_parse_and_fixes_keep_them(capsys, workdir, magic_cell):
    """Promise breaker round 30: each of these made the whole notebook one syntax-error entry (or its fix an
    internal error), and the attention cell after it went unreported."""
    notebook = write_notebook(workdir / "model.ipynb", [cell("code", magic_cell), cell("code", NANOGPT.read_text())])
    code = main(["scan", "model.ipynb", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["errors"] == [] and [f["cell"] for f in data["findings"]] == [2]
    assert main(["fix", "model.ipynb", "--apply"]) == 0
    after = json.loads(notebook.read_text())
    assert "".join(after["cells"][0]["source"]) == magic_cell
    assert "scaled_dot_product_attention" in "".join(after["cells"][1]["source"])


def test_kept_lines_the_fix_reindents_keep_their_own_newlines(workdir, capsys):
    """Promise breaker round 30: a guarded patch moves the original lines under an `else:`; in a cell whose first
    line ends in CRLF and the others in LF, those re-indented lines took the first line's CRLF."""
    source = ["def attend(q, k, v):\r\n", "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n",
              "    weights = torch.softmax(scores, dim=-1)\n", "    return weights @ v\n"]
    notebook = write_notebook(workdir / "nb.ipynb", [cell("code", "import math\nimport torch\n"),
                                                    {**cell("code", ""), "source": source}])
    assert main(["fix", "nb.ipynb", "--apply"]) == 0
    capsys.readouterr()
    after = json.loads(notebook.read_text())["cells"][1]["source"]
    kept = [line for line in after if line.lstrip().startswith(("scores =", "weights =", "return weights"))]
    assert len(kept) == 3 and all(line.endswith("\n") and not line.endswith("\r\n") for line in kept)
    assert after[0] == source[0] and "scaled_dot_product_attention" in "".join(after)
