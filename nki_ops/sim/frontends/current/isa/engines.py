"""The compute engines' instructions of the current API (Tensor, Scalar, Vector, GpSimd engines):
destination passing, each writing ``dst``: a signature and one call of ``core/isa.py``, which holds the rules
and semantics both generations share."""

from __future__ import annotations

from ....core import isa
from ....core.errors import UnsupportedError
from ....core.outputs import Dst
from .constants import engine, matmul_perf_mode, reduce_cmd
from .instruction import instruction


@instruction
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    """``dst (+)= stationary.T @ moving`` into PSUM. ``accumulate=None``: the first write to a PSUM
    location overwrites it, later ones add (as the compiler decides)."""
    out = Dst(dst, "nisa.nc_matmul")
    if perf_mode not in (matmul_perf_mode.none, matmul_perf_mode.double_row):
        raise UnsupportedError(f"nisa.nc_matmul(perf_mode={perf_mode!r})")
    isa.nc_matmul(out, stationary, moving, is_transpose, tile_position, tile_size,
                  "double_row" if perf_mode == matmul_perf_mode.double_row else None, accumulate)


@instruction
def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """Partition <-> free transpose: Tensor engine (SBUF -> PSUM, <= 128 x 128) or Vector (<= 32 x 32)."""
    isa.nc_transpose(Dst(dst, "nisa.nc_transpose"), data, engine)


# ---------------------------------------------------------------------------------- Scalar engine

@instruction
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    """``dst = op(data * scale + bias)``; with ``reduce_res``, also its reduction along the free dims."""
    isa.activation(Dst(dst, "nisa.activation"), op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)


@instruction
def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    isa.activation(Dst(dst, "nisa.activation"), op, data, bias, scale, reduce_op, reduce_res,
                   reduce_cmd.reset_reduce)


@instruction
def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on the Scalar engine (NeuronCore-v4 and newer), with an
    optional free-axis reduction into the Scalar engine's accumulators (shared with activation)."""
    isa.activate2(Dst(dst, "nisa.activate2"), op, data, imm0, imm1, op0, op1, relu_param, reverse0, reverse1,
                  reduce_op, reduce_res, reduce_cmd)


# ---------------------------------------------------------------------------------- Vector engine

@instruction
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """``dst = op(data1, data2)``. Arithmetic on float types is fp32 math; when every tile is int32 or
    uint32 and none is in PSUM, the default engine is GpSimd's native 32-bit integer arithmetic (the
    page: exact for all 32-bit values; sums and products wrap), ``engine=vector`` keeping fp32."""
    isa.tensor_tensor(Dst(dst, "nisa.tensor_tensor"), data1, data2, op, engine)


@instruction
def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    isa.tensor_scalar(Dst(dst, "nisa.tensor_scalar"), data, op0, operand0, reverse0, op1, operand1, reverse1, engine)


@instruction
def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    isa.scalar_tensor_tensor(Dst(dst, "nisa.scalar_tensor_tensor"), data, op0, operand0, op1, operand1, reverse0,
                             reverse1)


@instruction
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data <op0> operand0`` and the Vector accumulators fold its free-axis ``reduce_op``
    (``load_reduce`` starts from ``reduce_init``); ``reduce_res`` receives them, negated with
    ``reduce_res_negate`` (the registers keep the sign)."""
    isa.tensor_scalar_reduce(Dst(dst, "nisa.tensor_scalar_reduce"), data, op0, operand0, reduce_op, reduce_res,
                             reverse0, reduce_cmd, reduce_init, reduce_res_negate)


@instruction
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    isa.tensor_reduce(Dst(dst, "nisa.tensor_reduce"), op, data, axis, negate, keepdims)


@instruction
def tensor_partition_reduce(dst, op, data, name=None):
    isa.tensor_partition_reduce(Dst(dst, "nisa.tensor_partition_reduce"), op, data)


@instruction
def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    isa.tensor_tensor_scan(Dst(dst, "nisa.tensor_tensor_scan"), data0, data1, initial, op0, op1, reverse0, reverse1)


@instruction
def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """Copy with a cast to dst's dtype (bit-exact when the dtypes agree)."""
    isa.tensor_copy(Dst(dst, "nisa.tensor_copy"), src, engine)


@instruction
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    isa.tensor_copy_predicated(Dst(dst, "nisa.tensor_copy_predicated"), src, predicate, reverse_pred)


