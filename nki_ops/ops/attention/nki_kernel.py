"""NKI kernels of flash attention: the forward (output and log-sum-exp) and its gradient (dq, dk, dv).

Query and key rows stream through SBUF one tile at a time, so on-chip use depends on the head size
and the tile sizes, never on the sequence lengths. The forward keeps, per 128-row query tile, a running
row max ``m``, a running sum ``l`` and an unnormalised output ``acc`` (the online softmax), and saves
``lse = m + log(l)`` per row; the backward recomputes the probabilities from the scores and that lse.

Masks are decided per tile when the kernel is traced: a tile no row of which can see a key of the
other (causal, sliding window) is never visited, a tile every pair of which is visible gets no mask
instruction, and only the tiles in between are masked (``nisa.affine_select``). ``seq_lens`` is data,
so it masks (one comparison per tile) and skips nothing. Written for the current ``nki`` API (NKI 0.6).

Layouts: the Tensor engine contracts over the partition axis, so the scores ``q @ k.T`` need q and k
with D on the partitions. The kernels take them transposed from the caller (``q_t[B, Hq, D, S]``,
``k_t[B, Hkv, D, S_kv]``, the layout of the public NKI flash-attention kernels) instead of transposing
each tile on chip.
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range

# Keys per forward step: one PSUM bank holds a [128, 512] fp32 score tile.
KV_BLOCK = nl.tile_size.psum_bank_fmax
MAX_HEAD_DIM = PARTITIONS
# A masked score. Finite, so ``masked - m`` is never ``-inf - -inf``; exp of it is 0 for any row max.
MASKED = -3.0e38
# The running max starts here rather than at -inf: a row that has seen no visible key yet keeps
# m = FLOOR, and exp(MASKED - FLOOR) is still 0, so it adds nothing to l or acc.
FLOOR = -1.0e30
# l is clamped to this before 1/l and log(l): a row that sees no key gives 0, not 0/0.
TINY = 1.0e-30


def visible_keys(q0, rows, s_kv, causal, window):
    """``(lo, hi)``: the keys ``lo .. hi - 1`` hold every key some query ``q0 .. q0 + rows - 1`` may see."""
    last = q0 + rows - 1
    lo, hi = 0, s_kv
    if causal:
        hi = min(hi, last + 1)
    if window:
        lo = max(lo, q0 - window + 1)
        if not causal:
            hi = min(hi, last + window)
    return lo, max(lo, hi)


def visible_queries(k0, cols, s_q, causal, window):
    """``(lo, hi)``: the queries ``lo .. hi - 1`` hold every query that may see a key ``k0 .. k0 + cols - 1``."""
    last = k0 + cols - 1
    lo, hi = 0, s_q
    if causal:
        lo = max(lo, k0)
    if window:
        hi = min(hi, last + window)
        if not causal:
            lo = max(lo, k0 - window + 1)
    return lo, max(lo, hi)


def spans(lo, hi, tile):
    """``tile_range`` of the interval ``lo .. hi - 1``: ``(start, size)`` tiles starting at ``lo``."""
    return tuple((lo + start, size) for start, size in tile_range(hi - lo, tile))


def _check_common(q_t, k_t, seq_lens, scale, causal, window, softcap):
    kernel_check(len(q_t.shape) == 4 and len(k_t.shape) == 4,
                 f"q_t and k_t must be HBM [B, H, D, S], got shapes {q_t.shape} and {k_t.shape}")
    batch, heads, dim, _ = q_t.shape
    kernel_check(k_t.shape[0] == batch and k_t.shape[2] == dim,
                 f"k_t must be [{batch}, Hkv, {dim}, S_kv] (q_t is {q_t.shape}), got {k_t.shape}")
    kernel_check(k_t.shape[1] >= 1 and heads % k_t.shape[1] == 0,
                 f"the query heads ({heads}) must be a multiple of the key/value heads ({k_t.shape[1]})")
    kernel_check(1 <= dim <= MAX_HEAD_DIM, f"the head size D must be 1 to {MAX_HEAD_DIM}, got {dim}")
    kernel_check(is_float_dtype(q_t.dtype) and k_t.dtype == q_t.dtype,
                 f"q and k must both be float32, bfloat16 or float16, got {q_t.dtype} and {k_t.dtype}")
    if seq_lens is not None:
        kernel_check(tuple(seq_lens.shape) == (batch, 1) and seq_lens.dtype == nl.float32,
                     f"seq_lens must be HBM [{batch}, 1] float32 (exact lengths up to 2**24) or None, got "
                     f"{seq_lens.shape} {seq_lens.dtype}")
    kernel_check(scale > 0.0, f"scale must be a positive float, got {scale}")
    kernel_check(window >= 0 and softcap >= 0.0,
                 f"sliding_window and softcap must be >= 0 (0: none), got {window} and {softcap}")


def _column(rows, value):
    """A ``[rows, 1]`` fp32 SBUF column holding ``value``."""
    col = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=col, value=value)
    return col


def _row_limits(seq_lens, b, q0, rows):
    """Per query row ``i`` of the tile, how many keys it may see under ``seq_lens``: ``L`` when
    ``i < L``, else 0 (a row past its sequence's length sees nothing and gives zeros)."""
    length = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    # The batch's length, arriving on every partition through a stride-0 view of HBM.
    nisa.dma_copy(dst=length, src=seq_lens[b:b + 1, 0:1].broadcast(0, rows))
    row = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=row, pattern=[[0, 1]], offset=q0, channel_multiplier=1)
    limit = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=limit, data=row, op0=nl.less, operand0=length, op1=nl.multiply, operand1=length)
    return limit


