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
