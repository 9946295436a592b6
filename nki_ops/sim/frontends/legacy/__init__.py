"""``neuronxcc.nki`` for the simulator: ``jit``, ``trace``, ``baremetal``, ``simulate_kernel``.

Every entry point runs the kernel eagerly on the CPU. Inputs are NumPy arrays (torch CPU
tensors are accepted and outputs come back as torch tensors); they become HBM tensors.
A kernel may return HBM tensors it created (``nl.ndarray(..., buffer=nl.shared_hbm)``) or
write outputs passed in by reference with ``nl.store``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools

import numpy as np

from ... import core
from ...core.config import current_config
from ...core.errors import SIM_DIR, KernelUsageError, SimulatorError, UnsupportedError
from . import isa, language, typing

__all__ = ["jit", "trace", "baremetal", "simulate_kernel", "benchmark", "profile", "language", "isa", "typing"]

_TARGET_ALIASES = {"trn1": "trn1", "inf2": "inf2", "trn2": "trn2", "trn1n": "trn1"}


class Kernel:
    """A kernel function prepared for the simulator; ``kernel[g0, g1](...)`` launches an SPMD grid."""

    def __init__(self, func, *, mode: str = "auto", grid: tuple[int, ...] = (), target: str | None = None):
        if isinstance(func, Kernel):
            func = func.func
        self.func, self.mode, self.grid, self.target = func, mode, grid, target
        functools.update_wrapper(self, func)

    def __getitem__(self, grid) -> "Kernel":
        grid = grid if isinstance(grid, tuple) else (grid,)
        for size in grid:
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
                raise UnsupportedError("SPMD grid dimensions other than positive ints (nl.nc / nl.spmd_dim)",
                                       f"got {size!r}")
        return Kernel(self.func, mode=self.mode, grid=tuple(int(s) for s in grid), target=self.target)

    def __call__(self, *args, **kwargs):
        if self.mode == "benchmark":
            raise UnsupportedError("nki.benchmark", "the simulator has no device timings")
        return launch(self.func, self.grid, args, kwargs, target=self.target)

    def __repr__(self) -> str:
        grid = f"[{', '.join(map(str, self.grid))}]" if self.grid else ""
        return f"<simulated NKI kernel {self.func.__qualname__}{grid}>"


def _decorator(mode: str):
    def make(func=None, *, platform_target: str | None = None, **_compiler_options):
        target = None
        if platform_target is not None:
            if platform_target not in _TARGET_ALIASES:
                raise UnsupportedError(f"platform_target={platform_target!r}",
                                       f"simulated targets: {sorted(_TARGET_ALIASES)}")
            target = _TARGET_ALIASES[platform_target]
        if func is None:
            return lambda f: Kernel(f, mode=mode, target=target)
        return Kernel(func, mode=mode, target=target)
    return make


def jit(func=None, mode: str = "auto", **options):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: every mode runs in the simulator."""
    return _decorator(mode)(func, **options)


trace = _decorator("trace")
baremetal = _decorator("baremetal")


def benchmark(*_args, **_kwargs):
    raise UnsupportedError("nki.benchmark", "the simulator has no device timings")


def profile(*_args, **_kwargs):
    raise UnsupportedError("nki.profile", "the simulator has no device profiles")


def simulate_kernel(kernel, *args, **kwargs):
    """Run ``kernel`` (a jit/trace/baremetal kernel, possibly with a grid, or a plain function)."""
    if isinstance(kernel, Kernel):
        return launch(kernel.func, kernel.grid, args, kwargs, target=kernel.target)
    if callable(kernel):
        return launch(kernel, (), args, kwargs)
    raise KernelUsageError(f"simulate_kernel needs a kernel function, got {type(kernel).__name__}")


# ------------------------------------------------------------------------------------- launch

