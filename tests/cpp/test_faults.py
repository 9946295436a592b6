"""Checked mode runs kernels in a worker process: a kernel that faults raises CustomOpError naming the op,
the core, the signal and the source line, and this Python process carries on."""

from __future__ import annotations

import re

import pytest
import torch

from nki_ops.cpp import CustomOpError, options

from .conftest import FIXTURES

pytestmark = pytest.mark.cpp
FAULTS_SOURCE = FIXTURES / "faults" / "faults.cpp"


def line_of(text: str) -> int:
    """The line of faults.cpp that holds ``text``."""
    lines = FAULTS_SOURCE.read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize("op,core,report,lines", [
    ("null_dereference", "core 2 of 8",
     r"SIGSEGV \(Segmentation fault\): a write at address 0x0, a null pointer dereference",
     ("*nowhere = 1.0f;",) * 2),
    # Where a runaway recursion runs out of stack depends on the compiler: somewhere in recurse().
    ("runaway_recursion", "core 0 of 8",
     r"stack overflow, a runaway or too deep recursion \(SIGSEGV \(Segmentation fault\) at address 0x[0-9a-f]+\)",
     ("int64_t recurse(int64_t depth", "return recurse(depth + 1, stop)")),
    ("tcm_overrun_192", "core 1 of 8",
     (r"TCM block overrun: a write past the end of a 64-byte TCM block, at byte 64 of it \(SIGSEGV \(Segmentation "
      r"fault\) in the guard page after the block\)"),
     ("block[i] = static_cast<unsigned char>(i * 7 + 1);",) * 2),
])
def test_a_faulting_kernel_is_reported_and_python_carries_on(faults, op, core, report, lines):
    with pytest.raises(CustomOpError) as caught:
        getattr(torch.ops.emulation_faults, op)(torch.zeros(64))
    first, location = str(caught.value).split("\n")
    assert re.fullmatch(rf"emulation_faults::{op} \({core}\): {report}", first), first
    reported = re.fullmatch(rf"  at {re.escape(str(FAULTS_SOURCE))}:(\d+) in .+", location)
    assert reported and line_of(lines[0]) <= int(reported.group(1)) <= line_of(lines[1]), (
        f"expected a line of {FAULTS_SOURCE} in [{line_of(lines[0])}, {line_of(lines[1])}], got: {location}")
    # The next call gets a new worker.
    assert torch.ops.emulation_faults.tcm_capacity(torch.zeros(5)).tolist() == [16.0] * 5


def test_a_fault_while_cores_run_on_several_threads_names_its_core(faults):
    # 2**17 elements: the cores are spread over the worker's threads; a pool that holds each core's share.
    with options(core_count=3, tcm_pool_bytes=1 << 18), pytest.raises(
            CustomOpError, match=r"^emulation_faults::null_dereference \(core 2 of 3\): SIGSEGV"):
        torch.ops.emulation_faults.null_dereference(torch.zeros(2**17))


def test_worker_output_reaches_python(single_core, capsys):
    # A 1 KiB pool cannot hold a stream buffer: the stream accessor warns on stderr and falls back.
    x = torch.randn(3, 5)
    with options(tcm_pool_bytes=1024):
        torch.testing.assert_close(torch.ops.single_core_ops.stream_double(x), 2 * x, rtol=0, atol=0)
    assert "[gpsimd single core] warning: TCM pool exhausted; a stream accessor on input 0" in capsys.readouterr().err


def test_a_worker_killed_between_calls_is_replaced(faults):
    from nki_ops.cpp._worker import _WORKERS

    torch.ops.emulation_faults.tcm_capacity(torch.zeros(5))
    worker = next(w for w in _WORKERS if w.library.name == "libfaultscustomop.so" and w._process is not None)
    worker._process.kill()
    worker._process.wait()
    assert torch.ops.emulation_faults.tcm_capacity(torch.zeros(5)).tolist() == [16.0] * 5
