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
