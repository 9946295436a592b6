"""What the CPU emulation catches: partitioning bugs, TCM overflow and overruns, out-of-bounds access,
accessors multicore ops may not use, and build errors; and that any user's sources load through custom_op."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from nki_ops.cpp import BuildError, CustomOpError, custom_op, operators, options
from nki_ops.workloads import giou_workload

pytestmark = pytest.mark.cpp


def test_published_giou_kernel_offsets_are_caught(published_giou):
    boxes1, boxes2 = giou_workload(16, 256)
    with pytest.raises(CustomOpError) as caught:
        torch.ops.my_ops.giou(boxes1, boxes2)
    message = str(caught.value)
    # Core k starts at element 2k (partition * cpu_id, not scaled by the row length), inside core 0's row 0.
    assert "my_ops::giou (8 cores): output elements [2, 4) were written by cores 0 and 1" in message
    assert "my_ops::giou (8 cores): output elements [6, 8) were written by cores 0, 1, 2 and 3" in message
    assert re.search(r"my_ops::giou \(8 cores\): \d+ of 4096 output elements were written by no core: "
                     r"\[\d+, \d+\)", message)
    # tcm_output is never freed.
    assert "my_ops::giou (core 3 of 8): returned with 1 TCM block(s) (4096 bytes) still allocated" in message


def test_published_giou_kernel_with_other_core_counts(published_giou):
    boxes1, boxes2 = giou_workload(16, 256)
    # On one core the offsets happen to be right: only the leak remains.
    with options(core_count=1), pytest.raises(CustomOpError) as caught:
        torch.ops.my_ops.giou(boxes1, boxes2)
    assert str(caught.value) == ("my_ops::giou (core 0 of 1): returned with 1 TCM block(s) (4096 bytes) still "
                                 "allocated: tcm_free every tcm_malloc")
    # On three, 16 // 3 rows per core leave the last rows to nobody, and the cores overlap.
    with options(core_count=3), pytest.raises(CustomOpError) as caught:
        torch.ops.my_ops.giou(boxes1, boxes2)
    expected = "my_ops::giou (3 cores): 2806 of 4096 output elements were written by no core: [1290, 4096)"
    assert expected in str(caught.value)
    assert "my_ops::giou (3 cores): output elements [10, 1280) were written by cores 0, 1 and 2" in str(caught.value)


def test_unchecked_fast_mode_lets_the_published_bug_through(published_giou):
    boxes1, boxes2 = giou_workload(16, 256)
    with options(checks=False):
        out = torch.ops.my_ops.giou(boxes1, boxes2)
    assert out.shape == (16, 256)  # wrong values, and nothing says so: what checks are for


@pytest.mark.parametrize("pool_bytes,blocks", [(16 * 1024, 16), (4096, 4)])
def test_tcm_pool_holds_16_kib_per_core(faults, pool_bytes, blocks):
    with options(core_count=3, tcm_pool_bytes=pool_bytes):
        out = torch.ops.emulation_faults.tcm_capacity(torch.zeros(5))
    assert out.tolist() == [blocks] * 5


def test_tcm_overflow_is_reported(faults):
    message = (r"emulation_faults::tcm_overflow \(core 0 of 8\): tensor_to_tcm of 1 elements \(4 bytes\) touches a "
               r"null pointer \(tcm_malloc returns nullptr")
    with pytest.raises(CustomOpError, match=message):
        torch.ops.emulation_faults.tcm_overflow(torch.zeros(8))


def test_read_past_the_end_names_core_and_range(faults):
    with options(core_count=3), pytest.raises(CustomOpError) as caught:
        torch.ops.emulation_faults.read_past_end(torch.zeros(10))
    assert ("emulation_faults::read_past_end (core 2 of 3): tensor_to_tcm accesses elements [7, 11) of "
            "input 0, which has 10 elements") in str(caught.value)


def test_write_past_a_tcm_block_is_reported(faults):
    overrun = "TCM block overrun: a write past the end of a 64-byte TCM block"
    with options(core_count=1), pytest.raises(CustomOpError, match=overrun):
        torch.ops.emulation_faults.tcm_block_overrun(torch.zeros(4))


def test_standard_accessor_is_refused_in_multicore_mode(faults):
    with pytest.raises(CustomOpError, match="a standard accessor .* in multicore mode"):
        torch.ops.emulation_faults.standard_accessor(torch.zeros(8))


def test_two_cores_writing_one_element_is_reported(faults):
    with options(core_count=2), pytest.raises(CustomOpError, match=r"output elements \[0, 64\) were written by "
                                                                   r"cores 0 and 1"):
        torch.ops.emulation_faults.every_core_writes_all(torch.zeros(64))


def test_device_dtypes_only(faults):
    refusal = "input 0 has dtype torch.float64; GpSimd custom ops support float32, bfloat16"
    with pytest.raises(CustomOpError, match=refusal):
        torch.ops.emulation_faults.tcm_capacity(torch.zeros(4, dtype=torch.float64))


def test_shape_function_rejects_wrong_shapes(built_operators):
    with pytest.raises(Exception, match=r"giou expects boxes1 and boxes2 of the same shape \[B, N, 4\]"):
        operators.load("giou").giou(torch.zeros(2, 4), torch.zeros(2, 4))


def write_sources(folder, compute: str, shape: str):
    (folder / "kernel.cpp").write_text(textwrap.dedent(compute))
    (folder / "shape.cpp").write_text(textwrap.dedent(shape))
    return [str(folder / "kernel.cpp")], [str(folder / "shape.cpp")]


def test_code_outside_the_device_subset_fails_to_build_with_file_and_line(tmp_path):
    compute, shape = write_sources(tmp_path, """\
        #include <torch/torch.h>

        torch::Tensor square(const torch::Tensor& x) {
          return torch::matmul(x, x);  // not in the GpSimd tensor library
        }
        """, "")
    with pytest.raises(BuildError) as caught:
        custom_op.load("bad_kernel", compute, shape, build_directory=str(tmp_path))
    message = str(caught.value)
    assert f"{tmp_path / 'kernel.cpp'}:4:" in message and "matmul" in message
    assert "failing command:" in message and "-std=c++14" in message and "-fstack-usage" in message


@pytest.mark.parametrize("statement", [
    "x.data_ptr<float>();",               # no raw data pointer on the device
    "x.sum();",                           # reductions are not in the device library
    "torch::zeros({2}, torch::kDouble);",  # no float64 dtype
    "torch::zeros({2}, torch::kLong);",    # int64 was removed from the device dtypes
    "x.to(torch::kHalf);",                # no conversions
    "torch::Tensor y = x; y.impl();",     # the emulation's internals are not device API
    "auto a = x.accessor<float, 1>(); a[0] = 1;",  # inputs are const: a read-only accessor
])
def test_apis_the_device_lacks_do_not_compile(tmp_path, statement):
    compute, shape = write_sources(tmp_path, f"""\
        #include <torch/torch.h>

        torch::Tensor misuse(const torch::Tensor& x) {{
          {statement}
          return torch::zeros({{1}}, torch::kFloat);
        }}
        """, "")
    with pytest.raises(BuildError, match=rf"{tmp_path / 'kernel.cpp'}:4:\d+: error"):
        custom_op.load("misuse", compute, shape, build_directory=str(tmp_path))


def test_stack_frames_beyond_the_device_stack_are_refused(tmp_path):
    compute, shape = write_sources(tmp_path, """\
        #include <torch/torch.h>

        torch::Tensor scratch_on_stack(const torch::Tensor& x) {
          volatile float scratch[4096];  // 16 KiB: twice the device's default stack
          scratch[0] = 0;
          return torch::zeros({1}, torch::kFloat);
        }
        """, "")
    with pytest.raises(BuildError, match=rf"{tmp_path / 'kernel.cpp'}:3: torch::Tensor scratch_on_stack\(const "
                                         r"torch::Tensor&\) uses a \d+-byte stack frame\nThe GpSimd stack holds about "
                                         r"8192 bytes"):
        custom_op.load("big_stack", compute, shape, build_directory=str(tmp_path))
    with pytest.raises(BuildError, match="the GpSimd stack can be at most 409600 bytes"):
        custom_op.load("big_stack", compute, shape, build_directory=str(tmp_path), extra_cflags=["-DSTACK_SIZE=500000"])


USER_KERNEL = """\
    // ReLU over all GpSimd cores, in TCM chunks (the tutorial's kernel with a correct partition).
    #include <torch/torch.h>
    #include <neuron/neuron-utils.hpp>
    #include <algorithm>

    torch::Tensor relu_forward(const torch::Tensor& t_in) {
      torch::Tensor t_out = get_dst_tensor();
      const int64_t n = t_in.numel(), cores = get_cpu_count(), id = get_cpu_id();
      const int64_t begin = id * (n / cores) + std::min<int64_t>(id, n % cores);
      const int64_t end = begin + n / cores + (id < n % cores ? 1 : 0);
      const int64_t chunk = 1024;
      float* buffer = (float*)torch::neuron::tcm_malloc(sizeof(float) * chunk);
      auto in = t_in.tcm_accessor();
      auto out = t_out.tcm_accessor();
      for (int64_t i = begin; i < end; i += chunk) {
        const int64_t count = std::min(chunk, end - i);
        in.tensor_to_tcm<float>(buffer, i, count);
        for (int64_t j = 0; j < count; ++j) buffer[j] = buffer[j] > 0 ? buffer[j] : 0;
        out.tcm_to_tensor<float>(buffer, i, count);
      }
      torch::neuron::tcm_free(buffer);
      return t_out;
    }
    """

USER_SHAPE = """\
    #include <torch/torch.h>
    #include "torchneuron/register.h"

    torch::Tensor relu_fwd_shape(torch::Tensor t_in) {
      return torch::zeros(t_in.sizes(), torch::kFloat);
    }

    NEURON_LIBRARY(user_ops, m) {
      m.def("relu_forward", &relu_fwd_shape, "relu_forward");
    }
    """


def test_user_operator_builds_loads_and_reloads_from_its_archive(tmp_path):
    compute, shape = write_sources(tmp_path, USER_KERNEL, USER_SHAPE)
    custom_op.load(name="relu", compute_srcs=compute, shape_srcs=shape, build_directory=str(tmp_path), multicore=True)
    x = torch.randn(3, 1000)
    for cores in (1, 3, 7, 8):
        with options(core_count=cores):
            torch.testing.assert_close(torch.ops.user_ops.relu_forward(x), torch.relu(x), rtol=0, atol=0)
    # Another process loads the packed library, as a model script does with custom_op.load_library.
    archive = tmp_path / "librelu.so"
    script = ("import torch; from nki_ops.cpp import custom_op; "
              f"custom_op.load_library({str(archive)!r}); "
              "print(torch.ops.user_ops.relu_forward(torch.tensor([-1.0, 2.0, -3.0])).tolist())")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[0.0, 2.0, 0.0]"
