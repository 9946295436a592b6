"""MX (microscaling) instructions of the current API: ``nisa.quantize_mx`` (Vector engine) and
``nisa.nc_matmul_mx`` (Tensor engine), NeuronCore-v4 (trn3) and later; their rules and semantics are
``core/isa_mx.py``'s."""

from __future__ import annotations

from ....core import isa_mx
from ....core.outputs import Dst
from .instruction import instruction


@instruction
def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize fp16/bf16 ``src [P, F]`` to MXFP8: ``dst [P, F // 4]`` packed x4, one E8M0 scale per
    group of 8 partitions x 4 elements in ``dst_scale`` (quadrant layout, see ``core/mx.py``)."""
    isa_mx.quantize_mx(Dst(dst, "nisa.quantize_mx"), src, dst_scale)


@instruction
def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """``dst[M, N] (+)= sum over partitions k and packed lanes j of dequantized stationary[k, M, j] *
    moving[k, N, j]`` into PSUM (fp32 products and sums, the Tensor engine's accumulation)."""
    isa_mx.nc_matmul_mx(Dst(dst, "nisa.nc_matmul_mx"), stationary, moving, stationary_scale, moving_scale,
                        tile_position, tile_size, accumulate)