class _HostIO:
    """Converts host arguments (NumPy arrays, torch CPU tensors) to HBM tensors and back."""

    def __init__(self):
        self.copy_back: list[tuple[object, np.ndarray]] = []
        self.saw_torch = False

    def to_kernel(self, value, name: str):
        if isinstance(value, np.ndarray):
            return core.Tensor(value, core.shared_hbm, name, "<kernel argument>")
        if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
            self.saw_torch = True
            array, shares_memory = _torch_to_numpy(value, name)
            if not shares_memory:
                self.copy_back.append((value, array))
            return core.Tensor(array, core.shared_hbm, name, "<kernel argument>")
        if isinstance(value, (list, tuple)) and any(isinstance(v, np.ndarray) for v in value):
            return type(value)(self.to_kernel(v, f"{name}[{i}]") for i, v in enumerate(value))
        return value

    def write_back(self) -> None:
        """By-reference outputs written into a copy of a non-contiguous torch tensor go back into it."""
        for tensor, array in self.copy_back:
            tensor.detach().copy_(_numpy_to_torch(array))

    def to_host(self, value):
        if isinstance(value, core.Tensor):
            if value.buffer.on_chip:
                raise KernelUsageError(f"kernel returned on-chip tensor '{value.name}' ({value.buffer!r}); kernel "
                                       f"outputs must be HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm))",
                                       value.site)
            return _numpy_to_torch(value.data) if self.saw_torch else value.data
        if isinstance(value, core.Access):
            raise KernelUsageError("kernel returned an indexed access; return the HBM tensor itself")
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_host(v) for v in value)
        return value


def _torch_to_numpy(tensor, name: str) -> tuple[np.ndarray, bool]:
    """The tensor's data as NumPy, and whether it is the tensor's own memory (writes show through)."""
    import torch
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        raise KernelUsageError(f"kernel argument '{name}' is on {tensor.device}; the simulator takes CPU tensors")
    shares_memory = tensor.is_contiguous()
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(language.bfloat16), shares_memory
    return tensor.numpy(), shares_memory


def _numpy_to_torch(array: np.ndarray):
    import torch
    if array.dtype == language.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.dtype in (language.float8_e4m3, language.float8_e5m2):
        raise UnsupportedError(f"returning {array.dtype} outputs as torch tensors", "pass NumPy arrays instead")
    return torch.from_numpy(array)


def _user_traceback_site(error: BaseException) -> str:
    site, tb = "<unknown>:0", error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(SIM_DIR):
            site = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _raised_inside_simulator(error: BaseException) -> bool:
    """True when a simulator function (not launch itself, not the kernel's own code) raised it."""
    tb = error.__traceback__.tb_next  # skip launch()
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(SIM_DIR):
            return True
        tb = tb.tb_next
    return False


def launch(func, grid: tuple[int, ...], args, kwargs, *, target: str | None = None):
    """Run ``func`` once per grid point (serially, as the device does) and return its outputs."""
    if core.get_run() is not None:
        if grid:
            raise KernelUsageError(f"kernel {func.__qualname__} with an SPMD grid cannot be called from inside "
                                   f"another kernel")
        return func(*args, **kwargs)
    config = current_config()
    if target is not None and target != config.target:
        config = dataclasses.replace(config, target=target)
    io = _HostIO()
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except TypeError as error:
        raise KernelUsageError(f"cannot call kernel {func.__qualname__}: {error}") from None
    for name, value in bound.arguments.items():
        bound.arguments[name] = io.to_kernel(value, name)
    run = core.Run(config, grid)
    points = list(itertools.product(*(range(g) for g in grid)))
    if run.shuffle is not None:
        run.shuffle.shuffle(points)
    previous = core.set_run(run)
    try:
        for point in points:
            run.program_id = point
            run.site_counts.clear()
            result = func(*bound.args, **bound.kwargs)
    except SimulatorError:
        raise
    except (ValueError, TypeError, IndexError, ArithmeticError) as error:
        if not _raised_inside_simulator(error):
            raise
        raise SimulatorError(f"{type(error).__name__}: {error}", _user_traceback_site(error)) from error
    finally:
        core.set_run(previous)
    io.write_back()
    return io.to_host(result)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.{name}")
