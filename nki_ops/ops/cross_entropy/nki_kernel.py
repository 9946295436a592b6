"""NKI kernels of cross-entropy over a vocabulary: the loss of each row and its gradient in one forward
kernel; fused linear cross-entropy, the same for the logits ``hidden @ weight.T + bias`` computed a chunk
at a time on the Tensor engine, with the gradients of hidden, weight and bias; and the backward of both,
which scales the gradients the forward saved by the incoming one.

Rows go on the partition axis in tiles of 128 (``tile_range``: full tiles, then one tail tile), the
vocabulary on the free axis in chunks of ``VOCAB_CHUNK`` columns, so SBUF holds a few chunk-sized
temporaries per row tile whatever V is. The forward walks each row tile's vocabulary twice: the first
sweep keeps the online softmax statistics (running max ``m`` and sum ``l``) together with the target's
logit and the logits' sum (label smoothing), the second recomputes each chunk's probabilities from
``lse = m + log(l)`` and writes ``dlogits``. The per-chunk pieces (``softcapped``, ``accumulate_chunk``,
``finish_loss``, ``chunk_gradient``) are shared with the fused kernel (see its docstring for its chunk
sizes). Written for the current ``nki`` API (NKI 0.6).

Targets arrive as a float32 column (exact for class indices below 2**24), -1 for an ignored row, and
each row's loss and gradient are multiplied by a float32 row weight (0 for an ignored row, ``1 / count``
under a mean, 1 otherwise) that the caller computes from the targets and the reduction.
"""

from __future__ import annotations

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range

# Vocabulary columns per chunk: one PSUM bank of fp32, the fused kernel's logits tile; with it the
# chunk temporaries take a few 2 KiB slices of each partition.
VOCAB_CHUNK = nl.tile_size.psum_bank_fmax  # 512
# Class indices travel as float32 and are compared with an fp32 iota: exact below 2**24.
MAX_VOCAB = 1 << 24
# The running max starts here rather than at -inf, so the first chunk's rescale is exp(FLOOR - max) = 0.
FLOOR = -1.0e30
# Stands in for the logits of the non-target classes when the target's logit is picked by a max: a
# target logit of -inf then stays -inf (an infinite loss, as torch's).
OTHER = float("-inf")


def check_options(label_smoothing, softcap):
    kernel_check(0.0 <= label_smoothing <= 1.0, f"label_smoothing must be in [0, 1], got {label_smoothing}")
    kernel_check(softcap >= 0.0, f"softcap must be >= 0 (0: none), got {softcap}")


def check_row_columns(target, row_weight, rows):
    for name, column in (("target", target), ("row_weight", row_weight)):
        kernel_check(tuple(column.shape) == (rows, 1) and column.dtype == nl.float32,
                     f"{name} must be HBM [{rows}, 1] float32, got {column.shape} {column.dtype}")


def row_state(target, row_weight, start, size, vocab, label_smoothing, chunk=VOCAB_CHUNK):
    """The SBUF state of one row tile across its vocabulary sweeps, a dict: the row ``target`` and
    ``weight`` columns, the running ``max`` and ``sum``, and one column per chunk of the target's logit
    (``picked``, max-reduced: a chunk without the target gives ``OTHER``) and of the logits' sum
    (``sums``, only with label smoothing), for chunks of ``chunk`` classes; ``finish_loss`` adds ``neg_lse``."""
    chunks = len(tile_range(vocab, chunk))
    sums = None
    if label_smoothing > 0.0:
        sums = nl.ndarray((size, chunks), dtype=nl.float32, buffer=nl.sbuf)
    return {"size": size, "target": _load_column(target, start, size), "weight": _load_column(row_weight, start, size),
            "max": _column(size, FLOOR), "sum": _column(size, 0.0),
            "picked": nl.ndarray((size, chunks), dtype=nl.float32, buffer=nl.sbuf), "sums": sums}


def _column(rows, value):
    col = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=col, value=value)
    return col


def _load_column(hbm, start, size):
    col = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=hbm[start:start + size, :])
    return col


def class_indices(size, c0, cols):
    """``[size, cols]`` fp32 tile whose column j holds the class index ``c0 + j`` on every partition."""
    indices = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.iota(dst=indices, pattern=[[1, cols]], offset=c0)
    return indices


