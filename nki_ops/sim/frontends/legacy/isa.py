"""``neuronxcc.nki.isa`` (``nisa``) for the simulator: the NeuronCore instructions kernels use most.

Legacy call style: each instruction returns a new tile (``core.outputs.Tile``: ``dtype``, ``mask=``) and is a
signature and one call of the core's instruction (``core/isa.py``, ``isa_dma``, ``isa_random``). Vector/Scalar
arithmetic is fp32, bitwise ALU ops work on the integers; outputs round into ``dtype`` (default: the input's).
"""

from __future__ import annotations

import enum

import numpy as np

from ... import core
from ...core import IndexExpr, Mask, enums, isa, isa_dma, isa_random, language
from ...core.errors import KernelUsageError, UnsupportedError, refuse_unknown
from ...core.outputs import Tile
from . import language as nl

# The enums both generations share (``core.enums``); ``dge_mode`` is numbered differently in each.
engine, reduce_cmd, nc_version, oob_mode = enums.spelled(__name__)
unknown_engine, tensor_engine, scalar_engine = engine.unknown, engine.tensor, engine.scalar
gpsimd_engine, vector_engine = engine.gpsimd, engine.vector


class dge_mode(enum.IntEnum):
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


def get_nc_version() -> nc_version:
    return nc_version(core.active_config().nc_version)


# -------------------------------------------------------------------------------- Tensor engine

def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, perf_mode=None, name=None):
    """``stationary.T @ moving`` into a new fp32 PSUM tile; accumulate with ``psum += nc_matmul(...)``.

    ``is_transpose`` (moving is an identity) and the one-zero hints do not change the product; PE
    tiling (``tile_position``/``tile_size``) is checked against its documented rules and computes the
    same product; ``perf_mode="double_row_gen3"`` (trn2 FP8) contracts ``[K, 2, F]`` operands over
    both K and the pair axis; ``mask`` and masked operands (``stationary[mask]``) restrict the result
    elements written."""
    if perf_mode not in (None, "double_row_gen3"):
        raise UnsupportedError(f"nki.isa.nc_matmul(perf_mode={perf_mode!r})", "simulated: 'double_row_gen3'")
    stationary, moving, selected = language.masked_operands("nc_matmul", stationary, moving)
    return isa.nc_matmul(Tile("nc_matmul", mask=mask), stationary, moving, is_transpose, tile_position, tile_size,
                         None if perf_mode is None else "'double_row_gen3'", operand_mask=selected)


def nc_transpose(data, *, mask=None, name=None, dtype=None, engine=engine.unknown):
    """Partition <-> free transpose: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector engine
    (<= 32 x 32, SBUF/PSUM -> SBUF). ``engine.unknown`` picks Vector when both sizes are <= 32."""
    return isa.nc_transpose(Tile("nc_transpose", dtype, mask), data, engine)


# ---------------------------------------------------------------------------------- Scalar engine

def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, name=None, dtype=None):
    """``op(data * scale + bias)``; scale is a scalar or (P, 1), bias is (P, 1). With ``reduce_res``,
    also writes the sum over the free axes into that (P, 1) tile."""
    return isa.activation(Tile("activation", dtype, mask), op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, name=None, dtype=None):
    """``activation`` with the add-reduction into ``reduce_res`` always on."""
    return isa.activation(Tile("activation", dtype, mask), op, data, bias, scale, reduce_op, reduce_res,
                          reduce_cmd.reset_reduce)


# ---------------------------------------------------------------------------------- Vector engine

def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, name=None, engine=engine.unknown):
    """Element-wise ``op(data1, data2)`` of two tiles with equal partition counts and sizes."""
    return isa.tensor_tensor(Tile("tensor_tensor", dtype, mask), data1, data2, op, engine)


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, name=None, engine=engine.unknown):
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) vectors."""
    return isa.tensor_scalar(Tile("tensor_scalar", dtype, mask), data, op0, operand0, reverse0, op1, operand1,
                             reverse1, engine)


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, name=None):
    """``(data op0 operand0) op1 operand1`` with ``operand0`` scalar/(P, 1) and ``operand1`` a full tile."""
    return isa.scalar_tensor_tensor(Tile("scalar_tensor_tensor", dtype, mask), data, op0, operand0, op1, operand1,
                                    reverse0, reverse1)


def tensor_reduce(op, data, axis, *, mask=None, name=None, dtype=None, negate=False, keepdims=False):
    """Reduce along free axes ``axis`` with an ALU operator; ``negate`` multiplies the result by -1."""
    return isa.tensor_reduce(Tile("tensor_reduce", dtype, mask), op, data, axis, negate, keepdims)


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, dtype=None, mask=None,
                         name=None):
    """``tensor_scalar`` with one op, plus a reduction over all free axes into ``reduce_res`` (P, 1)."""
    return isa.tensor_scalar_reduce(Tile("tensor_scalar_reduce", dtype, mask), data, op0, operand0, reduce_op,
                                    reduce_res, reverse0)


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       name=None):
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` per partition from ``initial`` (a
    scalar or (P, 1) tile), on the Vector engine; the result has ``data0``'s shape."""
    return isa.tensor_tensor_scan(Tile("tensor_tensor_scan", dtype, mask), data0, data1, initial, op0, op1,
                                  reverse0, reverse1)


