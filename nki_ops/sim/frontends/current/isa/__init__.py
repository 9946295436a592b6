"""``nki.isa`` (``nisa``) of the current API: destination passing. Each instruction writes ``dst``
(its dtype is the output dtype) and returns nothing; the semantics are the core instructions the
legacy front end uses too. Unknown keyword arguments are errors.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings

import numpy as np

from ....core import alu, instructions, memory, trace
from ....core import dtypes as dt
from ....core.errors import (
    KernelUsageError,
    MemorySpaceError,
    NkiValidationError,
    OutOfBoundsError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from ....core.run import active_config, current_run, require_values, violation
from . import constants
from .constants import (  # noqa: F401  (nki.isa re-exports the enums)
    dge_mode,
    dma_engine,
    engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
)
from .operands import _accumulate, _dst, _no_packed, _on_chip, _result_buffer, _step, _touch, _write

__all__ = ["constants", "engine", "reduce_cmd", "nc_version", "oob_mode", "dge_mode", "matmul_perf_mode",
           "dma_engine", "VirtualRegister", "NkiInstruction", "NkiValidationError"]

# Public functions that are not instructions (the rest return an NkiInstruction).
_QUERIES = ("get_nc_version", "get_nc_sub_version", "register_value")

vector_engine, scalar_engine, gpsimd_engine = engine.vector, engine.scalar, engine.gpsimd
tensor_engine, unknown_engine = engine.tensor, engine.unknown


def get_nc_version() -> nc_version:
    return nc_version(active_config().nc_version)


def get_nc_sub_version() -> int:
    """The silicon revision within the target's generation: 0, the first (the API page's default);
    no simulated target models a second revision."""
    return 0


def _require_v4(api: str) -> None:
    config = active_config()
    if config.nc_version < 4:
        raise KernelUsageError(f"{api} is available only on NeuronCore-v4 (trn3) and newer; target is "
                               f"{config.target}")


class NkiInstruction:
    """The API page's opaque handle to a traced instruction, which every instruction returns. The
    simulator runs instructions in program order, so every dependency ``depends_on`` adds already
    holds (the cost model's schedule does not add these edges)."""

    def __init__(self, name: str | None = None):
        self.name = name

    def __repr__(self) -> str:
        return f"NkiInstruction({self.name!r})"

    def depends_on(self, *producers: NkiInstruction) -> NkiInstruction:
        for producer in producers:
            if not isinstance(producer, NkiInstruction):
                raise KernelUsageError(f"NkiInstruction.depends_on takes instructions, got {type(producer).__name__}")
        return self


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


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=constants.reduce_cmd.reset_reduce)


_ACTIVATE2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")


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


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    api = "nisa.scalar_tensor_tensor"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _on_chip(operand1, api, "operand1")
    _write(dst, instructions.scalar_tensor_tensor(api, data, op0, operand0, op1, operand1, reverse0, reverse1,
                                                  out=_result_buffer(dst, engine.unknown)), api)


_TENSOR_SCALAR_REDUCE = ("add", "multiply", "maximum", "minimum")


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


def tensor_partition_reduce(dst, op, data, name=None):
    api = "nisa.tensor_partition_reduce"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.tensor_partition_reduce(api, op, data), api)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    api = "nisa.tensor_tensor_scan"
    _dst(dst, api)
    _on_chip(data0, api, "data0")
    _on_chip(data1, api, "data1")
    _write(dst, instructions.tensor_tensor_scan(api, data0, data1, initial, op0, op1, reverse0, reverse1), api)


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


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    api = "nisa.tensor_copy_predicated"
    _dst(dst, api)
    pred = memory.read(_on_chip(predicate, api, "predicate"), api, "predicate")
    instructions.require_predicate(pred, ("uint8", "uint16", "uint32"), api)
    if src is not None and alu.is_tile(src) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: src ({src.dtype}) and dst ({dst.dtype}) must have the same dtype")
    values = memory.value_of(src, api, "src")
    _write(dst, instructions.copy_predicated(api, pred, values, dst.data, reverse_pred), api)


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