def softcapped(raw, softcap):
    """The logits the loss sees: ``softcap * tanh(raw / softcap)`` as a new fp32 tile, with the tanh tile
    (the gradient's ``1 - tanh**2`` needs it); without softcap ``raw`` itself and None."""
    if not softcap:
        return raw, None
    squashed = nl.ndarray(raw.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=squashed, op=nl.tanh, data=raw, scale=1.0 / softcap)
    capped = nl.ndarray(raw.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=capped, data=squashed, op0=nl.multiply, operand0=softcap)
    return capped, squashed


def accumulate_chunk(state, logits, index, c0):
    """The first sweep's work on chunk ``index`` (columns ``c0 ..``) of the (softcapped) ``logits``:
    update the running max and sum, pick the target's logit, and sum the logits for label smoothing."""
    size, cols = logits.shape
    block_max = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=block_max, op=nl.maximum, data=logits, axis=1, keepdims=True)
    neg_max = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_max, data=block_max, op0=nl.maximum, operand0=state["max"], op1=nl.multiply,
                       operand1=-1.0)
    exps = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    block_sum = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=exps, op=nl.exp, data=logits, bias=neg_max, reduce_op=nl.add, reduce_res=block_sum)
    rescale = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rescale, op=nl.exp, data=state["max"], bias=neg_max)
    nisa.scalar_tensor_tensor(dst=state["sum"], data=state["sum"], op0=nl.multiply, operand0=rescale, op1=nl.add,
                              operand1=block_sum)
    nisa.tensor_scalar(dst=state["max"], data=neg_max, op0=nl.multiply, operand0=-1.0)

    # The target's logit by a select and max, not a one-hot product: 0 * -inf would poison the row.
    is_target = nl.ndarray((size, cols), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=is_target, data=class_indices(size, c0, cols), op0=nl.equal, operand0=state["target"])
    selected = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=selected, predicate=is_target, on_true=logits, on_false=OTHER,
                       reduce_res=state["picked"][:, index:index + 1], reduce_cmd=nisa.reduce_cmd.reset_reduce,
                       reduce_op=nl.maximum)
    if state["sums"] is not None:
        nisa.tensor_reduce(dst=state["sums"][:, index:index + 1], op=nl.add, data=logits, axis=1, keepdims=True)