def tensor_copy(src, *, mask=None, name=None, dtype=None, engine=engine.unknown):
    """Copy a tile into a new SBUF tile, casting to ``dtype``."""
    return isa.tensor_copy(Tile("tensor_copy", dtype, mask), src, engine)


def reciprocal(data, *, dtype=None, mask=None, name=None):
    return isa.reciprocal(Tile("reciprocal", dtype, mask), data)


def memset(shape, value, dtype, *, mask=None, name=None, engine=engine.unknown):
    """A new SBUF tile of ``shape`` filled with ``value``."""
    return isa.memset(Tile("memset", dtype, mask), value, shape, engine)


def bn_stats(data, *, mask=None, name=None, dtype=None):
    """Per partition: (count, mean, count * variance) of the even- and of the odd-indexed elements,
    six values; concatenate several along the free axis and combine them with ``bn_aggr``. Under a
    mask only the selected elements count (a partition with none selected keeps poison)."""
    return isa.bn_stats(Tile("bn_stats", dtype, mask), data)


def bn_aggr(data, *, mask=None, name=None, dtype=None):
    """Combine ``bn_stats`` outputs (P, 6k) into per-partition (mean, population variance) (P, 2)."""
    return isa.bn_aggr(Tile("bn_aggr", dtype, mask), data)


# ---------------------------------------------------------------------------------- GpSimd engine

def iota(expr, dtype, *, mask=None, name=None):
    """Materialise an affine index expression (``nl.arange``/``nl.mgrid`` arithmetic) as a tile."""
    if not isinstance(expr, IndexExpr):
        raise KernelUsageError(f"iota needs an nl.arange/nl.mgrid expression, got {type(expr).__name__}")
    if expr.ndim < 2:
        raise KernelUsageError("iota needs a 2-D expression with a partition axis, e.g. nl.arange(n)[:, None]")
    return isa.iota(Tile("iota", dtype, mask), np.broadcast_to(expr.values, expr.shape).astype(np.int32))


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, name=None, dtype=None):
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value`` (e.g. causal masks)."""
    if not isinstance(pred, Mask):
        raise KernelUsageError(f"affine_select needs an affine predicate of nl.arange/nl.mgrid expressions, got "
                               f"{type(pred).__name__}")
    return isa.affine_select(Tile("affine_select", dtype, mask), pred.values, on_true_tile, on_false_value)


def tensor_partition_reduce(op, data, *, mask=None, name=None, dtype=None):
    """Reduce across partitions: (P, F) -> (1, F)."""
    return isa.tensor_partition_reduce(Tile("tensor_partition_reduce", dtype, mask), op, data)


# ----------------------------------------------------------------------------------------- DMA

def dma_copy(*, dst, src, mask=None, name=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown):
    """Copy ``src`` to ``dst`` (HBM or SBUF each; never PSUM); ``dst_rmw_op=np.add`` accumulates.
    With ``oob_mode=skip``, elements whose runtime (indirect) index is out of range are not moved:
    a gather leaves those destination rows as they were, a scatter does not write them."""
    isa_dma.dma_copy_legacy(Tile("dma_copy", mask=mask, dst=dst), src, dst_rmw_op, oob_mode)


# ------------------------------------------------------- Vector engine: selects, top-8, accumulators

fp32 = nl.fp32


def max8(*, src, mask=None, dtype=None, name=None):
    """The 8 largest values of each partition in descending order: a [P, 8] tile."""
    return isa.max8(Tile("max8", dtype, mask), src)


def nc_find_index8(*, data, vals, mask=None, dtype=None, name=None):
    """Per partition, the index of the first occurrence of each of the 8 ``vals`` in ``data`` (the mask
    applies to ``data``): a [P, 8] uint32 (or uint16) tile, all ones for a value not found."""
    return isa.nc_find_index8(Tile("nc_find_index8", dtype, mask), data, vals)


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, name=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by ``imm``
    (the mask applies to ``data``); the matched positions go to ``dst_idx`` when given."""
    return isa.nc_match_replace8(Tile("nc_match_replace8", dtype, mask), data, vals, imm, dst_idx)


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, name=None):
    """Within each 32-partition quadrant, partition ``i`` of ``dst`` becomes partition
    ``shuffle_mask[i]`` of ``src``; 255 and masked-off elements leave ``dst`` unmodified."""
    isa.nc_stream_shuffle(Tile("nc_stream_shuffle", mask=mask, dst=dst), src, shuffle_mask)