def reciprocal(dst, data, name=None):
    api = "nisa.reciprocal"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.reciprocal(api, data, out=_result_buffer(dst, engine.unknown)), api)


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
    as float32: CITATION."""
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


def bn_stats(dst, data, name=None):
    api = "nisa.bn_stats"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.bn_stats(api, data)[0], api)


def bn_aggr(dst, data, name=None):
    api = "nisa.bn_aggr"
    _dst(dst, api)
    _on_chip(data, api, "data")
    _write(dst, instructions.bn_aggr(api, data), api)


def max8(dst, src, name=None):
    """The 8 largest values per partition, descending."""
    api = "nisa.max8"
    _dst(dst, api)
    _write(dst, instructions.max8(api, memory.read(_on_chip(src, api, "src"), api, "src")), api)


def _write_indices(dst, index: np.ndarray) -> None:
    """uint32 positions into an integer dst as they are (a uint16 dst keeps the low bits: 0xFFFF absent)."""
    _touch(dst)
    dst.data[...] = index.reshape(dst.shape).astype(dst.dtype)


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


# ----------------------------------------------------------------------------------------- DMA

def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None):
    """Copy ``src`` to ``dst`` (HBM <-> SBUF, HBM -> HBM, SBUF -> SBUF); a cast goes through fp32.
    Either side may be a gather/scatter access (``.ap(vector_offset=...)``): with ``oob_mode.skip``
    elements whose index falls outside the tensor are not transferred, else they are an error.
    ``priority`` (DMA class of service) and ``engine`` (which queue generates HWDGE descriptors) change
    timing only."""
    api = "nisa.dma_copy"
    _dma_priority(api, priority)
    hwdge = dge_mode == constants.dge_mode.hwdge
    if hwdge:
        _hwdge_target(api)
    if engine not in (constants.engine.unknown, constants.engine.dma):
        if engine not in (constants.engine.sync, constants.engine.scalar):
            raise KernelUsageError(f"{api}: engine must be nisa.engine.sync or nisa.engine.scalar (HWDGE "
                                   f"descriptor generation), got {engine!r}")
        if dge_mode != constants.dge_mode.hwdge:
            raise KernelUsageError(f"{api}: engine={engine!r} picks the HWDGE descriptor generator, so it needs "
                                   f"dge_mode=nisa.dge_mode.hwdge, got {dge_mode!r}")
    instructions.dma_operands(api, dst, src)
    _dst(dst, api, on_chip=False)
    if (src.dtype.names or dst.dtype.names) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: packed dtypes move without a cast; got {src.dtype} -> {dst.dtype}")
    if hwdge and src.dtype != dst.dtype:
        # NKI 0.3.0 migration guide: "source and destination element types must match when using
        # dge_mode=dge_mode.hwdge" (the hardware DGE moves raw bytes; swdge/none cast).
        raise KernelUsageError(f"{api}: dge_mode=hwdge moves raw bytes, so src and dst must have the same dtype; "
                               f"got src {src.dtype} -> dst {dst.dtype} (reinterpret one side with .view(), or "
                               f"cast with dge_mode=swdge or none)")
    if src.size != dst.size:
        raise KernelUsageError(f"{api}: element counts differ: src {list(src.shape)} vs dst {list(dst.shape)}")
    # Which elements move: all (None) unless a gather/scatter side has indices outside its tensor.
    indirect = [side for side in (src, dst) if side.gathers]
    moved = np.ones(dst.shape, bool) if indirect else None
    for side in indirect:
        moved &= side.valid.reshape(dst.shape)
    if moved is not None and not moved.all() and oob_mode != constants.oob_mode.skip:
        bad = next(side for side in indirect if not side.valid.all())
        raise OutOfBoundsError(f"{api}: indirect access to '{bad.name}' (shape {list(bad.root.shape)}) has indices "
                               f"outside it; pass oob_mode=oob_mode.skip to drop them")
    values = src.data.reshape(dst.shape)
    if not dst.dtype.names:
        values = dt.cast(instructions.dma_values(api, values, dst.shape, dst.dtype), dst.dtype)
    _touch(dst, src)
    if trace.listening:
        trace.write(dst, api)
    if dst.gathers:
        dst.scatter(values, moved)
        return
    if moved is None or moved.all():
        dst.overwrite_all()
        dst.data[...] = values
    else:
        np.copyto(dst.data, values, where=moved)
    if dst.unset is not None:
        dst.unset[... if moved is None else moved] = False


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in fp32 inside the DMA engines; with a
    scatter ``dst`` that one of the sources also reads this is a read-add-write. With an indirect
    (``vector_offset``) access ``unique_indices`` must be True, as the page states ("non-unique not
    yet supported")."""
    api = "nisa.dma_compute"
    if instructions.op_name(reduce_op) != "add":
        raise KernelUsageError(f"{api}: only reduce_op=nl.add is supported by the DMA engines")
    srcs = list(srcs)
    scales = [1.0] * len(srcs) if scales is None else list(scales)
    if len(scales) != len(srcs) or any(float(v) != 1.0 for v in scales):
        raise KernelUsageError(f"{api}: scales must be None or all 1.0, one per source; got {scales!r}")
    for src in srcs:
        instructions.dma_operands(api, dst, src)
        if src.size != dst.size:
            raise KernelUsageError(f"{api}: src {list(src.shape)} and dst {list(dst.shape)} element counts differ")
    indirect = [side for side in (*srcs, dst) if side.gathers]
    if indirect and not unique_indices:
        raise KernelUsageError(f"{api}: unique_indices must be True with an indirect (vector_offset) access, as "
                               f"non-unique indices are not supported yet; got unique_indices={unique_indices!r} "
                               f"with indirect '{indirect[0].name}'")
    _dst(dst, api, on_chip=False)
    moved = np.ones(dst.shape, bool)
    for side in (*srcs, dst):
        if side.gathers:
            moved &= side.valid.reshape(dst.shape)
    if not moved.all() and oob_mode != constants.oob_mode.skip:
        raise OutOfBoundsError(f"{api}: an indirect access has indices outside its tensor; pass "
                               f"oob_mode=oob_mode.skip to drop them")
    _touch(dst, *srcs)
    total = sum(dt.to_f32(s.data).reshape(dst.shape) for s in srcs)
    values = dt.cast(total, dst.dtype)
    if dst.gathers:
        dst.scatter(values, moved)
    else:
        np.copyto(dst.data, values, where=moved)


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each 32-partition quadrant, ``dst[i] = src[shuffle_mask[i]]`` (partitions counted from each
    operand's first, so a 1-partition src can feed a quadrant); 255 leaves ``dst[i]`` as is."""
    api = "nisa.nc_stream_shuffle"
    _dst(dst, api)
    values = memory.read(_on_chip(src, api, "src"), api, "src")
    _write(dst, instructions.stream_shuffle(api, values, dst.data, shuffle_mask), api)


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                  name=None):
    """DMA transpose: axes (1, 0), (2, 1, 0) or (3, 1, 2, 0); the destination has the source's rank."""
    api = "nisa.dma_transpose"
    _dma_priority(api, priority)
    instructions.dma_operands(api, dst, src)
    _dst(dst, api, on_chip=False)
    if oob_mode == constants.oob_mode.skip and not _may_be_indirect(src):
        # The page's oob_mode: "oob_mode.skip ... Only valid when src uses indirect indexing."
        raise KernelUsageError(f"{api}: oob_mode=oob_mode.skip is valid only when src uses indirect indexing "
                               f"(.ap(vector_offset=...), vector_select, a dynamic select or scalar_offset); got "
                               f"'{src.name}' with static addresses (leave oob_mode at oob_mode.error)")
    _dma_transpose_lowering(api, src, dge_mode)
    _touch(None, src)
    if dst.ndim != src.ndim:
        raise KernelUsageError(f"{api}: src rank {src.ndim} and dst rank {dst.ndim} must agree")
    result = instructions.dma_transpose(api, src.data, axes)
    if result.shape != dst.shape:
        raise KernelUsageError(f"{api}: transposed src has shape {list(result.shape)}, dst {list(dst.shape)}")
    values = instructions.dma_values(api, result, dst.shape, dst.dtype)
    moved = instructions.dma_transpose(api, src.valid, axes) if src.gathers else None
    if moved is None or moved.all():
        memory.write(dst, values, api)
    elif oob_mode != constants.oob_mode.skip:
        raise OutOfBoundsError(f"{api}: indirect access to '{src.name}' (shape {list(src.root.shape)}) has indices "
                               f"outside it; pass oob_mode=oob_mode.skip to drop them")
    else:  # the skipped rows keep what dst held
        memory.write(dst, values, api, mask=moved)