def finish_loss(state, vocab, label_smoothing):
    """After the first sweep: ``-lse`` of each row (kept in ``state`` for the second sweep) and its
    weighted loss ``w * (log(l) + (1 - s) * (m - x_t) + s * (m - mean(x)))``, a ``[size, 1]`` fp32 tile.
    ``m - x_t`` first, then ``log(l)``: the difference of two close large logits stays exact."""
    size = state["size"]
    log_sum = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=log_sum, op=nl.log, data=state["sum"])
    neg_lse = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_lse, data=log_sum, op0=nl.add, operand0=state["max"], op1=nl.multiply, operand1=-1.0)
    state["neg_lse"] = neg_lse
    target_logit = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=target_logit, op=nl.maximum, data=state["picked"], axis=1, keepdims=True)
    # (x_t - m) * -(1 - s) + log(l)
    loss = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=loss, data=target_logit, op0=nl.subtract, operand0=state["max"], op1=nl.multiply,
                       operand1=-(1.0 - label_smoothing))
    nisa.tensor_tensor(dst=loss, data1=loss, data2=log_sum, op=nl.add)
    if state["sums"] is not None:
        total = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=total, op=nl.add, data=state["sums"], axis=1, keepdims=True)
        # (sum(x) / V - m) * -s, added
        spread = nl.ndarray((size, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=spread, data=total, op0=nl.multiply, operand0=1.0 / vocab, op1=nl.subtract,
                           operand1=state["max"])
        nisa.scalar_tensor_tensor(dst=loss, data=spread, op0=nl.multiply, operand0=-label_smoothing, op1=nl.add,
                                  operand1=loss)
    nisa.tensor_scalar(dst=loss, data=loss, op0=nl.multiply, operand0=state["weight"])
    # An ignored row (weight 0) gives 0 even where its loss is infinite (its target's -inf "logit"),
    # so a predicated copy rather than the product alone.
    counted = nl.ndarray((size, 1), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=counted, data=state["weight"], op0=nl.not_equal, operand0=0.0)
    weighted = _column(size, 0.0)
    nisa.tensor_copy_predicated(dst=weighted, src=loss, predicate=counted)
    return weighted


def chunk_gradient(state, logits, squashed, c0, vocab, label_smoothing, dtype):
    """The second sweep's work on a chunk: ``w * (softmax - (1 - s) * onehot - s / V)``, times
    ``1 - tanh**2`` under a softcap, as a ``[size, cols]`` SBUF tile of ``dtype``."""
    size, cols = logits.shape
    probs = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=probs, op=nl.exp, data=logits, bias=state["neg_lse"])
    onehot = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=onehot, data=class_indices(size, c0, cols), op0=nl.equal, operand0=state["target"],
                       op1=nl.multiply, operand1=1.0 - label_smoothing)
    grad = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=grad, data=probs, op0=nl.subtract, operand0=label_smoothing / vocab,
                              op1=nl.subtract, operand1=onehot)
    out = nl.ndarray((size, cols), dtype=dtype, buffer=nl.sbuf)
    if squashed is None:
        nisa.tensor_scalar(dst=out, data=grad, op0=nl.multiply, operand0=state["weight"])
        return out
    # d/draw softcap * tanh(raw / softcap) = 1 - tanh**2
    slope = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=slope, data1=squashed, data2=squashed, op=nl.multiply)
    nisa.tensor_scalar(dst=slope, data=slope, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
    nisa.scalar_tensor_tensor(dst=out, data=grad, op0=nl.multiply, operand0=state["weight"], op1=nl.multiply,
                              operand1=slope)
    return out


def _load_chunk(logits, start, size, c0, cols):
    tile = nl.ndarray((size, cols), dtype=logits.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=logits[start:start + size, c0:c0 + cols])
    return tile


@nki.jit
def cross_entropy_kernel(logits, target, row_weight, label_smoothing, softcap):
    """Cross-entropy of each row of logits and its gradient with respect to the logits, in one kernel.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        V: classes (any count below 2**24), on the free axis in chunks of ``VOCAB_CHUNK`` (512).

    Args:
        logits: HBM ``[N, V]`` float32, bfloat16 or float16.
        target: HBM ``[N, 1]`` float32 class index of each row, -1 for a row to ignore.
        row_weight: HBM ``[N, 1]`` float32 factor of each row's loss and gradient (0 for an ignored row).
        label_smoothing: python float s in [0, 1]: the target distribution is ``(1 - s) * onehot + s / V``.
        softcap: python float, 0.0 for none, else the logits become ``softcap * tanh(logits / softcap)``.

    Returns:
        ``(loss, dlogits)``: HBM ``[N, 1]`` float32 ``w * (lse - (1 - s) * x_t - s * mean(x))`` and HBM
        ``[N, V]`` in the logits' dtype, the derivative of that weighted loss with respect to the logits.
        A row of weight 0 gives loss 0.

    Notes:
        fp32 math throughout; dlogits is rounded once to the logits' dtype. The logits are read twice
        from HBM (one sweep for the statistics, one for the gradient) and never kept whole on chip: per
        row tile SBUF holds about ten ``[128, 512]`` fp32 temporaries and two ``[128, V / 512]``
        columns of per-chunk results, so V is bounded only by the fp32 class indices. A row's -inf
        logits (masked classes) give probability 0 and gradient 0; the target's logit is picked by a
        max over a select (not a one-hot product, where 0 * -inf is NaN), so they do not poison the row.

    Pseudocode:
        for each row tile (start, p):
            m = -1e30; l = 0
            for each chunk c:                                        (first sweep)
                x = softcap(logits[rows, c]); m_new = max(m, rowmax(x))
                l = l * exp(m - m_new) + rowsum(exp(x - m_new)); m = m_new
                x_t[c] = rowmax(where(class == target, x, -inf)); sx[c] = rowsum(x)
            lse = m + log(l)
            loss[rows] = w == 0 ? 0 : w * (log(l) + (1 - s) * (m - max(x_t)) + s * (m - sum(sx) / V))
            for each chunk c:                                        (second sweep)
                x = softcap(logits[rows, c])
                dlogits[rows, c] = w * (exp(x - lse) - (1 - s) * onehot - s / V) * dsoftcap
    """
    kernel_check(len(logits.shape) == 2 and logits.shape[0] > 0 and 0 < logits.shape[1] < MAX_VOCAB,
                 f"logits must be HBM [N, V] with N > 0 and 0 < V < 2**24, got shape {logits.shape}")
    kernel_check(is_float_dtype(logits.dtype), f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    rows, vocab = logits.shape
    check_row_columns(target, row_weight, rows)
    check_options(label_smoothing, softcap)
    loss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    dlogits = nl.ndarray((rows, vocab), dtype=logits.dtype, buffer=nl.shared_hbm)
    chunks = tile_range(vocab, VOCAB_CHUNK)
    for start, size in tile_range(rows, PARTITIONS):
        state = row_state(target, row_weight, start, size, vocab, label_smoothing)
        for index in range(len(chunks)):
            c0, cols = chunks[index]
            capped, _ = softcapped(_load_chunk(logits, start, size, c0, cols), softcap)
            accumulate_chunk(state, capped, index, c0)
        nisa.dma_copy(dst=loss[start:start + size, :], src=finish_loss(state, vocab, label_smoothing))
        for c0, cols in chunks:
            capped, squashed = softcapped(_load_chunk(logits, start, size, c0, cols), softcap)
            grad = chunk_gradient(state, capped, squashed, c0, vocab, label_smoothing, logits.dtype)
            nisa.dma_copy(dst=dlogits[start:start + size, c0:c0 + cols], src=grad)
    return loss, dlogits


@nki.jit
def scale_rows_kernel(values, grad):
    """``values * grad``, each row scaled by its own factor: the backward of the cross-entropy ops,
    which multiply the gradient their forward saved by the incoming gradient.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        F: columns, on the free axis in chunks of 2,048.

    Args:
        values: HBM ``[N, F]`` float32, bfloat16 or float16, the saved gradient.
        grad: HBM ``[N, 1]`` float32 factor of each row (the incoming gradient, repeated for a scalar).

    Returns:
        HBM ``[N, F]`` in the values' dtype.

    Notes:
        One fp32 multiply per element, rounded once to the values' dtype; one DMA in and one out.

    Pseudocode:
        for each row tile (start, p), each column chunk c:
            out[rows, c] = values[rows, c] * grad[rows]
    """
    kernel_check(len(values.shape) == 2 and values.shape[0] > 0 and values.shape[1] > 0,
                 f"values must be HBM [N, F] with N, F > 0, got shape {values.shape}")
    kernel_check(is_float_dtype(values.dtype), f"values must be float32, bfloat16 or float16, got {values.dtype}")
    rows, width = values.shape
    kernel_check(tuple(grad.shape) == (rows, 1) and grad.dtype == nl.float32,
                 f"grad must be HBM [{rows}, 1] float32, got {grad.shape} {grad.dtype}")
    out = nl.ndarray((rows, width), dtype=values.dtype, buffer=nl.shared_hbm)
    for start, size in tile_range(rows, PARTITIONS):
        factor = _load_column(grad, start, size)
        for c0, cols in tile_range(width, 4 * VOCAB_CHUNK):
            tile = _load_chunk(values, start, size, c0, cols)
            scaled = nl.ndarray((size, cols), dtype=values.dtype, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=scaled, data=tile, op0=nl.multiply, operand0=factor)
            nisa.dma_copy(dst=out[start:start + size, c0:c0 + cols], src=scaled)
    return out


# --------------------------------------------------------------------- fused linear cross-entropy

# The smallest usable SBUF of a partition among the targets (trn1/inf2), the budget of a token chunk.
SBUF_BYTES = 180_224
# Room left for the fixed tiles of a vocabulary chunk and the per-chunk fp32 temporaries (about a
# dozen [128, 512] fp32 tiles of 2 KiB each, plus headroom).
SBUF_RESERVE = 48 * 1024
# At most this many 128-row tiles per token chunk: past it d_weight's HBM traffic is already small.
MAX_TILES_PER_CHUNK = 16


def _itemsize(dtype):
    return 4 if dtype == nl.float32 else 2


def _chunk_fixed_bytes(hidden_size, itemsize, width):
    """SBUF bytes per partition of a vocabulary chunk's weight tiles: ``weight[chunk, :]`` as
    ``width / 128`` tiles ``[128, H]`` and its transpose as ``ceil(H / 128)`` tiles ``[128, width]``."""
    k_blocks = (hidden_size + PARTITIONS - 1) // PARTITIONS
    return (k_blocks * width + width // PARTITIONS * hidden_size) * itemsize


def _tile_bytes(hidden_size, vocab, itemsize, width):
    """SBUF bytes per partition a 128-row tile of a token chunk holds for the whole chunk: hidden rows
    and their transpose (``H * itemsize`` each), the fp32 d_hidden accumulator (``4 * H``), its
    gradient chunk and that chunk's transpose (``2 * width * itemsize``) and its row state (two
    fp32 columns per vocabulary chunk)."""
    chunks = (vocab + width - 1) // width
    return hidden_size * (2 * itemsize + 4) + 2 * width * itemsize + 8 * chunks + 64


def fused_chunks(rows, hidden_size, vocab, itemsize):
    """``(width, tiles)``: the vocabulary chunk width and the number of 128-row tiles per token chunk.

    The widest vocabulary chunk (512 classes, one PSUM bank of fp32; else 256, else 128) with which
    at least one tile fits SBUF next to the chunk's weight tiles; then as many tiles as fit, so that
    the weight is read and d_weight read, added to and written in HBM once per token chunk rather
    than once per tile, up to ``MAX_TILES_PER_CHUNK`` and the row count. ``(0, 0)`` when not even
    one tile fits (H too large)."""
    for width in (VOCAB_CHUNK, VOCAB_CHUNK // 2, PARTITIONS):
        room = SBUF_BYTES - SBUF_RESERVE - _chunk_fixed_bytes(hidden_size, itemsize, width)
        fit = room // _tile_bytes(hidden_size, vocab, itemsize, width) if room > 0 else 0
        if fit >= 1:
            return width, min(fit, MAX_TILES_PER_CHUNK, (rows + PARTITIONS - 1) // PARTITIONS)
    return 0, 0


def _load(hbm_view, shape, dtype):
    tile = nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=hbm_view)
    return tile


def _h_major(blocks, k_blocks, dtype):
    """The transpose of consecutive row blocks (SBUF tiles ``[rows_b, H]``, ``cols`` rows in all), as one
    SBUF tile ``[kk, cols]`` per H block of ``k_blocks``: H on the partitions, as the logits matmul
    contracts it. Each block goes through the Tensor engine (``nc_transpose``, at most 128 x 128) into
    one PSUM tile per H block, copied out once."""
    cols = 0
    for block in blocks:
        cols += block.shape[0]
    tiles = []
    for k0, kk in k_blocks:
        transposed = nl.ndarray((kk, cols), dtype=dtype, buffer=nl.psum)
        r0 = 0
        for block in blocks:
            rows = block.shape[0]
            nisa.nc_transpose(dst=transposed[:, r0:r0 + rows], data=block[:, k0:k0 + kk])
            r0 += rows
        tile = nl.ndarray((kk, cols), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=tile, src=transposed)
        tiles.append(tile)
    return tiles


def _logits_chunk(h_t_tiles, w_t_tiles, bias, ones_row, size, c0, cols):
    """``hidden[rows] @ weight[c0 : c0 + cols].T + bias[c0 : c0 + cols]`` as an fp32 SBUF tile
    ``[size, cols]``: H contracted over the partitions, 128 at a time, into one PSUM bank; the bias
    added by one more matmul, ``ones[1, size].T @ bias_row[1, cols]``, into the same bank."""
    raw_psum = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.psum)
    for k in range(len(h_t_tiles)):
        nisa.nc_matmul(dst=raw_psum, stationary=h_t_tiles[k], moving=w_t_tiles[k], accumulate=k > 0)
    if bias is not None:
        bias_row = _load(bias[0:1, c0:c0 + cols], (1, cols), bias.dtype)
        nisa.nc_matmul(dst=raw_psum, stationary=ones_row[0:1, 0:size], moving=bias_row,
                       is_stationary_onezero=True, accumulate=True)
    raw = nl.ndarray((size, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=raw, src=raw_psum)
    return raw


def _check_fused_inputs(hidden, weight, bias, target, row_weight):
    kernel_check(len(hidden.shape) == 2 and len(weight.shape) == 2,
                 f"hidden and weight must be HBM [N, H] and [V, H], got {hidden.shape} and {weight.shape}")
    rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    kernel_check(rows > 0 and hidden_size > 0 and 0 < vocab < MAX_VOCAB and weight.shape[1] == hidden_size,
                 f"hidden [N, H] and weight [V, H] must share H > 0, with N > 0 and 0 < V < 2**24, got "
                 f"{hidden.shape} and {weight.shape}")
    dtype = hidden.dtype
    kernel_check(is_float_dtype(dtype) and weight.dtype == dtype,
                 f"hidden and weight must both be float32, bfloat16 or float16, got {dtype} and {weight.dtype}")
    if bias is not None:
        kernel_check(tuple(bias.shape) == (1, vocab) and bias.dtype == dtype,
                     f"bias must be HBM [1, {vocab}] {dtype} or None, got {bias.shape} {bias.dtype}")
    check_row_columns(target, row_weight, rows)
    kernel_check(fused_chunks(rows, hidden_size, vocab, _itemsize(dtype))[1] >= 1,
                 f"H = {hidden_size} is too large: one 128-row tile's hidden rows, their transpose and its fp32 "
                 f"d_hidden accumulator do not fit SBUF next to a vocabulary chunk's weight tiles")


@nki.jit
def fused_linear_cross_entropy_kernel(hidden, weight, bias, target, row_weight, label_smoothing, softcap):
    """Cross-entropy of ``hidden @ weight.T + bias`` and its gradients with respect to hidden, weight and
    bias, without the ``[N, V]`` logits ever existing, in one kernel.

    Dimensions:
        N: tokens (any count), on the partition axis in tiles of 128, grouped in token chunks
            (``fused_chunks``).
        H: hidden size, contracted over the partitions in blocks of 128 (logits) and on the free axis
            in blocks of 512 (the gradient matmuls); up to about 4,000 in fp32, 8,000 in bf16/fp16.
        V: classes (any count below 2**24), in chunks of 512 columns (one PSUM bank), 256 or 128 for
            a large H (``fused_chunks``).

    Args:
        hidden: HBM ``[N, H]`` float32, bfloat16 or float16.
        weight: HBM ``[V, H]``, hidden's dtype.
        bias: HBM ``[1, V]`` in hidden's dtype, or None.
        target, row_weight, label_smoothing, softcap: as in ``cross_entropy_kernel``.

    Returns:
        ``(loss, d_hidden, d_weight, d_bias)``: HBM ``[N, 1]`` float32 weighted row losses, ``[N, H]``,
        ``[V, H]`` in hidden's dtype, and ``[V, 1]`` (None without a bias): the derivatives of the sum
        of the weighted row losses.

    Notes:
        Matmuls take the input dtype and accumulate in fp32 PSUM; the softmax and the gradient of the
        logits are fp32, rounded to the input dtype before the gradient matmuls. The logits matmul
        contracts H over the partitions: each hidden tile and each vocabulary chunk of the weight is
        transposed on chip (Tensor engine, 128 x 128 blocks), so no transposed copy exists in HBM; the
        gradient matmuls take hidden, weight and a transpose of dlogits as they are. Each token chunk
        computes its logits twice, one vocabulary chunk at a time: a first sweep for the online
        softmax statistics and the loss, a second for ``dlogits``, which feeds at once
        ``d_hidden += dlogits @ weight[chunk]`` (fp32 SBUF accumulators, one per tile),
        ``d_weight[chunk] += dlogits.T @ hidden`` (PSUM over the chunk's tiles, then added to an fp32
        HBM accumulator: the d_weight output itself for fp32, a scratch ``[V, H]`` fp32 otherwise) and
        ``d_bias[chunk] += dlogits.T @ ones``. Nothing of size ``N * V`` is stored, in HBM or SBUF.
        Chunk sizes (``fused_chunks``), from SBUF capacity, trn1's 176 KiB per partition less 48 KiB
        for a vocabulary chunk's temporaries: 128 tokens per tile (the partitions); 512 classes per
        vocabulary chunk (one PSUM bank of fp32), whose weight rows and their transpose take
        ``8 * H * itemsize`` bytes per partition (256 or 128 classes when one tile would not fit
        next to that); and as many tiles per token chunk as fit, each keeping about
        ``H * (2 * itemsize + 4)`` bytes per partition (hidden rows, their transpose, the fp32
        d_hidden accumulator) for the whole chunk, at most 16. The weight is read twice and d_weight
        read and written once per token chunk, so larger chunks cut HBM traffic, at the cost of
        computing the logits twice (4 matmul passes instead of 3). HBM holds no scratch beyond the
        fp32 d_weight accumulator of half-precision weights.

    Pseudocode:
        for each token chunk (tiles t):
            for each vocabulary chunk c, each tile t:                (first sweep)
                x = softcap(hidden[t] @ weight[c].T + bias[c]); online max/sum, x_t, sum(x) as in
                cross_entropy_kernel
            loss[t] = ...
            for each vocabulary chunk c:                             (second sweep)
                for each tile t:
                    g[t] = w * (softmax(x) - (1 - s) * onehot - s / V) * dsoftcap  (x recomputed)
                    d_hidden_acc[t] += g[t] @ weight[c]
                d_weight[c] += sum_t g[t].T @ hidden[t]; d_bias[c] += sum_t g[t].T @ ones
            d_hidden[t] = d_hidden_acc[t]
    """
    _check_fused_inputs(hidden, weight, bias, target, row_weight)
    check_options(label_smoothing, softcap)
    rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    dtype = hidden.dtype
    loss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    d_hidden = nl.ndarray((rows, hidden_size), dtype=dtype, buffer=nl.shared_hbm)
    d_weight = nl.ndarray((vocab, hidden_size), dtype=dtype, buffer=nl.shared_hbm)
    d_weight_sum = d_weight
    if dtype != nl.float32:
        d_weight_sum = nl.ndarray((vocab, hidden_size), dtype=nl.float32, buffer=nl.hbm)
    d_bias = None
    ones_row = nl.ndarray((1, PARTITIONS), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones_row, value=1.0)
    ones_col = nl.ndarray((PARTITIONS, 1), dtype=dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones_col, value=1.0)
    v_blocks_all = tile_range(vocab, PARTITIONS)
    bias_sum = None
    if bias is not None:
        d_bias = nl.ndarray((vocab, 1), dtype=dtype, buffer=nl.shared_hbm)
        # partition-major: class j on partition j % 128, column j // 128
        bias_sum = nl.ndarray((PARTITIONS, len(v_blocks_all)), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=bias_sum, value=0.0)

    k_blocks = tile_range(hidden_size, PARTITIONS)
    h_blocks = tile_range(hidden_size, VOCAB_CHUNK)
    width, per_chunk = fused_chunks(rows, hidden_size, vocab, _itemsize(dtype))
    chunks = tile_range(vocab, width)
    row_tiles = tile_range(rows, PARTITIONS)
    for first_tile in range(0, len(row_tiles), per_chunk):
        tiles = row_tiles[first_tile:first_tile + per_chunk]
        h_t = []
        h_rows = []
        states = []
        d_hidden_sums = []
        for start, size in tiles:
            rows_tile = _load(hidden[start:start + size, :], (size, hidden_size), dtype)
            h_rows.append(rows_tile)
            h_t.append(_h_major([rows_tile], k_blocks, dtype))
            states.append(row_state(target, row_weight, start, size, vocab, label_smoothing, width))
            acc = nl.ndarray((size, hidden_size), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            d_hidden_sums.append(acc)

        for index in range(len(chunks)):  # first sweep: statistics and loss
            c0, cols = chunks[index]
            w_rows = [_load(weight[c0 + b0:c0 + b0 + bb, :], (bb, hidden_size), dtype)
                      for b0, bb in tile_range(cols, PARTITIONS)]
            w_t = _h_major(w_rows, k_blocks, dtype)
            for t in range(len(tiles)):
                raw = _logits_chunk(h_t[t], w_t, bias, ones_row, tiles[t][1], c0, cols)
                capped, _ = softcapped(raw, softcap)
                accumulate_chunk(states[t], capped, index, c0)
        for t in range(len(tiles)):
            start, size = tiles[t]
            nisa.dma_copy(dst=loss[start:start + size, :], src=finish_loss(states[t], vocab, label_smoothing))

        for c0, cols in chunks:  # second sweep: dlogits and the gradients
            v_blocks = tile_range(cols, PARTITIONS)
            w_rows = [_load(weight[c0 + b0:c0 + b0 + bb, :], (bb, hidden_size), dtype) for b0, bb in v_blocks]
            w_t = _h_major(w_rows, k_blocks, dtype)
            grads = []
            for t in range(len(tiles)):
                size = tiles[t][1]
                raw = _logits_chunk(h_t[t], w_t, bias, ones_row, size, c0, cols)
                capped, squashed = softcapped(raw, softcap)
                grad = chunk_gradient(states[t], capped, squashed, c0, vocab, label_smoothing, dtype)
                grads.append(grad)
                # d_hidden: the classes of the chunk on the partitions, 128 at a time.
                grad_t = []
                for b0, bb in v_blocks:
                    grad_t_psum = nl.ndarray((bb, size), dtype=dtype, buffer=nl.psum)
                    nisa.nc_transpose(dst=grad_t_psum, data=grad[:, b0:b0 + bb])
                    block = nl.ndarray((bb, size), dtype=dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=block, src=grad_t_psum)
                    grad_t.append(block)
                for h0, hh in h_blocks:
                    part = nl.ndarray((size, hh), dtype=nl.float32, buffer=nl.psum)
                    for b in range(len(v_blocks)):
                        nisa.nc_matmul(dst=part, stationary=grad_t[b], moving=w_rows[b][:, h0:h0 + hh],
                                       accumulate=b > 0)
                    acc = d_hidden_sums[t]
                    nisa.tensor_tensor(dst=acc[:, h0:h0 + hh], data1=acc[:, h0:h0 + hh], data2=part, op=nl.add)
            # d_weight and d_bias of the chunk's classes: the chunk's tokens contracted in PSUM.
            for b0, bb in v_blocks:
                v0 = c0 + b0
                for h0, hh in h_blocks:
                    part = nl.ndarray((bb, hh), dtype=nl.float32, buffer=nl.psum)
                    for t in range(len(tiles)):
                        nisa.nc_matmul(dst=part, stationary=grads[t][:, b0:b0 + bb], moving=h_rows[t][:, h0:h0 + hh],
                                       accumulate=t > 0)
                    total = nl.ndarray((bb, hh), dtype=nl.float32, buffer=nl.sbuf)
                    if first_tile == 0:
                        nisa.tensor_copy(dst=total, src=part)
                    else:
                        nisa.dma_copy(dst=total, src=d_weight_sum[v0:v0 + bb, h0:h0 + hh])
                        nisa.tensor_tensor(dst=total, data1=total, data2=part, op=nl.add)
                    nisa.dma_copy(dst=d_weight_sum[v0:v0 + bb, h0:h0 + hh], src=total)
                if bias is not None:
                    column = v0 // PARTITIONS
                    part = nl.ndarray((bb, 1), dtype=nl.float32, buffer=nl.psum)
                    for t in range(len(tiles)):
                        nisa.nc_matmul(dst=part, stationary=grads[t][:, b0:b0 + bb],
                                       moving=ones_col[0:tiles[t][1], :], is_moving_onezero=True, accumulate=t > 0)
                    nisa.tensor_tensor(dst=bias_sum[0:bb, column:column + 1], data1=bias_sum[0:bb, column:column + 1],
                                       data2=part, op=nl.add)

        for t in range(len(tiles)):
            start, size = tiles[t]
            result = nl.ndarray((size, hidden_size), dtype=dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=result, src=d_hidden_sums[t])
            nisa.dma_copy(dst=d_hidden[start:start + size, :], src=result)

    if dtype != nl.float32:  # d_weight from its fp32 accumulator
        for v0, bb in v_blocks_all:
            for h0, hh in h_blocks:
                total = _load(d_weight_sum[v0:v0 + bb, h0:h0 + hh], (bb, hh), nl.float32)
                result = nl.ndarray((bb, hh), dtype=dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=result, src=total)
                nisa.dma_copy(dst=d_weight[v0:v0 + bb, h0:h0 + hh], src=result)
    if bias is not None:
        result = nl.ndarray((PARTITIONS, len(v_blocks_all)), dtype=dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=result, src=bias_sum)
        for column in range(len(v_blocks_all)):
            v0, bb = v_blocks_all[column]
            nisa.dma_copy(dst=d_bias[v0:v0 + bb, 0:1], src=result[0:bb, column:column + 1])
    return loss, d_hidden, d_weight, d_bias
