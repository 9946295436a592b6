"""The tiling every kernel of this project shares: full tiles in a loop, then one narrower tail tile.

Walking an axis this way makes any extent work without masks; the tail tile is a separate,
smaller instance of the same tile code.
"""

from __future__ import annotations

from ..nki import nl

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
