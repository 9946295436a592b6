"""The compute engines' instructions of the current API (Tensor, Scalar, Vector, GpSimd engines):
destination passing, each writing ``dst``; the semantics are ``core/instructions.py``'s."""

from __future__ import annotations

import warnings

import numpy as np

from ....core import alu, instructions, memory, trace
from ....core import dtypes as dt
from ....core.errors import (
    KernelUsageError,
    MemorySpaceError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from ....core.run import active_config, violation
from . import constants
from .constants import (
    engine,
    matmul_perf_mode,
    reduce_cmd,
)
from .instruction import instruction
from .operands import _accumulate, _dst, _no_packed, _on_chip, _require_v4, _result_buffer, _touch, _write


@instruction
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    """``dst (+)= stationary.T @ moving`` into PSUM. ``accumulate=None``: the first write to a PSUM
    location overwrites it, later ones add (as the compiler decides)."""
    api = "nisa.nc_matmul"
    _dst(dst, api)
    if dst.buffer is not memory.psum:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'psum', but got a "
                               f"tensor in '{dst.buffer.space}' instead")
    # NeuronCore-v2 has no transpose mode: is_transpose only labels the instruction for the profiler
    # (nc_matmul page), so the product against the identity is an ordinary matmul, NaN/Inf spreading.
    if is_transpose and trace.listening:
        trace.engine(instructions.TENSOR, transpose=True)  # the profile's transpose FLOPs, as neuron-profile's
    if is_transpose and active_config().nc_version >= 3:
        _pe_transpose(dst, stationary, moving, api)
        return
    instructions.check_pe_tiling(api, tile_position, tile_size, stationary, moving)
    _no_packed(api, stationary, moving)
    allowed_dst = (dt.float32, dt.bfloat16) if active_config().nc_version >= 4 else (dt.float32,)
    if dst.dtype not in allowed_dst:
        raise KernelUsageError(f"{api}: dst '{dst.name}' is {dst.dtype}; the product lands in a float32 PSUM tile "
                               f"(bfloat16 too from NeuronCore-v4); target is {active_config().target}")
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        if alu.is_tile(operand) and operand.dtype not in _PE_DTYPES:
            raise KernelUsageError(f"{api}: {arg} is {operand.dtype}; the Tensor engine multiplies float8, "
                                   f"bfloat16, float16 and (t)float32 tiles")
    _ocp_fp8_rules(api, stationary, moving)
    fmax = 4096 if active_config().nc_version >= 4 else 512
    if perf_mode == matmul_perf_mode.double_row:
        values = _double_row(api, stationary, moving, fmax, tile_position or tile_size)
    elif perf_mode == matmul_perf_mode.none:
        values = instructions.matmul(api, stationary, moving, moving_fmax=fmax, flatten_free=True)
    else:
        raise UnsupportedError(f"{api}(perf_mode={perf_mode!r})")
    _accumulate(dst, values, accumulate, api)


_FP8 = (dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn)
_PE_DTYPES = (*_FP8, dt.bfloat16, dt.float16, dt.float32)  # the nc_matmul page's operand types


def _ocp_fp8_rules(api: str, *operands) -> None:
    """OCP float8_e4m3fn operands from NeuronCore-v4 only, never beside legacy float8_e4m3 (nc_matmul
    page; 2.32 release notes)."""
    dtypes = {t.dtype for t in operands if alu.is_tile(t)}
    if dt.float8_e4m3fn in dtypes and active_config().nc_version < 4:
        raise KernelUsageError(f"{api}: float8_e4m3fn (OCP FP8) operands need NeuronCore-v4 (trn3); target is "
                               f"{active_config().target}")
    if {dt.float8_e4m3, dt.float8_e4m3fn} <= dtypes:
        raise KernelUsageError(f"{api}: legacy float8_e4m3 and OCP float8_e4m3fn cannot be mixed in one matmul")