def _dma_transpose_lowering(api: str, src, mode) -> None:
    """The rules of the two lowerings the dma_transpose page lists: the hardware-DGE transpose (an
    explicit ``dge_mode=hwdge``) and the software-DGE gather transpose (a gathered ``src``). Both move
    2-byte elements, at most 128 along the last source dim. The default mode of a plain source may
    lower otherwise, so it is not checked."""
    if mode == constants.dge_mode.hwdge:
        if active_config().nc_version < 3:
            raise KernelUsageError(f"{api}: dge_mode=hwdge needs NeuronCore-v3 or newer; target is "
                                   f"{active_config().target}")
        rows = src.shape[0]
        if src.ndim == 2 and rows != 16:
            raise KernelUsageError(f"{api}: a hardware-DGE transpose of a 2-D src needs src.shape[0] == 16, got "
                                   f"{list(src.shape)}")
        if src.ndim > 2 and (rows not in (1, 2, 4, 8, 16) or rows * src.shape[-2] % 16):
            raise KernelUsageError(f"{api}: a hardware-DGE transpose of a {src.ndim}-D src needs src.shape[0] in "
                                   f"(1, 2, 4, 8, 16) and src.shape[0] * src.shape[-2] a multiple of 16, got "
                                   f"{list(src.shape)}")
    elif src.gathers:
        if mode not in (constants.dge_mode.unknown, constants.dge_mode.swdge):
            raise KernelUsageError(f"{api}: a gathered src transposes through the software DGE; dge_mode must be "
                                   f"unknown or swdge, got {mode!r}")
        if src.shape[0] % 16 or (src.ndim == 4 and 1 not in src.shape[1:3]):
            raise KernelUsageError(f"{api}: a gather transpose needs src.shape[0] a multiple of 16 (and a 4-D src "
                                   f"of size 1 in dim 1 or 2), got {list(src.shape)}")
    else:
        return
    if src.itemsize != 2 or src.shape[-1] > 128:
        raise KernelUsageError(f"{api}: this lowering moves 2-byte elements, at most 128 along the last src dim; "
                               f"got {src.dtype} of shape {list(src.shape)}")


