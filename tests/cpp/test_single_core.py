"""The single-core device API under the emulation: streams, the standard accessor, the tensor library, and
their rules."""

from __future__ import annotations

import pytest
import torch

from nki_ops.cpp import CustomOpError

pytestmark = pytest.mark.cpp
ops = torch.ops.single_core_ops


def test_stream_accessors_and_returned_tensor(single_core):
    x = torch.randn(33, 100)  # 3300 floats: the 1024-element stream buffers refill and flush several times
    torch.testing.assert_close(ops.stream_double(x), 2 * x, rtol=0, atol=0)


def test_tensor_library_ops(single_core):
    x = torch.randn(4, 5)
    # Each op rounds its (double-precision) result to the tensor's float32.
    expected = (torch.exp(x.double()).float() * 2 - 1).clamp(-0.5, 3)
    torch.testing.assert_close(ops.tensor_library(x), expected, rtol=0, atol=0)


def test_standard_accessor_writes_the_output(single_core):
    x = torch.randn(3, 4)
    torch.testing.assert_close(ops.accessor_rows(x), x + torch.arange(3.0)[:, None], rtol=0, atol=0)


@pytest.mark.parametrize("op,message", [
    ("incoherent_streams", "write_stream_accessor on a tensor the kernel created while another accessor that is not "
                           "kept coherent with it is open"),
    ("stream_past_end", "read_stream_accessor read past the end of input 0 (6 elements)"),
    ("accessor_out_of_bounds", "accessor index 3 is out of bounds for a dimension of size 3 of input 0"),
    ("core_id_in_single_core_mode", "get_cpu_id() in single-core mode: the device does not specify its value"),
    ("broadcasting_add", "torch::add on tensors of different sizes: the device tensor library does not broadcast"),
    ("factory_without_dtype", "torch::zeros needs an explicit dtype"),
    ("wrong_result_shape", "returned a float32 tensor of 1 dims that does not match the shape function's output"),
])
def test_rule_violations_are_reported(single_core, op, message):
    with pytest.raises(CustomOpError) as caught:
        getattr(ops, op)(torch.zeros(2, 3))
    assert str(caught.value).startswith(f"single_core_ops::{op} (single core): ")
    assert message in str(caught.value)
