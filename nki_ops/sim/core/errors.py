"""The simulator's errors. Every message starts with the kernel source file and line of the call."""

from __future__ import annotations

import os
import sys

__all__ = [
    "SimulatorError", "NkiValidationError", "OutOfBoundsError", "MemorySpaceError", "TileLimitError", "CapacityError",
    "UnsupportedError", "KernelUsageError", "RaceError", "SimulatorWarning", "user_site",
]

# Frames from files under the simulator package are the simulator's own, not the kernel's.
SIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_site() -> str:
    """``file:line`` of the innermost call from outside the simulator (the kernel's own code)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(SIM_DIR):
        frame = frame.f_back
    if frame is None:
        return "<unknown>:0"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class SimulatorError(Exception):
    """A kernel did something the NeuronCore or the NKI compiler would reject."""

    def __init__(self, message: str, site: str | None = None):
        self.site = site or user_site()
        self.detail = message
        super().__init__(f"{self.site}: {message}")


class NkiValidationError(SimulatorError):
    """A hardware or compiler constraint is violated (``nki.isa.NkiValidationError`` of the current API);
    every simulator error but ``UnsupportedError`` is one."""


class OutOfBoundsError(NkiValidationError, IndexError):
    """An index range reaches outside a tensor's dimension."""


class MemorySpaceError(NkiValidationError):
    """An operand lives in a buffer (HBM, SBUF, PSUM) the instruction cannot access."""


class TileLimitError(NkiValidationError):
    """A tile exceeds an architectural size limit (partitions, PSUM bank, matmul sizes)."""


class CapacityError(NkiValidationError):
    """Live on-chip allocations exceed the SBUF or PSUM capacity per partition."""


class UnsupportedError(SimulatorError, AttributeError):
    """The NKI API exists but this simulator does not implement it."""

    def __init__(self, name: str, reason: str = "", site: str | None = None):
        super().__init__(f"not supported by the simulator: {name}" + (f" ({reason})" if reason else ""), site)


class KernelUsageError(NkiValidationError, TypeError):
    """A call that the NKI front end rejects: wrong argument kinds, shapes, ranks or control flow."""


class Abandoned(KernelUsageError):
    """A program stopped waiting because another program of the launch failed: an echo of that failure."""


class RaceError(NkiValidationError):
    """Program instances touch the same HBM bytes, one writing, in no order (``SimConfig(races="error")``)."""


class SimulatorWarning(UserWarning):
    """A hardware-limit violation reported instead of raised (``SimConfig(strict=False)``)."""


def refuse_unknown(module: str):
    """A module ``__getattr__``: a name the module lacks is an API the simulator does not implement."""
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnsupportedError(f"{module}.{name}")
    return __getattr__