def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=np.amax, range_start=0, on_false_value=fp32.min, mask=None, dtype=None, name=None):
    """Elements of ``on_true_tile`` whose free index + ``range_start`` passes both comparisons with the
    partition's bounds, else ``on_false_value``; the result's max per partition goes to the Vector
    engine's accumulators (``reduce_cmd``) and ``reduce_res``. NeuronCore-v3 (trn2) and later."""
    return isa.range_select(Tile("range_select", dtype, mask), on_true_tile, comp_op0, comp_op1, bound0, bound1,
                            reduce_cmd, reduce_res, reduce_op, range_start, on_false_value)


def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=np.amax, reverse_pred=False, mask=None, dtype=None, name=None):
    """``dst = where(predicate, on_true, on_false)`` (``on_false`` a scalar or (P, 1)), with the max per
    partition into the Vector engine's accumulators (``reduce_cmd``) and ``reduce_res``."""
    isa.select_reduce(Tile("select_reduce", mask=mask, dst=dst), predicate, on_true, on_false, reduce_res, reduce_cmd,
                      reduce_op, reverse_pred)


def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, dtype=None, name=None):
    """Copy ``src`` (a tile or a scalar) into ``dst`` where ``predicate`` is nonzero (zero with
    ``reverse_pred``); elsewhere ``dst`` is unmodified."""
    isa.tensor_copy_predicated(Tile("tensor_copy_predicated", mask=mask, dst=dst), src, predicate, reverse_pred)


def tensor_scalar_cumulative(*, src, dst, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, mask=None,
                             name=None):
    """``dst[:, i] = op1(op0(src[:, i], imm0), acc)`` along the free axis, the Vector engine's
    accumulator starting per ``reduce_cmd`` (reset_reduce: op1's identity, reduce: where it was,
    load_reduce: ``imm1``)."""
    isa.tensor_scalar_cumulative(Tile("tensor_scalar_cumulative", mask=mask, dst=dst), src, op0, op1, imm0, imm1,
                                 reduce_cmd)


def dropout(data, prob, *, mask=None, dtype=None, name=None):
    """Each element replaced by zero with probability ``prob`` (a scalar or (P, 1))."""
    return isa_random.dropout(Tile("dropout", dtype, mask), data, prob)


# ------------------------------------------------------------------------------ GpSimd engine, DMA

def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, name=None):
    """Gather within each GpSimd core's 16 partitions (``core.gpsimd.local_gather``): a
    [P, num_valid_indices * num_elem_per_idx] tile of ``src_buffer``'s dtype; uint16 indices."""
    return isa.local_gather(Tile("local_gather", mask=mask), src_buffer, index, num_elem_per_idx, num_valid_indices)


def sequence_bounds(*, segment_ids, dtype=None, name=None):
    """For segment ids [1, n], a [1, 2, n] tile of each element's segment start and end
    (``core.gpsimd.sequence_bounds``); float32 or int32."""
    return isa.sequence_bounds(Tile("sequence_bounds", dtype), segment_ids)


def dma_transpose(src, *, axes=None, mask=None, dtype=None, dge_mode=dge_mode.unknown, name=None):
    """``src`` (HBM or SBUF) transposed by the DMA engine into a new SBUF tile: axes (1, 0),
    (2, 1, 0) or (3, 1, 2, 0), by default the one of src's rank."""
    return isa_dma.dma_transpose(Tile("dma_transpose", dtype, mask), src, axes)


def tensor_copy_dynamic_src(src, *, mask=None, dtype=None, engine=engine.unknown, name=None):
    """``tensor_copy`` of a source indexed at a runtime offset (``t[ix, offsets[0, i] + iy]``)."""
    return tensor_copy(src, mask=mask, dtype=dtype, engine=engine)


__getattr__ = refuse_unknown("nki.isa")
