"""NKI kernels of rotary position embedding (RoPE, rotate-half convention): the forward and its gradient.

With ``x1, x2`` the two halves of a head's D features and ``c1, c2, s1, s2`` those of the position's
cos and sin rows, the forward is ``y = x * cos + rotate_half(x) * sin``:

    y1 = x1 * c1 - x2 * s1        y2 = x2 * c2 + x1 * s2

and, rotate_half's transpose being ``(g1, g2) -> (g2, -g1)``, the gradient ``dx = g * cos +
rotate_half^T(g * sin)`` is

    dx1 = g1 * c1 + g2 * s2       dx2 = g2 * c2 - g1 * s1.

Both are ``x * cos + swap_halves(x) * t`` for a signed sin row ``t``: ``(-s1, s2)`` forward and
``(s2, -s1)`` backward, built once per position tile. So one kernel body serves both directions.

Layout: sequence positions on the partition axis, heads x D on the free axis. Partition p of a
position tile holds ``run`` consecutive positions (``run = min(RUN_ELEMENTS // D, ceil(S / 128))``, at
least 1; ``position_tiles``: full tiles of 128 partitions, then narrower tails), so a head's block on a
partition is one contiguous HBM run of ``run * D`` elements and each DMA descriptor moves a few KiB.
A position tile's cos and signed sin rows are built once, in fp32 in PSUM, and shared by every head
of q and k (and every batch row when the tables are ``[1, S, D]``) through a stride-0 view over the
heads. ``x * cos`` is written to PSUM too, so each of the three Vector passes (``x * cos``, the swapped
halves times the signed sin, their sum) has one operand in PSUM and streams in N cycles rather than
the 2N of two SBUF operands (the ``tensor_tensor`` cost in the ISA pages). Heads go in blocks of
``FREE_CHUNK // (run * D)`` (at least one); each block's load is issued before the previous block is
computed, so the DMA queues read ahead of the Vector engine. With D above ``RUN_ELEMENTS`` the tables
and ``x * cos`` do not fit PSUM and stay in SBUF.
Written for the current ``nki`` API (NKI 0.6).
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range

# Positions per partition: up to RUN_ELEMENTS // D, a contiguous HBM run of RUN_ELEMENTS elements per
# partition and head (4 KiB in fp32, 2 KiB in bf16: the DMA guide's >= 2 KiB per descriptor). At most
# ceil(S / 128), so that short sequences still spread over all the partitions.
RUN_ELEMENTS = 1024
# Free elements per partition of one block of heads. Its fp32 x * cos (8 KiB) and the two fp32 tables
# (2 x 4 KiB) fill the 16 KiB of PSUM per partition.
FREE_CHUNK = 2048


def position_tiles(seq, run):
    """``(start, partitions, run)`` of every position tile: partition p of a tile holds the ``run``
    positions ``start + p * run ..``. Full tiles of 128 partitions first, then the tail as whole runs
    on fewer partitions, then what is left one position per partition:
    ``position_tiles(300, 2) == ((0, 128, 2), (256, 22, 2))``."""
    tiles = []
    block = PARTITIONS * run
    full = seq // block * block
    for start in range(0, full, block):
        tiles.append((start, PARTITIONS, run))
    tail = seq - full
    if tail // run:
        tiles.append((full, tail // run, run))
    if tail % run:
        tiles.append((seq - tail % run, tail % run, 1))
    return tuple(tiles)


def _check_inputs(q, k, cos, sin):
    kernel_check(len(q.shape) == 4 and len(k.shape) == 4,
                 f"q and k must be HBM [B, H, S, D], got shapes {q.shape} and {k.shape}")
    batch, _, seq, dim = q.shape
    kernel_check(k.shape[0] == batch and k.shape[2] == seq and k.shape[3] == dim,
                 f"k must be [{batch}, Hkv, {seq}, {dim}] (q is {q.shape}), got {k.shape}")
    kernel_check(dim >= 2 and dim % 2 == 0, f"the head size D must be a positive even number, got {dim}")
    kernel_check(len(cos.shape) == 3 and cos.shape[1] == seq and cos.shape[2] == dim
                 and (cos.shape[0] == 1 or cos.shape[0] == batch),
                 f"cos must be HBM [1, {seq}, {dim}] or [{batch}, {seq}, {dim}], got {cos.shape}")
    kernel_check(sin.shape == cos.shape, f"sin must have cos's shape {cos.shape}, got {sin.shape}")
    kernel_check(is_float_dtype(q.dtype) and is_float_dtype(k.dtype) and is_float_dtype(cos.dtype)
                 and is_float_dtype(sin.dtype),
                 f"q, k, cos and sin must be float32, bfloat16 or float16, got {q.dtype}, {k.dtype}, {cos.dtype} "
                 f"and {sin.dtype}")


def _on_chip(width):
    """Where a tile of ``width`` fp32 per partition multiplied with x goes: PSUM, so that the Vector
    engine reads one operand from each memory, up to RUN_ELEMENTS (what the PSUM budget above holds)."""
    return nl.psum if width <= RUN_ELEMENTS else nl.sbuf


def _tables(cos, sin, t, s0, parts, run, backward):
    """The tables of a position tile (table row ``t``) as fp32 ``[parts, run * D]`` tiles: cos, and the
    signed sin ``(-s1, s2)`` (forward) or ``(s2, -s1)`` (backward) of each position; in PSUM when they
    fit (``_on_chip``)."""
    dim = cos.shape[2]
    half = dim // 2
    width = run * dim
    buffer = _on_chip(width)
    cos_in = nl.ndarray((parts, width), dtype=cos.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=cos_in, src=cos[t, s0:s0 + parts * run, :].reshape((parts, width)))
    cos_tile = nl.ndarray((parts, width), dtype=nl.float32, buffer=buffer)
    nisa.tensor_copy(dst=cos_tile, src=cos_in)
    sin_in = nl.ndarray((parts, run, dim), dtype=sin.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sin_in, src=sin[t, s0:s0 + parts * run, :].reshape((parts, run, dim)))
    signed = nl.ndarray((parts, run, dim), dtype=nl.float32, buffer=buffer)
    # -s1 goes to the first half forward, the second backward; s2 to the other half.
    negated, kept = (slice(half, dim), slice(0, half)) if backward else (slice(0, half), slice(half, dim))
    nisa.tensor_scalar(dst=signed[:, :, negated], data=sin_in[:, :, 0:half], op0=nl.multiply, operand0=-1.0)
    nisa.tensor_copy(dst=signed[:, :, kept], src=sin_in[:, :, half:dim])
    return cos_tile, signed


def _block(x, b, h0, count, s0, parts, run):
    """Heads ``h0 .. h0 + count`` of batch row b at a position tile: HBM ``[count, parts * run, D]`` seen
    as ``[parts, count, run * D]``, runs of ``run * D`` contiguous elements."""
    return x[b, h0:h0 + count, s0:s0 + parts * run, :].reshape((count, parts, run * x.shape[3])).permute(1, 0, 2)


def _load(block):
    tile = nl.ndarray(block.shape, dtype=block.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=block)
    return tile


def _rotate(x, out, cos_tile, signed, run, dim):
    """``out = x * cos + swap_halves(x) * signed`` for a loaded block ``x`` ``[parts, heads, run * D]``."""
    parts, count, width = x.shape
    half = dim // 2
    direct = nl.ndarray((parts, count, width), dtype=nl.float32, buffer=_on_chip(width))
    # The tables seen once per head through a stride-0 dim: no copies.
    nisa.tensor_tensor(dst=direct, data1=x, data2=cos_tile.expand_dim(1).broadcast(1, count), op=nl.multiply)
    x4 = x.reshape((parts, count, run, dim))
    signed4 = signed.expand_dim(1).broadcast(1, count)
    swapped = nl.ndarray((parts, count, run, dim), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=swapped[:, :, :, 0:half], data1=x4[:, :, :, half:dim], data2=signed4[:, :, :, 0:half],
                       op=nl.multiply)
    nisa.tensor_tensor(dst=swapped[:, :, :, half:dim], data1=x4[:, :, :, 0:half], data2=signed4[:, :, :, half:dim],
                       op=nl.multiply)
    # Both terms in fp32, as the reference forms them; their sum is rounded once to the output dtype.
    y = nl.ndarray((parts, count, width), dtype=out.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=y, data1=direct, data2=swapped.reshape((parts, count, width)), op=nl.add)
    nisa.dma_copy(dst=out, src=y)


def _rope(q, k, cos, sin, backward):
    """Both kernels' body: ``(q', k')`` with every head rotated by the tables (see the module docstring)."""
    _check_inputs(q, k, cos, sin)
    batch, _, seq, dim = q.shape
    q_out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    k_out = nl.ndarray(k.shape, dtype=k.dtype, buffer=nl.shared_hbm)
    run = max(1, min(RUN_ELEMENTS // dim, (seq + PARTITIONS - 1) // PARTITIONS))
    tables = cos.shape[0]
    for t in range(tables):
        # A table shared by the batch (tables == 1) is loaded once per position tile for all rows.
        rows_of_table = range(batch) if tables == 1 else range(t, t + 1)
        for s0, parts, tile_run in position_tiles(seq, run):
            cos_tile, signed = _tables(cos, sin, t, s0, parts, tile_run, backward)
            blocks = []
            for b in rows_of_table:
                for x, out in ((q, q_out), (k, k_out)):
                    for h0, count in tile_range(x.shape[1], max(1, FREE_CHUNK // (tile_run * dim))):
                        blocks.append((_block(x, b, h0, count, s0, parts, tile_run),
                                       _block(out, b, h0, count, s0, parts, tile_run)))
            # Each block's load is issued before the previous block is computed and stored, so the DMA
            # queues read ahead while the Vector engine works.
            following = _load(blocks[0][0]) if blocks else None
            for i in range(len(blocks)):
                current = following
                if i + 1 < len(blocks):
                    following = _load(blocks[i + 1][0])
                _rotate(current, blocks[i][1], cos_tile, signed, tile_run, dim)
    return q_out, k_out


@nki.jit
def rope_kernel(q, k, cos, sin):
    """Rotary position embedding of q and k: ``x * cos + rotate_half(x) * sin`` for every head,
    ``rotate_half(x) = (-x2, x1)`` with ``x1, x2`` the two halves of D (the Hugging Face Llama convention).

    Dimensions:
        B: batch; Hq, Hkv: heads of q and k (any counts, may differ); S: positions (any count), on the
        partition axis, ``run`` consecutive positions per partition; D: the head size (even), on the
        free axis with the heads.

    Args:
        q: HBM ``[B, Hq, S, D]`` float32, bfloat16 or float16.
        k: HBM ``[B, Hkv, S, D]``, any of those dtypes.
        cos: HBM ``[T, S, D]`` with T = 1 (one table for every batch row) or B, any of those dtypes.
        sin: HBM, cos's shape, any of those dtypes.

    Returns:
        ``(q_rot, k_rot)``: HBM tensors of q's and k's shapes and dtypes.

    Notes:
        Computed in fp32: ``x * cos`` and ``swap_halves(x) * (-s1, s2)`` are formed in fp32 as the
        reference forms ``x * cos`` and ``rotate_half(x) * sin`` (negating is exact), and their sum is
        rounded once to the output dtype. On chip: the position tile's two fp32 tables and one block's
        ``x * cos`` (PSUM, 16 KiB per partition), and in SBUF two blocks of x (the one computed and
        the one loading), the swapped term and the output block, a few tens of KiB per partition
        however large H and S are. With D above ``RUN_ELEMENTS`` one head is a block and everything
        stays in SBUF: D up to about 8,000 fits trn1's SBUF in fp32.

    Pseudocode:
        run = min(RUN_ELEMENTS // D, ceil(S / 128)) (at least 1)
        for each table t, each position tile (s0, p partitions x run positions):
            c = cos[t, tile]; st = (-sin[t, tile, :D/2], sin[t, tile, D/2:])     (fp32, PSUM)
            for each batch row b using table t, for x in (q, k), each block of heads hs:
                xt = x[b, hs, tile] as [p, heads, run * D]                      (loaded one block ahead)
                out[b, hs, tile] = xt * c + (xt[..., D/2:], xt[..., :D/2]) * st
    """
    return _rope(q, k, cos, sin, False)


@nki.jit
def rope_backward_kernel(grad_q, grad_k, cos, sin):
    """Gradients of ``rope_kernel`` with respect to q and k, given the gradients of its outputs:
    ``dx = g * cos + rotate_half^T(g * sin)`` with ``rotate_half^T(u) = (u2, -u1)``.

    Dimensions:
        B, Hq, Hkv, S, D: as in ``rope_kernel``.

    Args:
        grad_q: HBM ``[B, Hq, S, D]`` gradient of the rotated q, float32, bfloat16 or float16.
        grad_k: HBM ``[B, Hkv, S, D]`` gradient of the rotated k, any of those dtypes.
        cos: HBM ``[T, S, D]``, T = 1 or B, as in the forward.
        sin: HBM, cos's shape.

    Returns:
        ``(dq, dk)``: HBM tensors of grad_q's and grad_k's shapes and dtypes,
        ``dx1 = g1 * c1 + g2 * s2`` and ``dx2 = g2 * c2 - g1 * s1``.

    Notes:
        The forward's body with the signed sin row ``(s2, -s1)`` in place of ``(-s1, s2)``: the
        same fp32 arithmetic, rounding and SBUF use. cos and sin get no gradient (they are the
        position tables, constants of the op).

    Pseudocode:
        as rope_kernel's, with g in place of x and st = (sin[t, tile, D/2:], -sin[t, tile, :D/2])
    """
    return _rope(grad_q, grad_k, cos, sin, True)