def _scores(dst, raw, scale, softcap):
    """``dst = softcap * tanh(scale * raw / softcap)`` (or ``scale * raw``) from the PSUM scores ``raw``.
    Returns the tanh tile with a softcap (its derivative is needed by the backward), else None."""
    if softcap:
        squashed = nl.ndarray(dst.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=squashed, op=nl.tanh, data=raw, scale=scale / softcap)
        nisa.tensor_scalar(dst=dst, data=squashed, op0=nl.multiply, operand0=softcap)
        return squashed
    nisa.activation(dst=dst, op=nl.copy, data=raw, scale=scale)
    return None


def _mask(scores, q0, k0, causal, window, limit):
    """Set the scores of the key/query pairs the masks hide to ``MASKED``, using only the instructions
    this tile needs. ``limit`` is the ``_row_limits`` column under ``seq_lens``, else None."""
    rows, cols = scores.shape
    # Affine value of element (p, f): (k0 + f) - (q0 + p) = key - query.
    pattern, offset = [[1, cols]], k0 - q0
    if causal and k0 + cols - 1 > q0:  # some key after its query: keep key - query <= 0
        nisa.affine_select(dst=scores, pattern=pattern, channel_multiplier=-1, on_true_tile=scores,
                           on_false_value=MASKED, cmp_op=nl.less_equal, offset=offset)
    if window and k0 <= q0 + rows - 1 - window:  # some key too far behind: keep key - query + W > 0
        nisa.affine_select(dst=scores, pattern=pattern, channel_multiplier=-1, on_true_tile=scores,
                           on_false_value=MASKED, cmp_op=nl.greater, offset=offset + window)
    if window and not causal and k0 + cols - 1 >= q0 + window:  # too far ahead: key - query - W < 0
        nisa.affine_select(dst=scores, pattern=pattern, channel_multiplier=-1, on_true_tile=scores,
                           on_false_value=MASKED, cmp_op=nl.less, offset=offset - window)
    if limit is not None:
        keys = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=keys, pattern=pattern, offset=k0)
        # MASKED where key >= limit, else 0; added to the scores.
        penalty = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=penalty, data=keys, op0=nl.greater_equal, operand0=limit, op1=nl.multiply,
                           operand1=MASKED)
        nisa.tensor_tensor(dst=scores, data1=scores, data2=penalty, op=nl.add)