def _dma_priority(api: str, priority) -> None:
    """The DMA quality-of-service level, 0 (highest) to 3; a hint that moves no byte differently. The
    dma_copy and dma_transpose pages: "(NeuronCore-v4+ only)"."""
    if priority is not None and (isinstance(priority, bool) or priority not in (0, 1, 2, 3)):
        raise KernelUsageError(f"{api}: priority must be an int 0-3 (lower is higher priority) or None, "
                               f"got {priority!r}")
    config = active_config()
    if priority is not None and config.nc_version < 4:
        raise KernelUsageError(f"{api}: priority (DMA quality of service) is available only on NeuronCore-v4 "
                               f"(trn3) and newer, so it must be None on target {config.target} (NeuronCore-v"
                               f"{config.nc_version}); got priority={priority!r}")


def _hwdge_target(api: str) -> None:
    """dma_copy page: "Hardware based DGE is only supported for NeuronCore-v3 or newer". A warning, not
    an error: AWS's kernel library (@d2ad3a5) passes dge_mode=hwdge unconditionally in mlp_tkg's
    gate/up projection (gate_up_projection_lhs_rhs_swap), a kernel with NeuronCore-v2 code paths whose
    tests are not excluded from trn1, so the compiler is not shown to refuse it there."""
    config = active_config()
    if config.nc_version < 3:
        warnings.warn(f"{user_site()}: {api}: dge_mode=hwdge needs NeuronCore-v3 (trn2) or newer per the API page; "
                      f"target is {config.target} (NeuronCore-v{config.nc_version}), which has no hardware DGE",
                      SimulatorWarning, stacklevel=3)


