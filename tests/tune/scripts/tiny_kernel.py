"""A small current-API kernel for the kernel-tuning tests: ``out = 2 * x`` over column chunks.

``chunk`` is the columns per instruction, ``rows`` the partitions per tile (above 128 the simulator refuses
it), ``drop_tail`` skips the last chunk (less work, so a faster estimate, but wrong values) and
``sleep`` stalls ``build`` (a candidate that outlives its timeout).
"""

from __future__ import annotations

import time

import numpy as np

from nki_ops.sim.frontends.current import isa as nisa
from nki_ops.sim.frontends.current import jit
from nki_ops.sim.frontends.current import language as nl


def _tiles(extent, tile):
    return [(start, min(tile, extent - start)) for start in range(0, extent, tile)]


@jit
def double_kernel(x, chunk, rows, drop_tail):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    chunks = _tiles(d, chunk)
    for r0, size in _tiles(n, rows):
        for c0, cols in (chunks[:-1] if drop_tail and len(chunks) > 1 else chunks):
            tile = nl.ndarray((size, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x[r0:r0 + size, c0:c0 + cols])
            doubled = nl.ndarray((size, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=doubled, data=tile, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out[r0:r0 + size, c0:c0 + cols], src=doubled)
    return out


def build(chunk=512, rows=128, drop_tail=False, sleep=0.0):
    time.sleep(sleep)
    x = np.ones((256, 1024), dtype=np.float32)
    return double_kernel, (x, chunk, rows, drop_tail)


def check(chunk=512, rows=128, drop_tail=False, sleep=0.0):
    x = np.arange(129 * 1100, dtype=np.float32).reshape(129, 1100)
    np.testing.assert_array_equal(double_kernel(x, chunk, rows, drop_tail), 2 * x)
