"""GpSimd C++ custom operators: build them, load them, and run them on CPU under the device's rules.

* ``custom_op.load`` / ``custom_op.load_library``: the ``torch_neuronx.xla_impl.custom_op`` API,
  delegating to it on a Neuron host and building the CPU emulation elsewhere.
* ``options(core_count=..., checks=..., tcm_pool_bytes=...)``: how emulated ops run.
* ``operators.load(name)``: this project's operators (``cpp_ops/``), as built by ``python build.py``.

What the emulation checks on every call (unless ``checks=False`` or ``NKI_OPS_CPP_CHECKS=0``,
the fast mode): each core's 16 KiB TCM pool (``tcm_malloc`` returns nullptr when it is
exhausted, leaks and writes past a block are errors), bounds of every accessor and TCM copy,
that TCM copies stay inside one live block of the running core, and in multicore mode that
every output element is written by exactly one core (the output starts poisoned and each
core's writes are recorded). Checked calls run in a worker process, and each TCM block sits
between guard pages: a kernel that crashes (a null pointer, a runaway recursion, an overrun of a
block) raises ``CustomOpError`` naming the op, the core, the signal and the source line; the fast
mode runs in this process, where such a crash ends it. ``docs/cpp-ops.md`` has the full list.
"""

from . import operators
from ._build import BuildError
from ._emulation import CustomOpError, options

__all__ = ["BuildError", "CustomOpError", "options", "operators"]