def _may_be_indirect(src) -> bool:
    """Whether ``src`` uses indirect indexing: a gather view (``.ap(vector_offset=...)``, ``vector_select``),
    a dynamic ``select``, or a ``.ap(scalar_offset=...)`` view."""
    return src.gathers or src.is_indirect() or src.runtime_offset


# ----------------------------------------------------------------------------------- registers

class VirtualRegister:
    """A 32-bit scalar register (dynamic loop bounds, offsets); holds a value at run time."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = int(np.int32(value))

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"

    def __bool__(self):
        return self.value != 0

    def __int__(self):
        return self.value

    __index__ = __int__


def register_value(x) -> int:
    if isinstance(x, VirtualRegister):
        return x.value
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise KernelUsageError(f"expected an int or a register, got {type(x).__name__}")


def register_alloc(x=None) -> VirtualRegister:
    return VirtualRegister(0 if x is None else register_value(x))


def register_move(dst: VirtualRegister, src) -> None:
    dst.value = register_value(src)


def _one(src, api: str) -> np.ndarray:
    if not alu.is_tile(src) or src.data.size != 1:
        raise KernelUsageError(f"{api}: needs a 1x1 tensor, got {getattr(src, 'shape', type(src).__name__)}")
    return src.data.reshape(-1)


def register_load(dst: VirtualRegister, src) -> None:
    require_values("nisa.register_load (a register, e.g. a loop bound, set from a tensor value)")
    dst.value = int(np.int32(_one(src, "nisa.register_load")[0]))


def register_store(dst, src: VirtualRegister) -> None:
    memory.write(dst, np.asarray(register_value(src), np.int64), "nisa.register_store")


# ------------------------------------------------------------------------------------- LNC2

class Exchange:
    """What the programs of an LNC2 launch share: the sendrecv mailboxes, the barrier, and the turn.

    The two NeuronCores progress together, so the programs run in lockstep, one instruction each in
    turn; a program blocked in a barrier or a receive, or finished, lets the other run on. Effects
    on shared memory then interleave as they would on the device, and in the same order every run."""

    def __init__(self, programs: int, races=None):
        self.programs = programs
        self.races = races  # the HBM race checks of these programs (``core.races``), or None
        self.lock = threading.Lock()
        self.ready = threading.Condition(self.lock)
        self.mail: dict[tuple[int, int, int], list] = {}
        self.failed = False
        self.turn = 0
        self.running = set(range(programs))
        self.blocked: set[int] = set()
        self.arrived = self.generation = 0

    def step(self, pid: int) -> None:
        """Called before each instruction of program ``pid``: wait for its turn, then pass the turn on."""
        with self.ready:
            self.ready.wait_for(lambda: self.failed or self.turn == pid or not (self.running - self.blocked - {pid}),
                                timeout=60)
            self.turn = (pid + 1) % self.programs
            self.ready.notify_all()

    def wait(self, pid: int, done, what: str) -> None:
        """Block program ``pid`` (the lock held) until ``done()``; the other program runs meanwhile."""
        self.blocked.add(pid)
        self.ready.notify_all()
        try:
            finished = self.ready.wait_for(lambda: self.failed or done(), timeout=60)
        finally:
            self.blocked.discard(pid)
        if self.failed or not finished:
            raise KernelUsageError(what)

    def barrier(self, pid: int) -> None:
        with self.ready:
            generation = self.generation
            self.arrived += 1
            if self.arrived == len(self.running):
                self.arrived, self.generation = 0, generation + 1
                if self.races is not None:
                    self.races.sync()
                self.ready.notify_all()
                return
            self.wait(pid, lambda: self.generation != generation,
                      "nisa.core_barrier: the other program never reached the barrier")

    def finish(self, pid: int) -> None:
        with self.ready:
            self.running.discard(pid)
            self.ready.notify_all()

    def abort(self) -> None:
        """A program failed: release the other from any barrier or receive it waits in."""
        with self.ready:
            self.failed = True
            self.ready.notify_all()


def _exchange(api: str) -> Exchange:
    run = current_run(api)
    exchange = getattr(run, "exchange", None)
    if exchange is None or exchange.programs < 2:
        raise KernelUsageError(f"{api} needs an LNC2 launch (kernel[2](...))")
    return exchange


def core_barrier(data=None, cores=None, engine=engine.gpsimd, name=None):
    """Both programs of an LNC2 launch wait for each other here (``engine`` picks which engine's queue
    blocks; the simulator runs each program's instructions in order, so all of them wait)."""
    exchange = _exchange("nisa.core_barrier")
    _step()
    exchange.barrier(current_run("nisa.core_barrier").program_id[0])


def sendrecv(dst, src, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Send ``src`` to the other program and receive its ``src`` into ``dst`` (matched by pipe_id)."""
    api = "nisa.sendrecv"
    exchange = _exchange(api)
    me = current_run(api).program_id[0]
    _dst(dst, api, on_chip=False)
    payload = np.array(memory.read(src, api, "src") if src.buffer.on_chip else src.data)
    with exchange.ready:
        exchange.mail.setdefault((me, int(send_to_rank), int(pipe_id)), []).append(payload)
        exchange.ready.notify_all()
        key = (int(recv_from_rank), me, int(pipe_id))
        if exchange.races is not None and exchange.mail.get(key):
            # The other program sent first and waits for this send: both are past their sends.
            exchange.races.sync()
        exchange.wait(me, lambda: exchange.mail.get(key),
                      f"{api}: program {me} never received from rank {recv_from_rank} (pipe {pipe_id})")
        received = exchange.mail[key].pop(0)
    memory.write(dst, instructions.dma_values(api, received, dst.shape, dst.dtype), api)


# Instructions in their own modules, which use the operand helpers above.
from .gpsimd import local_gather, sequence_bounds, topk  # noqa: E402, F401
from .mx import nc_matmul_mx, quantize_mx  # noqa: E402, F401
from .random import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed  # noqa: E402, F401


def _returns_instruction(fn):
    """``fn`` returning its ``NkiInstruction`` handle (the API pages' return value) where it returns
    nothing else; an instruction's ``name=`` goes into the launch's issued names (``with_schedule``)."""
    @functools.wraps(fn)
    def instruction(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except TypeError as error:
            if error.__traceback__.tb_next is not None:  # raised inside the instruction
                raise
            # The call did not bind (an unknown or missing argument): the kernel's error, at its line.
            raise KernelUsageError(f"nisa.{error}") from None
        if result is not None:
            return result
        name = kwargs.get("name")
        if name is not None:
            issued = current_run(fn.__name__).frontend.get("issued names")
            if issued is not None:
                issued.add(name)
        return NkiInstruction(name)
    return instruction


for _name, _fn in list(globals().items()):
    if inspect.isfunction(_fn) and not _name.startswith("_") and _name not in _QUERIES:
        globals()[_name] = _returns_instruction(_fn)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.isa.{name}")

