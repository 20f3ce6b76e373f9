"""Work a cold scan does once, counted (not timed): repeated work shows up as a count that grows with the input."""

from advisor.patterns.attention.matcher import find_attention
from advisor.patterns.ops import OpReader
from advisor.static.module_index import ParsedModule


def _doubling_chain(links: int) -> str:
    """A softmax whose operand is `s = s + s` repeated: each link reads `s` twice, so a def-use walk that does not
    remember what it saw goes down 2**links paths (the chain ends in no matrix product, so every path is walked)."""
    chain = "".join("    s = s + s\n" for _ in range(links))
    return f"import torch\n\n\ndef f(q, k, v):\n    s = q + k\n{chain}    w = torch.softmax(s, dim=-1)\n" \
           "    return w @ v\n"


def test_softmax_screen_walks_each_operand_once(monkeypatch):
    reads = []
    original = OpReader.read

    def counted(self, node):
        reads.append(node)
        return original(self, node)

    monkeypatch.setattr(OpReader, "read", counted)
    assert find_attention(ParsedModule(_doubling_chain(12), "chain.py")) == []
    assert len(reads) <= 3 * len({id(node) for node in reads}), len(reads)


CLASSES = '''import torch
from torch import nn


class Attention(nn.Module):
    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


class Mlp(nn.Module):
    def forward(self, x):
        return x * 2


def helper(x):
    return x + 1


__all__ = ["Attention", "Mlp"]
'''


def test_matcher_prefilter_reads_source_not_regenerated_code(monkeypatch):
    """Whether a class or function says softmax is read from the source's lines: no class or function's code is
    regenerated for it (once per class, it cost as much as regenerating the file)."""
    generated = []
    original = ParsedModule.code

    def counted(self, node):
        generated.append(type(node).__name__)
        return original(self, node)

    monkeypatch.setattr(ParsedModule, "code", counted)
    parsed = ParsedModule(CLASSES, "classes.py")
    assert [parsed.mentions(node, "softmax") for node in parsed.module.body[2:5]] == [True, False, False]
    assert not {"ClassDef", "FunctionDef"} & set(generated), generated


def test_an_analysed_file_is_parsed_by_cpython_once(monkeypatch, tmp_path):
    """The syntax check, the statements' first lines (positions) and the file's writes on other objects read one
    `ast` tree of the file: CPython parses each scanned file once for its analysis, however many of them read it,
    and once in the tree-wide pass before (which reads every file's writes and reads handed on for the others)."""
    import ast

    from advisor.engine.static import scan_paths

    parsed = []
    original = ast.parse

    def counted(source, *args, **kwargs):
        parsed.append(source)
        return original(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counted)
    files = [tmp_path / "one.py", tmp_path / "two.py"]
    for number, path in enumerate(files):
        path.write_text(CLASSES.replace("Mlp", f"Mlp{number}"))
    # as `scan` runs it: `fix` (fixed=True) reads each fixed text again until its fixes settle
    result = scan_paths([str(path) for path in files], jobs=1, cache=False, fixed=False)
    assert len(result.findings) == 2 and any(f.patch for f in result.findings)
    sources = [text for text in parsed if "class Attention" in str(text)]
    assert sorted(map(str, sources)) == sorted(path.read_text() for path in files for _ in range(2)), len(sources)
