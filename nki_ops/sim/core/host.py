"""Host data at a kernel's boundary: torch CPU tensors to NumPy and back (bfloat16 by bit pattern)."""

from __future__ import annotations

import numpy as np

from . import dtypes as dt
from .errors import KernelUsageError, UnsupportedError


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
    from .errors import SIM_DIR
    site, tb = "<unknown>:0", error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(SIM_DIR):
            site = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def raised_inside_simulator(error: BaseException) -> bool:
    """True when a simulator function (not the launcher itself, not the kernel's own code) raised it."""
    from .errors import SIM_DIR
    tb = error.__traceback__.tb_next  # skip the launcher
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(SIM_DIR):
            return True
        tb = tb.tb_next
    return False
