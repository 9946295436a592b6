"""What every kernel of this project shares: the tile ranges (full tiles, then one narrower tail
tile) and the kernel-side input checks.

Walking an axis with ``tile_range`` makes any extent work without masks: the tail tile is one more
iteration of the same loop body with a smaller size. Kernel helpers are inlined by the NKI
compiler, so both functions here stay plain: integers and tuples in, a tuple or an assertion out.
"""

from __future__ import annotations

from ..nki_api import nl

PARTITIONS = nl.tile_size.pmax  # 128 partitions: the most rows one tile holds


def tile_range(extent, tile):
    """``(start, size)`` of every tile of ``tile`` elements along an axis of ``extent`` elements.

    The ``extent // tile`` full tiles come first, then, if ``extent % tile`` is not zero, one tile
    of that many elements: ``tile_range(300, 128) == ((0, 128), (128, 128), (256, 44))``.
    """
    tiles = []
    for start in range(0, extent, tile):
        tiles.append((start, min(tile, extent - start)))
    return tuple(tiles)


def kernel_check(condition, message):
    """Refuse the kernel's inputs with ``message`` (what was expected, what came) unless ``condition``.

    An assertion because that is what the NKI compiler evaluates while it specialises a kernel.
    """
    assert condition, message


def is_float_dtype(dtype):
    """True for the floating-point dtypes the kernels take (float32, bfloat16, float16)."""
    return dtype == nl.float32 or dtype == nl.bfloat16 or dtype == nl.float16