def _double_row(api: str, stationary, moving, fmax: int, tiled) -> np.ndarray:
    """FP8 double-row mode (trn2+): operands [K, 2, F] hold a contraction of 2K rows."""
    if active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: perf_mode=double_row needs trn2 or later, target is {active_config().target}")
    if tiled:
        raise KernelUsageError(f"{api}: double_row cannot be combined with PE tiling")
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        instructions.require_tile_operand(operand, api, arg)
        instructions.require_sbuf(operand, api, arg)
        if operand.dtype not in _FP8:
            raise KernelUsageError(f"{api}: double_row multiplies fp8 operands, got {arg} in {operand.dtype}")
        if operand.ndim != 3 or operand.shape[1] != 2:
            raise KernelUsageError(f"{api}: double_row operands are [K, 2, F], got {arg} of shape "
                                   f"{list(operand.shape)}")
    s = dt.to_f32(memory.read(stationary, api, "stationary"))
    m = dt.to_f32(memory.read(moving, api, "moving"))
    if s.shape[0] != m.shape[0]:
        raise KernelUsageError(f"{api}: contraction sizes differ: {list(s.shape)} vs {list(m.shape)}")
    for size, limit, what in ((s.shape[0], 128, "contraction (partition) size"),
                              (s.shape[2], 128, "stationary free size"), (m.shape[2], fmax, "moving free size")):
        if size > limit:
            violation(TileLimitError(f"{api}: {what} {size} exceeds the Tensor engine limit of {limit}"))
    return s.reshape(-1, s.shape[2]).T @ m.reshape(-1, m.shape[2])


def _pe_transpose(dst, stationary, moving, api: str) -> None:
    """Transpose mode (trn2 and later): ``moving`` is an identity, so ``dst = stationary.T``, bit-exact
    (NaN and Inf pass through), in dst's dtype, overwriting ``dst``."""
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        instructions.require_tile_operand(operand, api, arg)
        instructions.require_sbuf(operand, api, arg)
    s = memory.read(stationary, api, "stationary")
    m = memory.read(moving, api, "moving")
    if s.ndim != 2 or m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != s.shape[0]:
        raise KernelUsageError(f"{api}(is_transpose=True): moving must be a square identity over stationary's "
                               f"{s.shape[0]} partitions, got stationary {list(s.shape)}, moving {list(m.shape)}")
    if not np.array_equal(dt.to_f32(m), np.eye(m.shape[0], dtype=np.float32)):
        raise UnsupportedError(f"{api}(is_transpose=True) with a moving operand that is not an identity")
    _write(dst, instructions.pe_transpose(s), api)


@instruction
def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """Partition <-> free transpose: Tensor engine (SBUF -> PSUM, <= 128 x 128) or Vector (<= 32 x 32)."""
    api = "nisa.nc_transpose"
    _dst(dst, api)
    _on_chip(data, api, "data")
    if dst.dtype != data.dtype:  # the page: "The output dst tile must have the same data type as that of data."
        raise KernelUsageError(f"{api}: dst must have the same dtype as data; got data '{data.name}' in {data.dtype} "
                               f"and dst '{dst.name}' in {dst.dtype} (transpose first, then cast with "
                               f"nisa.tensor_copy)")
    values, on_vector = instructions.transpose(api, data, int(engine))
    if not on_vector and dst.buffer is not memory.psum:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' on the Tensor engine to be in 'psum', got "
                               f"'{dst.buffer.space}'")
    _write(dst, values, api)


# ---------------------------------------------------------------------------------- Scalar engine

def _reduce_into(reduce_res, reduce_op, values, api: str, cmd=reduce_cmd.reset_reduce, engine_name="scalar"):
    """The engine's accumulator registers take ``cmd`` (``instructions.accumulate``); ``reduce_res``
    then receives them."""
    registers = instructions.accumulate(api, reduce_op, values, cmd, engine_name)
    if reduce_res is not None:
        _dst(reduce_res, api)
        _write(reduce_res, registers, api)


