"""The tree-wide indexes that replace per-question searches answer as the searches did (static.call_sites.Tree,
static.project.ProjectFacts), and note the same files as read."""

import re

from advisor.static.call_sites import Tree
from advisor.static.project import AttributeWrites, ProjectFacts


def _tree(tmp_path, files: dict[str, str]) -> Tree:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return Tree([str(tmp_path / name) for name in files])


def test_mentioning_and_accesses_agree_with_searching_each_text(tmp_path):
    files = {"a.py": "x = m.attn . scale\nattn2 = 1\n", "b.py": "def attn(q):\n    return q.\n    attn_x\n",
             "c.py": "y = 1.5e3 + obj. attn\n"}
    tree = _tree(tmp_path, files)
    for word in ("attn", "attn2", "attn_x", "scale", "5e3", "q", "missing"):
        expected = [str(tmp_path / n) for n, text in files.items() if re.search(rf"\b{word}\b", text)]
        read = tree.recording()
        assert tree.mentioning(word) == expected
        assert read == {str((tmp_path / n).resolve()) for n in files}  # every file was asked
        for name, text in files.items():
            assert tree.accesses(str(tmp_path / name), word) == \
                (re.search(rf"\.\s*{re.escape(word)}\b", text) is not None), (name, word)


def test_names_written_elsewhere_is_the_join_of_the_other_files_writes():
    writes = (AttributeWrites("a.py", frozenset({"bias", "scale"}), frozenset({"bias"})),
              AttributeWrites("b.py", frozenset({"bias"}), frozenset()),
              AttributeWrites("a.py", frozenset({"mask"}), frozenset({"mask"})),
              AttributeWrites("c.py", frozenset({"scale", "drop"}), frozenset({"drop", "bias"})))
    facts = ProjectFacts(attribute_writes=writes)
    for here in ("a.py", "b.py", "c.py", "d.py"):
        others = facts.writes_elsewhere(here)
        assert facts.names_written_elsewhere(here) == (frozenset().union(*(w.names for w in others)),
                                                      frozenset().union(*(w.reshaped for w in others)))


def test_the_tree_wide_facts_computed_in_a_pool_are_those_computed_in_process(tmp_path):
    """A tree of PARALLEL_FROM files or more reads its files' parts in worker processes: the same facts, hooks,
    writes, classes and autograd requests, in the order of the files, with a cache learning the same digests."""
    from advisor.static.scan_cache import ScanCache
    from advisor.static.tree_facts import PARALLEL_FROM, tree_wide_facts

    kinds = ["import torch\n\n\ndef f(m):\n    m.drop.register_forward_hook(print)\n",
             "import torch.nn as nn\n\n\nclass Sub{i}(Base):\n    def norm(self, s):\n        return s\n",
             "import torch\n\n\ndef f(m, t):\n    m.bias.fill_(1)\n    return torch.autograd.grad(t, m, create_graph=True)\n",
             "def broken(:\n"]
    paths = []
    for i in range(PARALLEL_FROM + 4):
        (tmp_path / f"f{i}.py").write_text(kinds[i % len(kinds)].format(i=i))
        paths.append(str(tmp_path / f"f{i}.py"))
    in_process = tree_wide_facts(paths, jobs=1)
    in_pool = tree_wide_facts(paths, jobs=2)
    assert in_pool == in_process and len(in_process[0].classes) == len(paths) // len(kinds)
    caches = [ScanCache({}) for _ in range(2)]
    for cache, jobs in zip(caches, (1, 2)):
        assert tree_wide_facts(paths, cache=cache, jobs=jobs) == in_process
    assert caches[0].digests == caches[1].digests and len(caches[0].digests) == len(paths)