@instruction
def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=None, name=None):
    """Keep element ``j`` of partition ``p`` where ``comp_op0(j + range_start, bound0[p])`` and
    ``comp_op1(j + range_start, bound1[p])``, else ``on_false_value`` (default fp32 min); the kept
    values' free-axis reduction (default max) goes to the Vector engine's accumulators (trn2+)."""
    isa.range_select(Dst(dst, "nisa.range_select"), on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd,
                     reduce_res, reduce_op, range_start, on_false_value)


@instruction
def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` (a scalar or a (P, 1) ``on_false``), with the
    result's free-axis reduction (default max) into the Vector engine's accumulators."""
    isa.select_reduce(Dst(dst, "nisa.select_reduce"), predicate, on_true, on_false, reduce_res, reduce_cmd,
                      reduce_op, reverse_pred)


@instruction
def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on the Vector engine (NeuronCore-v4 and newer); under
    ``reduce_cmd`` the row sums go into the Vector engine's accumulators (reset_reduce: from 0,
    reduce: on top, load_reduce: from ``reduce_init``), which ``reduce_res`` receives."""
    isa.exponential(Dst(dst, "nisa.exponential"), src, max_value, reduce_res, reduce_cmd, reduce_init)


@instruction
def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """``dst[:, i] = acc = op1(op0(src[:, i], imm0), acc)`` along the free axis on the Vector engine,
    the accumulator starting per ``reduce_cmd`` (reset_reduce: op1's identity, reduce: where the last
    Vector-engine accumulation left it, load_reduce: ``imm1``)."""
    isa.tensor_scalar_cumulative(Dst(dst, "nisa.tensor_scalar_cumulative"), src, op0, op1, imm0, imm1, reduce_cmd)


@instruction
def reciprocal(dst, data, name=None):
    isa.reciprocal(Dst(dst, "nisa.reciprocal"), data)


@instruction
def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with ``value`` (an int for integer dst; only 0 for packed types)."""
    isa.memset(Dst(dst, "nisa.memset"), value, engine=engine)


@instruction
def bn_stats(dst, data, name=None):
    isa.bn_stats(Dst(dst, "nisa.bn_stats"), data)


@instruction
def bn_aggr(dst, data, name=None):
    isa.bn_aggr(Dst(dst, "nisa.bn_aggr"), data)


@instruction
def max8(dst, src, name=None):
    """The 8 largest values per partition, descending."""
    isa.max8(Dst(dst, "nisa.max8"), src)


@instruction
def nc_find_index8(dst, data, vals, name=None):
    """Per partition, the first index of each of 8 values in ``data``; all-ones when absent."""
    isa.nc_find_index8(Dst(dst, "nisa.nc_find_index8"), data, vals)


@instruction
def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of 8 values with ``imm`` (duplicates matched in reverse)."""
    isa.nc_match_replace8(Dst(dst, "nisa.nc_match_replace8"), data, vals, imm, dst_idx)


# ---------------------------------------------------------------------------------- GpSimd engine

@instruction
def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Per GpSimd core (partitions 0, 16, ..., 112 only; other partitions of dst untouched): the
    positions of src's nonzero elements plus ``index_offset``, then ``padding_val``, then the count
    (dst has one more free element than src). trn2 and later."""
    isa.nonzero_with_count(Dst(dst, "nisa.nonzero_with_count"), src, index_offset, padding_val)


@instruction
def nc_n_gather(dst, data, indices, name=None):
    """Per partition, ``dst = data.flatten()[indices]`` (free dims flattened; uint32 indices; all SBUF;
    dst has data's dtype)."""
    isa.nc_n_gather(Dst(dst, "nisa.nc_n_gather"), data, indices)


@instruction
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, i...] = offset + p * channel_multiplier + sum(step_k * i_k)`` over a [[step, num], ...]
    pattern (int32 values, cast to dst's dtype)."""
    isa.iota(Dst(dst, "nisa.iota"), lambda p: isa.affine_values(p, pattern, offset, channel_multiplier, "nisa.iota"))


@instruction
def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0,
                  name=None):
    """``dst = cmp_op(affine value, 0) ? on_true_tile : on_false_value`` (default comparison: equal)."""
    isa.affine_select(Dst(dst, "nisa.affine_select"), lambda p: isa.affine_values(
        p, pattern, offset, channel_multiplier, "nisa.affine_select"), on_true_tile, on_false_value, cmp_op)