@instruction
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    """``dst = op(data * scale + bias)``; with ``reduce_res``, also its reduction along the free dims."""
    api = "nisa.activation"
    _dst(dst, api)
    _on_chip(data, api, "data")
    if bias is not None and not alu.is_tile(bias) and active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: bias must be a (P, 1) tensor on {active_config().target}")
    _float32_operand(api, "scale", scale)
    values = instructions.activation(api, op, data, bias, scale)
    _write(dst, values, api)
    registers = instructions.activation_accumulate(api, reduce_op, values, reduce_cmd, reduce_res)
    if reduce_res is not None:
        _dst(reduce_res, api)
        _write(reduce_res, registers, api)


@instruction
def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=constants.reduce_cmd.reset_reduce)


_ACTIVATE2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")


@instruction
def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on the Scalar engine (NeuronCore-v4 and newer), with an
    optional free-axis reduction into the Scalar engine's accumulators (shared with activation)."""
    api = "nisa.activate2"
    _require_v4(api)
    _dst(dst, api)
    _on_chip(data, api, "data")
    _no_packed(api, data)
    if reduce_op is not None and instructions.op_name(reduce_op) not in _ACTIVATE2_REDUCE:
        raise KernelUsageError(f"{api}: reduce_op must be one of nl.{', nl.'.join(_ACTIVATE2_REDUCE)}, got "
                               f"{getattr(reduce_op, '__name__', reduce_op)!r}")
    values = instructions.activate2(api, op, data, imm0, imm1, op0, op1, relu_param, reverse0, reverse1)
    _write(dst, values, api)
    if reduce_res is not None or reduce_cmd != constants.reduce_cmd.idle:
        _reduce_into(reduce_res, reduce_op, values, api, reduce_cmd)


# ---------------------------------------------------------------------------------- Vector engine

@instruction
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """``dst = op(data1, data2)``. Arithmetic on float types is fp32 math; when every tile is int32 or
    uint32 and none is in PSUM, the default engine is GpSimd's native 32-bit integer arithmetic (the
    page: exact for all 32-bit values; sums and products wrap), ``engine=vector`` keeping fp32."""
    api = "nisa.tensor_tensor"
    _dst(dst, api)
    _no_packed(api, data1, data2)
    if instructions.op_name(op) == "power":  # checked before dst may hold the result (the inputs: in the core)
        instructions.require_power_operand(dst, api, "dst")
    if instructions.gpsimd_integer(engine, op, (dst, data1, data2), dst.dtype):
        _write(dst, instructions.integer_tensor_tensor(api, data1, data2, op, dst.dtype), api)
        return
    values, _ = instructions.tensor_tensor(api, data1, data2, op, int(engine), out=_result_buffer(dst, engine))
    instructions.check_engine_access(dst, int(engine), api, "dst")
    _write(dst, values, api)


# The operator pairs the trn2 Scalar engine runs (nisa.tensor_scalar page).
_TRN2_SCALAR_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


@instruction
def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    api = "nisa.tensor_scalar"
    _dst(dst, api)
    _on_chip(data, api, "data")
    for op, operand, arg in ((op0, operand0, "operand0"), (op1, operand1, "operand1")):
        if (op is not None and alu.is_tile(operand) and operand.dtype.kind in "iu"
                and instructions.op_name(op) not in alu.BITWISE):
            raise KernelUsageError(f"{api}: {arg} of an arithmetic operator must be float32, got an {operand.dtype} "
                                   f"tile (cast it with nisa.tensor_copy first)")
        if op is not None and instructions.op_name(op) not in alu.BITWISE:
            _float32_operand(api, arg, operand)
    if int(engine) == constants.engine.scalar and active_config().nc_version == 3:
        pair = (instructions.op_name(op0), None if op1 is None else instructions.op_name(op1))
        if pair not in _TRN2_SCALAR_PAIRS or reverse0 or reverse1:
            raise KernelUsageError(f"{api}: the Scalar engine on trn2 takes only op0=multiply with op1=add or "
                                   f"none, or op0=add with no op1 (unreversed); got op0={pair[0]}, op1={pair[1]}")
    values = instructions.tensor_scalar(api, data, op0, operand0, reverse0, op1, operand1, reverse1, int(engine),
                                        out=_result_buffer(dst, engine))
    instructions.check_engine_access(dst, int(engine), api, "dst")
    _write(dst, values, api)


