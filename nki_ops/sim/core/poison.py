"""The tag of never-written on-chip memory: a NaN payload that reads of uninitialised memory carry into outputs."""

from __future__ import annotations

import math

import numpy as np

from . import dtypes as dt

# New on-chip memory's NaN carries a tag: the quiet bit and the next mantissa bit set. NaN from
# elsewhere lacks it: computed NaN (sign set, quiet bit only), the usual NaN of inputs (np.nan: quiet
# bit only). NumPy's arithmetic, min/max, sqrt, matmul and sums keep a NaN operand's payload, and so do
# bf16/fp16 -> fp32 and fp32 -> fp16 conversions; NumPy's exp/log/tanh/sin, max-reductions and
# ml_dtypes' fp32 -> bf16 cast return a NaN without it. So a tagged NaN in an output was computed from
# memory no instruction wrote; paths through those operations go unreported. fp8 has no room for it.
TAGS = {dt.float32: np.uint32(0x7FE00000), dt.bfloat16: np.uint16(0x7FE0), dt.float16: np.uint16(0x7F00)}


def on_chip_fill(fill, dtype: np.dtype):
    """The fill of new on-chip memory: the tagged NaN where ``fill`` is NaN and ``dtype`` has a tag."""
    tag = TAGS.get(dtype)
    if tag is None or not (isinstance(fill, float) and math.isnan(fill)):
        return fill
    return np.array(tag).view(dtype)


def holds_sentinel(values: np.ndarray) -> bool:
    """Whether ``values`` hold the tagged NaN of new on-chip memory (or values computed from it)."""
    tag = TAGS.get(values.dtype)
    if tag is None:
        return False
    return bool(np.any((values.view(tag.dtype) & tag) == tag))
