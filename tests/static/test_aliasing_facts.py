"""The torch facts the copy-removal proof rests on (advisor/fixes/aliasing.py), checked on the installed torch: a
result named fresh must be a new contiguous tensor whatever its input's strides, or removing a copy before it could
change a later `.view` or what a caller sees."""

import itertools

import pytest
import torch

from advisor.fixes.aliasing import FRESH_RESULTS

PRODUCTS = {"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear"}


def _strided_inputs():
    base = torch.randn(2, 3, 4, 5)
    for perm in itertools.permutations(range(4)):
        yield base.permute(*perm)
    yield base.contiguous(memory_format=torch.channels_last)
    yield base[:, :, ::2]


@pytest.mark.parametrize("name", sorted(FRESH_RESULTS - PRODUCTS))
def test_reductions_and_softmax_named_fresh_return_new_contiguous_tensors(name):
    for x in _strided_inputs():
        for dim in range(x.dim()):
            result = getattr(x, name)(dim) if name not in ("all", "any") else getattr(x > 0, name)(dim)
            result = result[0] if isinstance(result, tuple) else result
            assert result.is_contiguous(), (name, x.stride(), dim)
            assert result.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_products_named_fresh_return_new_contiguous_tensors():
    a, b = torch.randn(3, 4, 5).transpose(1, 2), torch.randn(3, 4, 6)
    for result in (a @ b, torch.matmul(a, b), torch.bmm(a, b), torch.baddbmm(torch.zeros(3, 5, 6), a, b),
                   torch.mm(a[0], b[0]), torch.addmm(torch.zeros(5, 6), a[0], b[0]),
                   torch.nn.functional.linear(a, torch.randn(7, 4)), torch.addbmm(torch.zeros(5, 6), a, b)):
        assert result.is_contiguous()


def test_max_and_min_are_fresh_only_as_reductions():
    """Breaker round 17: `torch.max(a, b)` is the elementwise maximum, which keeps a's strides: a `.view` of it
    raised once the copy before it was gone. As a reduction (`x.max(1)`) it is fresh, as the test above shows."""
    from advisor.fixes.aliasing import REDUCING_UNLESS_PAIRED

    x = torch.randn(2, 3, 4).transpose(1, 2)
    for name in REDUCING_UNLESS_PAIRED:
        assert not getattr(torch, name)(x, x * 0).is_contiguous()
        assert getattr(torch, name)(x, 1)[0].is_contiguous() and getattr(x, name)().is_contiguous()


WRITES = ["F.dropout(h, p, training, True)", "F.relu(h, inplace=True)", "F.threshold(h, 0.1, 0.0, True)",
          "torch.nn.functional.hardtanh(h, -1, 1, True)"]


@pytest.mark.parametrize("call", WRITES)
def test_an_inplace_argument_counts_as_a_write(call):
    """Breaker round 17: `F.dropout(h, p, self.training, inplace=True)` wrote the caller's input once the copy
    was gone (training only, so a profile in eval measured no write)."""
    from advisor.fixes.aliasing import writes_in_place
    from advisor.static.module_index import ParsedModule

    source = f"import torch\nimport torch.nn.functional as F\n\n\ndef f(x, p, training):\n    h = x.mT\n    {call}\n"
    parsed = ParsedModule(source, "m.py")
    [function] = [function for function, _, name in parsed.functions if name == "f"]
    assert writes_in_place(parsed, function) is not None