def _load(hbm_view, shape, dtype):
    tile = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=hbm_view)
    return tile


def _forward_tile(q_t, k_t, v, out, lse, b, h, kv_head, q0, rows, limit, scale, causal, window, softcap, kv_block):
    dim, s_kv = q_t.shape[2], k_t.shape[3]
    q_tile = _load(q_t[b, h, :, q0:q0 + rows], (dim, rows), q_t.dtype)
    row_max = _column(rows, FLOOR)
    row_sum = _column(rows, 0.0)
    acc = nl.ndarray((rows, dim), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    lo, hi = visible_keys(q0, rows, s_kv, causal, window)
    for k0, cols in spans(lo, hi, kv_block):
        k_tile = _load(k_t[b, kv_head, :, k0:k0 + cols], (dim, cols), k_t.dtype)
        raw = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=raw, stationary=q_tile, moving=k_tile, accumulate=False)
        scores = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
        _scores(scores, raw, scale, softcap)
        _mask(scores, q0, k0, causal, window, limit)

        # Online softmax: new max, probabilities against it, and the factor that rescales the past.
        block_max = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=block_max, op=nl.maximum, data=scores, axis=1, keepdims=True)
        neg_max = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_max, data=block_max, op0=nl.maximum, operand0=row_max, op1=nl.multiply,
                           operand1=-1.0)
        probs = nl.ndarray((rows, cols), dtype=v.dtype, buffer=nl.sbuf)
        block_sum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=probs, op=nl.exp, data=scores, bias=neg_max, reduce_op=nl.add,
                               reduce_res=block_sum)
        rescale = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rescale, op=nl.exp, data=row_max, bias=neg_max)
        nisa.scalar_tensor_tensor(dst=row_sum, data=row_sum, op0=nl.multiply, operand0=rescale, op1=nl.add,
                                  operand1=block_sum)
        nisa.tensor_scalar(dst=row_max, data=neg_max, op0=nl.multiply, operand0=-1.0)

        # probs @ v, 128 keys at a time: the Tensor engine wants the keys on the partitions.
        product = nl.ndarray((rows, dim), dtype=nl.float32, buffer=nl.psum)
        for c0, size in tile_range(cols, PARTITIONS):
            probs_t_psum = nl.ndarray((size, rows), dtype=probs.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=probs_t_psum, data=probs[:, c0:c0 + size])
            probs_t = nl.ndarray((size, rows), dtype=probs.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=probs_t, src=probs_t_psum)
            v_tile = _load(v[b, kv_head, k0 + c0:k0 + c0 + size, :], (size, dim), v.dtype)
            nisa.nc_matmul(dst=product, stationary=probs_t, moving=v_tile, accumulate=c0 > 0)
        nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=rescale, op1=nl.add,
                                  operand1=product)

    clamped = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=clamped, data=row_sum, op0=nl.maximum, operand0=TINY)
    inverse = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inverse, data=clamped)
    result = nl.ndarray((rows, dim), dtype=out.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=result, data=acc, op0=nl.multiply, operand0=inverse)
    nisa.dma_copy(dst=out[b, h, q0:q0 + rows, :], src=result)
    log_sum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=log_sum, op=nl.log, data=clamped)
    nisa.tensor_tensor(dst=log_sum, data1=log_sum, data2=row_max, op=nl.add)
    nisa.dma_copy(dst=lse[b, h, q0:q0 + rows, :], src=log_sum)