@instruction
def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    api = "nisa.scalar_tensor_tensor"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _on_chip(operand1, api, "operand1")
    _write(dst, instructions.scalar_tensor_tensor(api, data, op0, operand0, op1, operand1, reverse0, reverse1,
                                                  out=_result_buffer(dst, engine.unknown)), api)


_TENSOR_SCALAR_REDUCE = ("add", "multiply", "maximum", "minimum")


@instruction
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data <op0> operand0`` and the Vector accumulators fold its free-axis ``reduce_op``
    (``load_reduce`` starts from ``reduce_init``); ``reduce_res`` receives them, negated with
    ``reduce_res_negate`` (the registers keep the sign)."""
    api = "nisa.tensor_scalar_reduce"
    _dst(dst, api)
    _on_chip(data, api, "data")
    if reverse0:  # the page: "reverse0: (not supported yet) ... <-- currently not supported yet."
        raise KernelUsageError(f"{api}: reverse0=True is not supported yet (operand0 is always the rhs of op0); got "
                               f"reverse0={reverse0!r} (use nisa.tensor_scalar with reverse0 and a separate "
                               f"reduction)")
    if instructions.op_name(reduce_op) not in _TENSOR_SCALAR_REDUCE:
        raise KernelUsageError(f"{api}: reduce_op must be one of nl.add, nl.multiply, nl.maximum, nl.minimum; got "
                               f"{getattr(reduce_op, '__name__', reduce_op)!r}")
    loads = reduce_cmd == constants.reduce_cmd.load_reduce
    if loads != (reduce_init is not None):
        raise KernelUsageError(f"{api}: reduce_init must be given exactly when reduce_cmd is load_reduce (got "
                               f"reduce_cmd={reduce_cmd!r}, reduce_init={'set' if reduce_init is not None else None})")
    values = instructions.tensor_scalar(api, data, op0, operand0, reverse0)
    _write(dst, values, api)
    registers = instructions.accumulate(api, reduce_op, values, reduce_cmd, "vector", initial=reduce_init)
    if reduce_res is not None:
        _dst(reduce_res, api)
        _write(reduce_res, -registers if reduce_res_negate else registers, api)


@instruction
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    api = "nisa.tensor_reduce"
    _dst(dst, api)
    _on_chip(data, api, "data")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % data.ndim for a in axes)
    if 0 in axes:
        raise KernelUsageError(f"{api}: axis 0 is the partition dimension; reduce free axes (or use "
                               f"nisa.tensor_partition_reduce)")
    trailing = tuple(range(data.ndim - len(set(axes)), data.ndim))
    if tuple(sorted(set(axes))) != trailing:
        # The page: "The reduction axes must be the last contiguous free dimension(s) of the tile, ending
        # at the final dimension."
        raise KernelUsageError(f"{api}: the reduction axes must be the last contiguous free dimension(s), ending "
                               f"at the final one (for data of shape {list(data.shape)}: {trailing}); got "
                               f"axis={axis!r}")
    _write(dst, instructions.tensor_reduce(api, op, data, axes, negate, keepdims=True), api)


@instruction
def tensor_partition_reduce(dst, op, data, name=None):
    api = "nisa.tensor_partition_reduce"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.tensor_partition_reduce(api, op, data), api)


@instruction
def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    api = "nisa.tensor_tensor_scan"
    _dst(dst, api)
    _on_chip(data0, api, "data0")
    _on_chip(data1, api, "data1")
    _write(dst, instructions.tensor_tensor_scan(api, data0, data1, initial, op0, op1, reverse0, reverse1), api)


@instruction
def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """Copy with a cast to dst's dtype (bit-exact when the dtypes agree)."""
    api = "nisa.tensor_copy"
    _dst(dst, api)
    _on_chip(src, api, "src")
    instructions.check_engine_access(src, int(engine), api, "src")
    instructions.check_engine_access(dst, int(engine), api, "dst")
    if int(engine) == constants.engine.scalar and active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: the Scalar engine cannot tensor_copy on {active_config().target}; use "
                               f"nisa.activation(op=nl.copy)")
    _write(dst, memory.read(src, api, "src"), api)


