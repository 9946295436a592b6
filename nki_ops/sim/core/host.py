"""A kernel's boundary with the host, for both front ends: binding the call's arguments, host arrays and
torch CPU tensors as HBM tensors (bfloat16 by bit pattern) and results back, and errors re-raised at the
kernel's line."""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import numpy as np

from . import dtypes as dt
from .errors import SIM_DIR, KernelUsageError, SimulatorError, UnsupportedError
from .tensors import Access, Tensor

# A launch's fixed costs, made once: what is left of them is the kernel's own work.
_signature = functools.lru_cache(maxsize=256)(inspect.signature)


def bind(func, args, kwargs) -> inspect.BoundArguments:
    """The kernel's parameters bound to the call's arguments, or the error the kernel call is."""
    try:
        return _signature(func).bind(*args, **kwargs)
    except TypeError as error:
        raise KernelUsageError(f"cannot call kernel {func.__qualname__}: {error}") from None


def reraise(error: BaseException):
    """Raise ``error`` from a kernel run: a ValueError/TypeError/IndexError/ArithmeticError that a simulator
    function raised (NumPy refusing an operand, say) becomes a ``SimulatorError`` at the kernel's line."""
    if isinstance(error, SimulatorError) or not isinstance(error, (ValueError, TypeError, IndexError,
                                                                   ArithmeticError)):
        raise error
    if not raised_inside_simulator(error):
        raise error
    raise SimulatorError(f"{type(error).__name__}: {error}", user_traceback_site(error)) from error


class HostIO:
    """Host arguments (NumPy arrays, torch CPU tensors) as HBM tensors, and results back.

    ``tensor(array, name)`` makes a front end's HBM tensor over a host array of one of its ``dtypes``
    (default: the core's). A host argument the kernel
    cannot use in place (a non-contiguous or read-only array, a non-contiguous torch tensor) is copied, and
    the copy goes back into it after the run if the kernel changed it. ``taken``: host memory earlier ranks
    of the launch use as their HBM (a rank whose argument overlaps it gets a copy of its own);
    ``check_output(tensor)`` refuses a returned tensor a front end's rules exclude."""

    def __init__(self, tensor: Callable[[np.ndarray, str], Tensor], taken: list[np.ndarray] | None = None,
                 check_output: Callable[[Tensor], None] | None = None, dtypes: tuple = dt.SUPPORTED):
        self.tensor, self.check_output, self.dtypes = tensor, check_output, dtypes
        # (host argument, its copy the kernel sees, the copy's bytes before the run, name)
        self.copy_back: list[tuple[object, np.ndarray, np.ndarray, str]] = []
        self.saw_torch = False
        self.taken = [] if taken is None else taken
        self.mine: list[np.ndarray] = []  # the host memory this rank uses

    def to_kernel(self, value, name: str):
        if isinstance(value, np.ndarray):
            array = value
            if self._private(value):
                array = value.copy()
            elif not (value.flags.c_contiguous and value.flags.writeable):
                array = np.ascontiguousarray(value)
                self.copy_back.append((value, array, array.copy(), name))
            return self._tensor(array, name)
        if is_torch(value):
            self.saw_torch = True
            array, shares_memory = torch_to_numpy(value, name)
            if self._private(array):
                array = array.copy()
            elif not shares_memory:
                self.copy_back.append((value, array, array.copy(), name))
            return self._tensor(array, name)
        if isinstance(value, (list, tuple)) and any(isinstance(v, np.ndarray) or is_torch(v) for v in value):
            return type(value)(self.to_kernel(v, f"{name}[{i}]") for i, v in enumerate(value))
        return value

    def bind(self, func, args, kwargs) -> inspect.BoundArguments:
        """``bind`` with every argument converted by :meth:`to_kernel`."""
        bound = bind(func, args, kwargs)
        for name, value in bound.arguments.items():
            bound.arguments[name] = self.to_kernel(value, name)
        return bound

    def _private(self, array: np.ndarray) -> bool:
        """Whether memory of an earlier rank overlaps ``array`` (then this rank needs a copy); else
        record it as this rank's."""
        if any(np.may_share_memory(array, other) for other in self.taken):
            return True
        self.mine.append(array)
        return False

    def _tensor(self, array: np.ndarray, name: str) -> Tensor:
        try:
            dt.as_dtype(array.dtype, self.dtypes)
        except TypeError:
            raise KernelUsageError(f"Unsupported dtype {array.dtype} of kernel argument '{name}'") from None
        return self.tensor(array, name)

    def write_back(self) -> None:
        """Arguments the kernel wrote go back into the host tensors it got copies of; the others stay
        untouched (a torch tensor's version counter too)."""
        for original, array, before, name in self.copy_back:
            if np.array_equal(array.reshape(-1).view(np.uint8), before.reshape(-1).view(np.uint8)):
                continue
            if isinstance(original, np.ndarray):
                if original.flags.writeable:
                    np.copyto(original, array)
            elif any(s == 0 and n > 1 for s, n in zip(original.stride(), original.shape)):
                raise KernelUsageError(f"kernel wrote argument '{name}', an expanded torch tensor whose elements "
                                       f"share memory (stride 0); pass a tensor with memory of its own as output")
            else:
                original.detach().copy_(numpy_to_torch(array))

    def to_host(self, value):
        if isinstance(value, Tensor):
            if value.buffer.on_chip:
                raise KernelUsageError(f"kernel returned on-chip tensor '{value.name}' ({value.buffer!r}); kernel "
                                       f"outputs must be HBM tensors (nl.ndarray(..., buffer=nl.shared_hbm))",
                                       value.site)
            if self.check_output is not None:
                self.check_output(value)
            return numpy_to_torch(np.ascontiguousarray(value.data)) if self.saw_torch else value.data
        if isinstance(value, Access):
            raise KernelUsageError("kernel returned an indexed access; return the HBM tensor itself")
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_host(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_host(v) for k, v in value.items()}
        return value


def is_torch(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def torch_to_numpy(tensor, name: str) -> tuple[np.ndarray, bool]:
    """The tensor's data as NumPy, and whether it is the tensor's own memory (writes show through)."""
    import torch
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        raise KernelUsageError(f"kernel argument '{name}' is on {tensor.device}; the simulator takes CPU tensors")
    shares_memory = tensor.is_contiguous()
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(dt.bfloat16), shares_memory
    return tensor.numpy(), shares_memory


def numpy_to_torch(array: np.ndarray):
    import torch
    if array.dtype == dt.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    if array.dtype.kind == "V" or array.dtype in (dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn):
        raise UnsupportedError(f"returning {array.dtype} outputs as torch tensors", "pass NumPy arrays instead")
    return torch.from_numpy(array)


def user_traceback_site(error: BaseException) -> str:
    """``file:line`` of the innermost kernel (non-simulator) frame in the error's traceback."""
    site, tb = "<unknown>:0", error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(SIM_DIR):
            site = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def raised_inside_simulator(error: BaseException) -> bool:
    """True when a simulator function (not the launcher itself, not the kernel's own code) raised it."""
    tb = error.__traceback__.tb_next  # skip the launcher
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(SIM_DIR):
            return True
        tb = tb.tb_next
    return False