@nki.jit
def flash_attention_kernel(q_t, k_t, v, seq_lens, scale, causal, window, softcap, kv_block=KV_BLOCK):
    """Flash attention forward: ``softmax(mask(softcap(scale * q @ k.T))) @ v`` per head.

    Dimensions:
        B: batch. Hq, Hkv: query and key/value heads, Hq a multiple of Hkv (grouped-query attention).
        S, S_kv: query and key rows (any counts), in tiles of 128 queries and ``KV_BLOCK`` (512) keys.
        D: head size, 1 to 128, on the partition axis of the score matmul.

    Args:
        q_t: HBM ``[B, Hq, D, S]``, the queries transposed; float32, bfloat16 or float16.
        k_t: HBM ``[B, Hkv, D, S_kv]``, the keys transposed, q's dtype.
        v: HBM ``[B, Hkv, S_kv, D]``, q's dtype.
        seq_lens: HBM ``[B, 1]`` float32 lengths (keys ``>= L`` hidden, rows ``>= L`` give zeros), or None.
        scale: python float > 0 multiplying the scores.
        causal: python bool, key ``j`` visible to query ``i`` only when ``j <= i``.
        window: python int, 0 for none, else key ``j`` visible only when ``|i - j| < window``.
        softcap: python float, 0.0 for none, else scores become ``softcap * tanh(scores / softcap)``.
        kv_block: keys per block of the online softmax, 1 to ``KV_BLOCK`` (one PSUM bank of scores); a
            tiling choice that changes the time, not the values beyond rounding (``tuning.py``).

    Returns:
        ``(out, lse)``: HBM ``[B, Hq, S, D]`` in q's dtype, and HBM ``[B, Hq, S, 1]`` float32, each row's
        log-sum-exp of its visible scores (about ``-1e30`` for a row that sees no key), for the backward.

    Notes:
        Matmuls take the input dtype and accumulate in fp32 PSUM; the softmax statistics (m, l, lse)
        and the output accumulator are fp32, the probabilities are rounded to the input dtype before
        ``@ v``. Per query tile SBUF holds ``q`` ``[D, 128]``, one key block ``[D, 512]``, fp32 scores
        and probabilities ``[128, 512]`` and the accumulator ``[128, D]``: about 6 KiB per partition,
        whatever S and S_kv are. Query tile ``i`` visits only the key blocks of ``visible_keys``;
        tiles fully visible get no mask instruction. A row that sees no key has ``l = 0`` and
        gives zeros (``acc * 1 / max(l, 1e-30)``).

    Pseudocode:
        for b, h; kv = h // (Hq // Hkv):
            for each query tile (q0, p):
                m = -1e30; l = 0; acc = 0
                for each key block (k0, n) in visible_keys(q0, p):
                    s = mask(softcap(scale * q_t[:, q0:q0+p].T @ k_t[:, k0:k0+n]))
                    m_new = max(m, rowmax(s)); pr = exp(s - m_new); c = exp(m - m_new)
                    l = l * c + rowsum(pr); acc = acc * c + pr @ v[k0:k0+n]; m = m_new
                out[q0:q0+p] = acc / max(l, 1e-30); lse[q0:q0+p] = m + log(max(l, 1e-30))
    """
    _check_common(q_t, k_t, seq_lens, scale, causal, window, softcap)
    batch, heads, dim, s_q = q_t.shape
    kv_heads, s_kv = k_t.shape[1], k_t.shape[3]
    kernel_check(tuple(v.shape) == (batch, kv_heads, s_kv, dim) and v.dtype == q_t.dtype,
                 f"v must be [{batch}, {kv_heads}, {s_kv}, {dim}] {q_t.dtype}, got {v.shape} {v.dtype}")
    kernel_check(1 <= kv_block <= KV_BLOCK, f"kv_block must be 1 to {KV_BLOCK} keys (one PSUM bank), got {kv_block}")
    out = nl.ndarray((batch, heads, s_q, dim), dtype=q_t.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((batch, heads, s_q, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    group = heads // kv_heads
    for b in range(batch):
        for h in range(heads):
            for q0, rows in tile_range(s_q, PARTITIONS):
                limit = None if seq_lens is None else _row_limits(seq_lens, b, q0, rows)
                _forward_tile(q_t, k_t, v, out, lse, b, h, h // group, q0, rows, limit, scale, causal, window,
                              softcap, kv_block)
    return out, lse


def _prepare_backward(q, grad, out, delta, dq_sum, b, h, q0, rows):
    """``delta = rowsum(grad * out)`` of one query tile (the softmax backward's correction term), and
    the tile's fp32 dq accumulator set to zero (rows no key block reaches keep that zero)."""
    dim = q.shape[3]
    grad_tile = _load(grad[b, h, q0:q0 + rows, :], (rows, dim), grad.dtype)
    out_tile = _load(out[b, h, q0:q0 + rows, :], (rows, dim), out.dtype)
    products = nl.ndarray((rows, dim), dtype=nl.float32, buffer=nl.sbuf)
    row_dot = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=products, data1=grad_tile, data2=out_tile, op=nl.multiply)
    nisa.tensor_reduce(dst=row_dot, op=nl.add, data=products, axis=1, keepdims=True)
    nisa.dma_copy(dst=delta[b, h, q0:q0 + rows, :], src=row_dot)
    zeros = nl.ndarray((rows, dim), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zeros, value=0.0)
    nisa.dma_copy(dst=dq_sum[b, h, q0:q0 + rows, :], src=zeros)


def _backward_pair(q, q_t, grad, grad_t, lse, delta, dq_sum, keys, b, h, q0, rows, k0, limit, scale, causal,
                   window, softcap, dk_sum, dv_sum, first):
    """One (query tile, key tile) pair: recompute the probabilities, then add its share to dv, dk
    (PSUM accumulators of the key tile) and dq (the fp32 HBM accumulator of the query tile)."""
    k_tile, k_rows, v_t_tile = keys
    dim, cols = q.shape[3], k_tile.shape[1]
    mm_dtype = q.dtype
    q_tile_t = _load(q_t[b, h, :, q0:q0 + rows], (dim, rows), mm_dtype)
    raw = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=raw, stationary=q_tile_t, moving=k_tile, accumulate=False)
    scores = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    squashed = _scores(scores, raw, scale, softcap)
    _mask(scores, q0, k0, causal, window, limit)
    neg_lse = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=neg_lse, src=lse[b, h, q0:q0 + rows, :])
    nisa.tensor_scalar(dst=neg_lse, data=neg_lse, op0=nl.multiply, operand0=-1.0)
    probs = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=probs, op=nl.exp, data=scores, bias=neg_lse)
    probs_mm = probs
    if mm_dtype != nl.float32:
        probs_mm = nl.ndarray((rows, cols), dtype=mm_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=probs_mm, src=probs)

    # dv += probs.T @ grad
    grad_rows = _load(grad[b, h, q0:q0 + rows, :], (rows, dim), mm_dtype)
    nisa.nc_matmul(dst=dv_sum, stationary=probs_mm, moving=grad_rows, accumulate=not first)

    # d scores = probs * (grad @ v.T - delta), then through softcap and scale to the raw scores.
    grad_tile_t = _load(grad_t[b, h, :, q0:q0 + rows], (dim, rows), mm_dtype)
    d_probs = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=d_probs, stationary=grad_tile_t, moving=v_t_tile, accumulate=False)
    row_delta = _load(delta[b, h, q0:q0 + rows, :], (rows, 1), nl.float32)
    d_scores = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d_scores, data=d_probs, op0=nl.subtract, operand0=row_delta, op1=nl.multiply,
                              operand1=probs)
    if squashed is not None:  # d/draw softcap * tanh(scale * raw / softcap) = scale * (1 - tanh**2)
        slope = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=slope, data=squashed, op0=nl.multiply, operand0=-1.0, op1=nl.multiply,
                                  operand1=squashed)
        nisa.scalar_tensor_tensor(dst=d_scores, data=slope, op0=nl.add, operand0=1.0, op1=nl.multiply,
                                  operand1=d_scores)
    d_raw = nl.ndarray((rows, cols), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=d_raw, data=d_scores, op0=nl.multiply, operand0=scale)

    # dk += d_raw.T @ q
    q_rows = _load(q[b, h, q0:q0 + rows, :], (rows, dim), mm_dtype)
    nisa.nc_matmul(dst=dk_sum, stationary=d_raw, moving=q_rows, accumulate=not first)

    # dq += d_raw @ k: d_raw transposed so the keys are on the partitions.
    d_raw_t_psum = nl.ndarray((cols, rows), dtype=mm_dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=d_raw_t_psum, data=d_raw)
    d_raw_t = nl.ndarray((cols, rows), dtype=mm_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d_raw_t, src=d_raw_t_psum)
    dq_part = nl.ndarray((rows, dim), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=dq_part, stationary=d_raw_t, moving=k_rows, accumulate=False)
    dq_tile = _load(dq_sum[b, h, q0:q0 + rows, :], (rows, dim), nl.float32)
    nisa.tensor_tensor(dst=dq_tile, data1=dq_tile, data2=dq_part, op=nl.add)
    nisa.dma_copy(dst=dq_sum[b, h, q0:q0 + rows, :], src=dq_tile)