@instruction
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    api = "nisa.tensor_copy_predicated"
    _dst(dst, api)
    pred = memory.read(_on_chip(predicate, api, "predicate"), api, "predicate")
    instructions.require_predicate(pred, ("uint8", "uint16", "uint32"), api)
    if src is not None and alu.is_tile(src) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: src ({src.dtype}) and dst ({dst.dtype}) must have the same dtype")
    values = memory.value_of(src, api, "src")
    _write(dst, instructions.copy_predicated(api, pred, values, dst.data, reverse_pred), api)


@instruction
def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=None, name=None):
    """Keep element ``j`` of partition ``p`` where ``comp_op0(j + range_start, bound0[p])`` and
    ``comp_op1(j + range_start, bound1[p])``, else ``on_false_value`` (default fp32 min); the kept
    values' free-axis reduction (default max) goes to the Vector engine's accumulators (trn2+)."""
    api = "nisa.range_select"
    _dst(dst, api)
    if active_config().nc_version < 3:
        raise KernelUsageError(f"{api} needs trn2 or later, target is {active_config().target}")
    values = memory.read(_on_chip(on_true_tile, api, "on_true_tile"), api, "on_true_tile")
    false_value = instructions.FP32_MIN if on_false_value is None else on_false_value
    result = instructions.range_select(api, values, comp_op0, comp_op1, bound0, bound1, range_start, false_value)
    _write(dst, result, api)
    _reduce_into(reduce_res, reduce_op if reduce_op is not None else np.maximum, result, api, reduce_cmd, "vector")


