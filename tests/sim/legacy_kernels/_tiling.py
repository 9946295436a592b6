"""The legacy kernels' tiling: full tiles in a loop, then one narrower tail tile."""

from __future__ import annotations

from nki_ops.sim import nl

PARTITIONS = nl.tile_size.pmax  # 128 partitions: the most rows one tile holds


def for_each_tile(extent, tile, body, loop=nl.affine_range):
    """Call ``body(start, size)`` for every tile of ``tile`` elements along an axis of ``extent``.

    The ``extent // tile`` full tiles run in ``loop`` (``nl.affine_range``, or
    ``nl.sequential_range`` when the tiles carry a running total); the remainder, if any, follows
    as one tile of ``extent % tile``.
    """
    full_tiles, tail = divmod(extent, tile)
    for t in loop(full_tiles):
        body(t * tile, tile)
    if tail:
        body(full_tiles * tile, tail)
