"""Current-API kernel arguments: what the kernel writes reaches the caller's tensors, nothing else does."""

import pytest
import torch

from nki_ops.sim import KernelUsageError
from nki_ops.sim.frontends import current as nki
from nki_ops.sim.frontends.current import isa as nisa
from nki_ops.sim.frontends.current import language as nl


@nki.jit
def double_into(x, out):
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out, src=tile)


def test_a_written_non_contiguous_argument_gets_the_result_and_a_read_one_stays_untouched():
    x = torch.arange(48, dtype=torch.float32).reshape(6, 8).t()  # non-contiguous input, only read
    out = torch.zeros(6, 8).t()  # non-contiguous output, written
    x_version, out_version = x._version, out._version
    double_into(x, out)
    torch.testing.assert_close(out, 2 * x)
    assert x._version == x_version
    assert out._version > out_version


def test_an_expanded_argument_is_read_but_cannot_be_written():
    row = torch.arange(8, dtype=torch.float32)
    x = row.expand(4, 8)
    out = torch.zeros(4, 8)
    double_into(x, out)
    torch.testing.assert_close(out, 2 * x)
    with pytest.raises(KernelUsageError, match="kernel wrote argument 'out', an expanded torch tensor"):
        double_into(x, torch.zeros(8).expand(4, 8))