@instruction
def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_op=None,
                  reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` (a scalar or a (P, 1) ``on_false``), with the
    result's free-axis reduction (default max) into the Vector engine's accumulators."""
    api = "nisa.select_reduce"
    _dst(dst, api)
    pred = memory.read(_on_chip(predicate, api, "predicate"), api, "predicate")
    instructions.require_predicate(pred, ("int8", "uint8", "int16", "uint16"), api)
    instructions.check_select_reduce_dtypes(api, _on_chip(on_true, api, "on_true"),
                                            reduce_res if alu.is_tile(reduce_res) else None)
    values = dt.to_f32(memory.read(on_true, api, "on_true"))
    if on_true.buffer is memory.psum and predicate.buffer is memory.psum:
        raise MemorySpaceError(f"{api}: predicate and on_true cannot both be in PSUM")
    result = instructions.select(api, pred, values, on_false, reverse_pred)
    _write(dst, result, api)
    if reduce_res is not None or reduce_cmd != constants.reduce_cmd.idle:
        _reduce_into(reduce_res, reduce_op if reduce_op is not None else np.maximum, result, api, reduce_cmd,
                     "vector")


_EXP_DST = (dt.float8_e4m3, dt.float8_e5m2, dt.float16, dt.bfloat16, dt.float32, dt.int8, dt.int16, dt.int32,
            dt.uint8, dt.uint16)
_EXP_REDUCE_RES = (dt.float8_e4m3, dt.float8_e5m2, dt.float16, dt.bfloat16, dt.float32)


@instruction
def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on the Vector engine (NeuronCore-v4 and newer); under
    ``reduce_cmd`` the row sums go into the Vector engine's accumulators (reset_reduce: from 0,
    reduce: on top, load_reduce: from ``reduce_init``), which ``reduce_res`` receives."""
    api = "nisa.exponential"
    _require_v4(api)
    _dst(dst, api)
    _on_chip(src, api, "src")
    _no_packed(api, src)
    if dst.dtype not in _EXP_DST:
        raise KernelUsageError(f"{api}: dst dtype must be one of {', '.join(map(str, _EXP_DST))}, got {dst.dtype}")
    if reduce_res is not None and reduce_res.dtype not in _EXP_REDUCE_RES:
        raise KernelUsageError(f"{api}: reduce_res dtype must be one of {', '.join(map(str, _EXP_REDUCE_RES))}, got "
                               f"{reduce_res.dtype}")
    loads = reduce_cmd == constants.reduce_cmd.load_reduce
    if not loads and (alu.is_tile(reduce_init) or float(reduce_init) != 0.0):
        raise KernelUsageError(f"{api}: reduce_init is used only with reduce_cmd=load_reduce; leave it 0.0 with "
                               f"{reduce_cmd!r}")
    if reduce_cmd == constants.reduce_cmd.reset:
        raise KernelUsageError(f"{api}: reduce_cmd must be idle, reset_reduce, reduce or load_reduce, got "
                               f"{reduce_cmd!r}")
    values = instructions.exponential(api, src, max_value)
    _write(dst, values, api)
    if reduce_res is not None or reduce_cmd != constants.reduce_cmd.idle:
        registers = instructions.accumulate(api, np.add, values, reduce_cmd, "vector",
                                            initial=reduce_init if loads else None)
        if reduce_res is not None:
            _dst(reduce_res, api)
            _write(reduce_res, registers, api)


_CUMULATIVE_DTYPES = (dt.bfloat16, dt.float16, dt.float32, dt.float8_e4m3, dt.float8_e5m2, dt.uint8, dt.uint16,
                      dt.int8, dt.int16)


@instruction
def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """``dst[:, i] = acc = op1(op0(src[:, i], imm0), acc)`` along the free axis on the Vector engine,
    the accumulator starting per ``reduce_cmd`` (reset_reduce: op1's identity, reduce: where the last
    Vector-engine accumulation left it, load_reduce: ``imm1``)."""
    api = "nisa.tensor_scalar_cumulative"
    _dst(dst, api)
    _on_chip(src, api, "src")
    for x, arg in ((src, "src"), (dst, "dst")):
        if x.dtype not in _CUMULATIVE_DTYPES:
            raise KernelUsageError(f"{api}: {arg} dtype must be one of {', '.join(map(str, _CUMULATIVE_DTYPES))}, "
                                   f"got {x.dtype}")
    if trace.listening:
        trace.engine(instructions.VECTOR)
    values = memory.read(src, api, "src")
    _write(dst, instructions.tensor_scalar_cumulative(api, values, op0, imm0, op1, imm1, reduce_cmd), api)


@instruction
def reciprocal(dst, data, name=None):
    api = "nisa.reciprocal"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.reciprocal(api, data, out=_result_buffer(dst, engine.unknown)), api)


@instruction
def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with ``value`` (an int for integer dst; only 0 for packed types)."""
    api = "nisa.memset"
    _dst(dst, api)
    instructions.check_engine_access(dst, int(engine), api, "dst")
    if dst.dtype.names:
        if value != 0:
            raise KernelUsageError(f"{api}: packed dtype {dst.dtype.names[0]} can only be set to 0, got {value!r}")
        _touch(dst)
        dst.data[...] = np.zeros((), dst.dtype)
        return
    if dst.dtype.kind in "iu" and isinstance(value, (float, np.floating)):
        if not float(value).is_integer():
            raise KernelUsageError(f"{api}: value {value!r} does not match the integer dtype {dst.dtype} of dst "
                                   f"'{dst.name}' (pass an int)")
        _float_memset_into_int(api, value, dst)
    _write(dst, np.asarray(value, np.float64 if dt.is_float(dst.dtype) else np.int64), api)


def _float32_operand(api: str, arg: str, operand) -> None:
    """The nisa.tensor_scalar page: "the operand0 and operand1 (if used) must be float32"; the nisa.activation
    page: "The scale parameter must have a float32 data type". A half-precision tile there warns and is read
    as float32, not refused: AWS's kernel library (@d2ad3a5) gives these operands the dtype of its callers'
    tensors (qkv_tkg's in_scale_tile and output_projection_tkg's input_scale_sb take the scale input's dtype;
    the bwmm MoE kernels pass expert_affinity tiles as operand0), so kernels that ran on devices can reach
    them with bfloat16."""
    if alu.is_tile(operand) and dt.is_float(operand.dtype) and operand.dtype != np.float32:
        warnings.warn(f"{user_site()}: {api}: {arg} must be a float32 tile per the API page, got {operand.dtype} "
                      f"'{operand.name}' (copy it to a float32 tile with nisa.tensor_copy)", SimulatorWarning,
                      stacklevel=3)


def _float_memset_into_int(api: str, value, dst) -> None:
    """NKI 0.3.0 release notes, breaking changes: "nisa.memset - Enforces strict type matching between value and
    destination dtype. ... Kernels that pass float values to integer-typed tensors (e.g., value=2.0 instead of
    value=2) will now raise an error at compile time." A warning, not an error, for a float holding an integer:
    AWS's kernel library (@d2ad3a5) clears integer tiles with value=0.0 in kernels it tests: moe_tkg's
    gate_up_projection_mx (its uint8 MX scale tile, nisa.memset(dst=scale_sb[...], value=0.0, ...)) and
    core/utils/cross_partition_copy.py (uint32 index tiles of router_topk, nisa.memset(dst=temp_src, value=0.0))."""
    warnings.warn(f"{user_site()}: {api}: value {value!r} is a float but dst '{dst.name}' is {dst.dtype}; the NKI "
                  f"0.3.0 release notes make a float value for an integer dst a compile error (pass "
                  f"{int(value)!r})", SimulatorWarning, stacklevel=4)


@instruction
def bn_stats(dst, data, name=None):
    api = "nisa.bn_stats"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.bn_stats(api, data)[0], api)


@instruction
def bn_aggr(dst, data, name=None):
    api = "nisa.bn_aggr"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.bn_aggr(api, data), api)


@instruction
def max8(dst, src, name=None):
    """The 8 largest values per partition, descending."""
    api = "nisa.max8"
    _dst(dst, api)
    _write(dst, instructions.max8(api, memory.read(_on_chip(src, api, "src"), api, "src")), api)


def _write_indices(dst, index: np.ndarray) -> None:
    """uint32 positions into an integer dst as they are (a uint16 dst keeps the low bits: 0xFFFF absent)."""
    _touch(dst)
    dst.data[...] = index.reshape(dst.shape).astype(dst.dtype)


@instruction
def nc_find_index8(dst, data, vals, name=None):
    """Per partition, the first index of each of 8 values in ``data``; all-ones when absent."""
    api = "nisa.nc_find_index8"
    _dst(dst, api)
    if dst.dtype not in (dt.uint16, dt.uint32):
        # The page: "The output will contain exactly 8 elements per partition and will be uint16 or uint32 type."
        raise KernelUsageError(f"{api}: dst holds indices, so it must be uint16 or uint32; got dst '{dst.name}' in "
                               f"{dst.dtype}")
    index = instructions.find_index8(api, memory.read(_on_chip(data, api, "data"), api, "data"),
                                     memory.read(_on_chip(vals, api, "vals"), api, "vals"))
    _write_indices(dst, index)


@instruction
def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """Replace the first occurrence of each of 8 values with ``imm`` (duplicates matched in reverse)."""
    api = "nisa.nc_match_replace8"
    _dst(dst, api)
    values, index = instructions.match_replace8(api, memory.read(_on_chip(data, api, "data"), api, "data"),
                                                memory.read(_on_chip(vals, api, "vals"), api, "vals"), imm)
    _write(dst, values, api)
    if dst_idx is not None:
        _dst(dst_idx, api)
        _write_indices(dst_idx, index)


# ---------------------------------------------------------------------------------- GpSimd engine

@instruction
def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """Per GpSimd core (partitions 0, 16, ..., 112 only; other partitions of dst untouched): the
    positions of src's nonzero elements plus ``index_offset``, then ``padding_val``, then the count
    (dst has one more free element than src). trn2 and later."""
    api = "nisa.nonzero_with_count"
    _dst(dst, api)
    if active_config().nc_version < 3:
        raise KernelUsageError(f"{api} needs trn2 or later, target is {active_config().target}")
    for x, arg in ((src, "src"), (dst, "dst")):
        if x.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', got "
                                   f"'{x.buffer.space}'")
    values = memory.read(src, api, "src").reshape(src.shape[0], -1)
    if dst.shape[0] != values.shape[0] or dst.size // dst.shape[0] != values.shape[1] + 1:
        raise KernelUsageError(f"{api}: dst {list(dst.shape)} must have src's partitions and one more free "
                               f"element than src {list(values.shape)}")
    result = np.array(dst.data).reshape(values.shape[0], -1).astype(np.float64)
    for p in range(0, values.shape[0], 16):
        found = np.flatnonzero(values[p] != 0)
        row = np.full(values.shape[1] + 1, float(padding_val))
        row[:found.size] = found + int(index_offset)
        row[-1] = found.size
        result[p] = row
    _write(dst, result.reshape(dst.shape), api)


@instruction
def nc_n_gather(dst, data, indices, name=None):
    """Per partition, ``dst = data.flatten()[indices]`` (free dims flattened; uint32 indices; all SBUF;
    dst has data's dtype)."""
    api = "nisa.nc_n_gather"
    _dst(dst, api)
    for x, arg in ((data, "data"), (indices, "indices"), (dst, "dst")):
        _on_chip(x, api, arg)
        if x.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', got "
                                   f"'{x.buffer.space}'")
    if indices.dtype != dt.uint32:
        raise KernelUsageError(f"{api}: indices must be uint32, got {indices.dtype}")
    if dst.dtype != data.dtype:
        raise KernelUsageError(f"{api}: dst ({dst.dtype}) must have data's dtype ({data.dtype})")
    values = memory.read(data, api, "data")
    where = memory.read(indices, api, "indices")
    if dst.shape[0] != values.shape[0] or where.size != dst.size:
        raise KernelUsageError(f"{api}: data {list(data.shape)}, indices {list(indices.shape)} and dst "
                               f"{list(dst.shape)} must share partitions, indices giving dst's elements")
    _write(dst, instructions.gather_flattened(api, values, where, data.name), api)


@instruction
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, i...] = offset + p * channel_multiplier + sum(step_k * i_k)`` over a [[step, num], ...]
    pattern (int32 values, cast to dst's dtype)."""
    api = "nisa.iota"
    _dst(dst, api)
    if dst.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'sbuf', got "
                               f"'{dst.buffer.space}'")
    _write(dst, _affine(dst.shape[0], pattern, offset, channel_multiplier, api), api)


def _affine(partitions, pattern, offset, channel_multiplier, api) -> np.ndarray:
    pairs = [(int(step), int(num)) for step, num in pattern]
    if len(pairs) > 4:
        raise KernelUsageError(f"{api}: access patterns have at most 4 dims, got {len(pairs)}")
    values = np.int64(offset) + np.arange(partitions, dtype=np.int64).reshape(-1, *([1] * len(pairs))) * \
        int(channel_multiplier)
    for k, (step, num) in enumerate(pairs):
        shape = [1] * (len(pairs) + 1)
        shape[k + 1] = num
        values = values + np.arange(num, dtype=np.int64).reshape(shape) * step
    return values.astype(np.int32).astype(np.float64)


@instruction
def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0,
                  name=None):
    """``dst = cmp_op(affine value, 0) ? on_true_tile : on_false_value`` (default comparison: equal)."""
    api = "nisa.affine_select"
    _dst(dst, api)
    if dst.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'sbuf'")
    _on_chip(on_true_tile, api, "on_true_tile")
    if on_true_tile.buffer is not memory.sbuf:
        # The 2.32 page: "The input on_true_tile must also be in SBUF." (The legacy page names no such rule
        # and the legacy front end accepts a PSUM tile, as public legacy kernels pass one.)
        raise MemorySpaceError(f"Expected operand 'on_true_tile' of '{api}' to be in address space 'sbuf', but got "
                               f"a tensor in '{on_true_tile.buffer.space}' instead (tensor '{on_true_tile.name}'; "
                               f"copy it to SBUF with nisa.tensor_copy first)")
    affine = _affine(dst.shape[0], pattern, offset, channel_multiplier, api)
    cmp = alu.COMPARE["equal"] if cmp_op is None else instructions.alu_op(cmp_op, api)[1]
    _write(dst, instructions.affine_select(api, cmp(affine, 0), on_true_tile, on_false_value), api)
