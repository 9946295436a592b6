"""Example kernels in the legacy NKI API, used by the simulator's tests and benchmark."""

from __future__ import annotations

from .frontends.legacy import jit
from .frontends.legacy import language as nl


@jit
def giou_kernel(boxes1, boxes2, out):
    """GIoU of paired xyxy boxes, written into ``out`` by reference.

    boxes1, boxes2: HBM ``[rows, 4 * n]`` float32 (box ``j`` of a row at columns ``4j..4j+3``),
    rows a multiple of 128; out: HBM ``[rows, n]``. One 128-row tile per loop iteration; the four
    coordinates are gathered with strided ``nl.arange`` indices (``4 * i_f + c``).
    """
    rows, n = out.shape
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(n)[None, :]
    eps = 1e-7
    for t in nl.affine_range(rows // 128):
        p = nl.load(boxes1[t * 128:(t + 1) * 128, :])
        g = nl.load(boxes2[t * 128:(t + 1) * 128, :])
        p_x1, p_y1, p_x2, p_y2 = (p[i_p, 4 * i_f + c] for c in range(4))
        g_x1, g_y1, g_x2, g_y2 = (g[i_p, 4 * i_f + c] for c in range(4))
        inter = nl.maximum(nl.minimum(p_x2, g_x2) - nl.maximum(p_x1, g_x1), 0.0) * \
            nl.maximum(nl.minimum(p_y2, g_y2) - nl.maximum(p_y1, g_y1), 0.0)
        union = (p_x2 - p_x1) * (p_y2 - p_y1) + (g_x2 - g_x1) * (g_y2 - g_y1) - inter
        hull = (nl.maximum(p_x2, g_x2) - nl.minimum(p_x1, g_x1)) * (nl.maximum(p_y2, g_y2) - nl.minimum(p_y1, g_y1))
        giou = inter / nl.maximum(union, eps) - (hull - union) / nl.maximum(hull, eps)
        nl.store(out[t * 128:(t + 1) * 128, :], giou)