@nki.jit
def flash_attention_backward_kernel(q, q_t, k, k_t, v_t, out, lse, grad, grad_t, seq_lens, scale, causal,
                                    window, softcap):
    """Gradients of flash attention with respect to q, k and v, given the gradient of the output.

    Dimensions:
        B, Hq, Hkv, S, S_kv, D: as in ``flash_attention_kernel``; key and query tiles of 128 rows.

    Args:
        q: HBM ``[B, Hq, S, D]`` and q_t its transpose ``[B, Hq, D, S]``; float32, bfloat16 or float16.
        k: HBM ``[B, Hkv, S_kv, D]`` and k_t ``[B, Hkv, D, S_kv]``; v_t: HBM ``[B, Hkv, D, S_kv]``, v transposed.
        out, lse: the forward's results (``[B, Hq, S, D]`` and ``[B, Hq, S, 1]`` float32).
        grad: HBM ``[B, Hq, S, D]`` gradient of out, and grad_t its transpose ``[B, Hq, D, S]``.
        seq_lens, scale, causal, window, softcap: as in the forward.

    Returns:
        ``(dq, dk, dv)``: HBM ``[B, Hq, S, D]``, ``[B, Hkv, S_kv, D]``, ``[B, Hkv, S_kv, D]`` in q's dtype.

    Notes:
        The probabilities are recomputed, ``exp(scores - lse)``, never stored. The outer loop walks key
        tiles: dk and dv of a key tile accumulate in two fp32 PSUM tiles over every query tile of every
        query head of its group that can see it (``visible_queries``), and go to HBM once; dq
        accumulates in an fp32 HBM scratch ``[B, Hq, S, D]``, read, added to and written back per
        pair, so SBUF use does not grow with S. Fully masked (query, key) tile pairs are skipped.

    Pseudocode:
        delta = rowsum(grad * out); dq_sum = 0
        for b, each key head kv, each key tile (k0, n):
            dk = dv = 0 (PSUM)
            for each query head h of kv's group, each query tile (q0, p) in visible_queries(k0, n):
                s = mask(softcap(scale * q_t[:, q0:q0+p].T @ k_t[:, k0:k0+n])); pr = exp(s - lse)
                dv += pr.T @ grad; ds = pr * (grad @ v.T - delta) * dsoftcap * scale
                dk += ds.T @ q; dq_sum[q0:q0+p] += ds @ k[k0:k0+n]
            dk[k0:k0+n], dv[k0:k0+n] = dk, dv
        dq = dq_sum
    """
    _check_common(q_t, k_t, seq_lens, scale, causal, window, softcap)
    batch, heads, dim, s_q = q_t.shape
    kv_heads, s_kv = k_t.shape[1], k_t.shape[3]
    for name, tensor, shape in (("q", q, (batch, heads, s_q, dim)), ("k", k, (batch, kv_heads, s_kv, dim)),
                                ("v_t", v_t, (batch, kv_heads, dim, s_kv)), ("out", out, (batch, heads, s_q, dim)),
                                ("grad", grad, (batch, heads, s_q, dim)), ("grad_t", grad_t, (batch, heads, dim, s_q))):
        kernel_check(tuple(tensor.shape) == shape and tensor.dtype == q_t.dtype,
                     f"{name} must be [{', '.join(map(str, shape))}] {q_t.dtype}, got {tensor.shape} {tensor.dtype}")
    kernel_check(tuple(lse.shape) == (batch, heads, s_q, 1) and lse.dtype == nl.float32,
                 f"lse must be [{batch}, {heads}, {s_q}, 1] float32, got {lse.shape} {lse.dtype}")
    dq = nl.ndarray((batch, heads, s_q, dim), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((batch, kv_heads, s_kv, dim), dtype=q.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((batch, kv_heads, s_kv, dim), dtype=q.dtype, buffer=nl.shared_hbm)
    delta = nl.ndarray((batch, heads, s_q, 1), dtype=nl.float32, buffer=nl.hbm)
    dq_sum = nl.ndarray((batch, heads, s_q, dim), dtype=nl.float32, buffer=nl.hbm)
    group = heads // kv_heads
    q_tiles = tile_range(s_q, PARTITIONS)
    for b in range(batch):
        for h in range(heads):
            for q0, rows in q_tiles:
                _prepare_backward(q, grad, out, delta, dq_sum, b, h, q0, rows)
    for b in range(batch):
        # Under seq_lens, each query tile's row limits ([rows, 1] fp32), computed once per batch.
        limits = {}
        if seq_lens is not None:
            for q0, rows in q_tiles:
                limits[q0] = _row_limits(seq_lens, b, q0, rows)
        for kv_head in range(kv_heads):
            for k0, cols in tile_range(s_kv, PARTITIONS):
                keys = (_load(k_t[b, kv_head, :, k0:k0 + cols], (dim, cols), k.dtype),
                        _load(k[b, kv_head, k0:k0 + cols, :], (cols, dim), k.dtype),
                        _load(v_t[b, kv_head, :, k0:k0 + cols], (dim, cols), k.dtype))
                dk_sum = nl.ndarray((cols, dim), dtype=nl.float32, buffer=nl.psum)
                dv_sum = nl.ndarray((cols, dim), dtype=nl.float32, buffer=nl.psum)
                lo, hi = visible_queries(k0, cols, s_q, causal, window)
                first = True
                for h in range(kv_head * group, (kv_head + 1) * group):
                    for q0, rows in q_tiles:
                        if q0 >= hi or q0 + rows <= lo:
                            continue  # no query of this tile sees these keys
                        _backward_pair(q, q_t, grad, grad_t, lse, delta, dq_sum, keys, b, h, q0, rows, k0,
                                       limits.get(q0), scale, causal, window, softcap, dk_sum, dv_sum, first)
                        first = False
                for dst, acc in ((dk, dk_sum), (dv, dv_sum)):
                    result = nl.ndarray((cols, dim), dtype=dst.dtype, buffer=nl.sbuf)
                    if first:  # no query sees these keys
                        nisa.memset(dst=result, value=0.0)
                    else:
                        nisa.tensor_copy(dst=result, src=acc)
                    nisa.dma_copy(dst=dst[b, kv_head, k0:k0 + cols, :], src=result)
    for b in range(batch):
        for h in range(heads):
            for q0, rows in q_tiles:
                dq_tile = _load(dq_sum[b, h, q0:q0 + rows, :], (rows, dim), nl.float32)
                result = nl.ndarray((rows, dim), dtype=dq.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=result, src=dq_tile)
                nisa.dma_copy(dst=dq[b, h, q0:q0 + rows, :], src=result)
    return dq, dk, dv
