"""The ``nisa`` instructions in the one calling convention: each takes an output spec (``core/outputs.py``: a
legacy ``Tile`` or a current ``Dst``) and its operands, validates (target, engines, dtypes, partitions), reads
and masks the operands, computes with ``core/instructions.py``'s semantics, and writes, rounds and records
through ``out.put``, returning the written tile. A front end's instruction is its signature and one call.

Where the two generations' pages document different rules, ``out.current`` (the NKI 0.6 pages apply) selects
them; ``out.api`` names the API in messages.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import alu, gpsimd, memory, replay, trace
from . import dtypes as dt
from . import instructions as ins
from . import run as _run
from .errors import (
    KernelUsageError,
    MemorySpaceError,
    SimulatorWarning,
    TileLimitError,
    UnsupportedError,
    user_site,
)
from .instructions import (
    GPSIMD,
    IDLE,
    LOAD_REDUCE,
    RESET,
    RESET_REDUCE,
    SCALAR,
    UNKNOWN,
    VECTOR,
    check_engine_access,
    op_name,
    require_tile_operand,
)
from .memory import read, value_of
from .outputs import accumulated_product, no_packed, require_v4, shaped_product, touch
from .run import active_config, unfit, violation
from .tensors import Access, Tensor, mask_for

# ------------------------------------------------------------------------------------- helpers


def float32_operand(api: str, arg: str, operand) -> None:
    """The nisa.tensor_scalar page: "the operand0 and operand1 (if used) must be float32"; the nisa.activation
    page: "The scale parameter must have a float32 data type". A half-precision tile there warns and is read
    as float32, not refused: AWS's kernel library (@d2ad3a5) gives these operands the dtype of its callers'
    tensors (qkv_tkg's in_scale_tile and output_projection_tkg's input_scale_sb take the scale input's dtype;
    the bwmm MoE kernels pass expert_affinity tiles as operand0), so kernels that ran on devices can reach
    them with bfloat16. (Current API; the warning points at the front end's instruction call.)"""
    if alu.is_tile(operand) and dt.is_float(operand.dtype) and operand.dtype != np.float32:
        unfit("a simulator warning")
        warnings.warn(f"{user_site()}: {api}: {arg} must be a float32 tile per the API page, got {operand.dtype} "
                      f"'{operand.name}' (copy it to a float32 tile with nisa.tensor_copy)", SimulatorWarning,
                      stacklevel=4)


def _keep(selected, shape):
    """The mask over an operand of ``shape`` (None: everything is read)."""
    return None if selected is None else mask_for(selected, tuple(shape))


def accumulate_into(out, reduce_op, values, cmd, reduce_res, engine_name: str = "vector", initial=None,
                    negate: bool = False, masked: bool = False) -> None:
    """The engine's accumulator registers take ``cmd`` (``instructions.accumulate``), then ``reduce_res``
    (when given) receives them, negated with ``negate`` (the registers keep the sign). An ``idle`` command
    without ``reduce_res`` leaves them alone. A legacy mask restricts the reduction to the selected elements
    where the instruction's page allows it (``masked``); elsewhere it is refused."""
    if int(cmd) == IDLE and reduce_res is None:
        return
    if out.selected is not None and not masked:
        raise UnsupportedError(f"nki.isa.{out.api} with a mask and a reduction")
    registers = ins.accumulate(out.api, reduce_op, values, cmd, engine_name, initial=initial, selected=out.selected)
    if reduce_res is not None:
        out.also(reduce_res, "reduce_res").put(-registers if negate else registers, where=None)


# The ISA pages list the integer predicate dtypes; AWS's own select_reduce and tensor_copy_predicated
# examples pass bool tiles (one byte, 0 or 1), which the legacy front end accepts.
SELECT_PREDICATES = ("int8", "uint8", "int16", "uint16")
COPY_PREDICATES = ("uint8", "uint16", "uint32")


def _predicate(out, predicate, allowed) -> np.ndarray:
    pred = read(out.on_chip(predicate, "predicate"), out.api, "predicate", out.selected)
    ins.require_predicate(pred, allowed if out.current else allowed + ("bool",), out.api)
    return pred


def sbuf_operand(x, api: str, arg: str) -> None:
    """A GpSimd operand of the current API: a tile in SBUF."""
    require_tile_operand(x, api, arg)
    if x.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', but got a "
                               f"tensor in '{x.buffer.space}' instead (the GpSimd engine reads and writes SBUF)")


def gpsimd_read(out, x, arg: str) -> np.ndarray:
    """A GpSimd operand's values as (partitions, elements per partition); the engine cannot access PSUM."""
    if out.current:
        sbuf_operand(x, out.api, arg)
    else:
        check_engine_access(x, GPSIMD, out.api, arg)
    values = read(x, out.api, arg)
    return values.reshape(values.shape[0], -1)


# ---------------------------------------------------------------------------------- Tensor engine

FP8 = (dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn)
PE_DTYPES = (*FP8, dt.bfloat16, dt.float16, dt.float32)  # the current nc_matmul page's operand types


def nc_matmul(out, stationary, moving, is_transpose=False, tile_position=(), tile_size=(), double_row=None,
              accumulate=None, operand_mask=None):
    """``stationary.T @ moving`` into PSUM: a new fp32 PSUM tile that accumulates when added into one (legacy,
    written where the mask and ``operand_mask``, the masked operands' result elements, select), or dst,
    ``accumulate=None`` overwriting the PSUM elements no instruction wrote and adding into the others (current).
    PE tiling is checked against its rules and computes the same product. ``double_row`` (the mode's name in
    the front end's spelling, None: off): FP8 ``[K, 2, F]`` operands contract over K and the pair axis.
    ``is_transpose`` labels the instruction for the profiler; from NeuronCore-v3 the current API's transpose
    mode is bit-exact (before it, the product against the identity is an ordinary matmul, NaN/Inf spreading).
    The legacy compiler copies PSUM operands to SBUF first; the current page's dtype rules apply to dst."""
    api, dst, config = out.api, out.dst, active_config()
    if out.current and dst.buffer is not memory.psum:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'psum', but got a "
                               f"tensor in '{dst.buffer.space}' instead")
    if is_transpose and trace.listening:
        trace.engine(ins.TENSOR, transpose=True)  # the profile's transpose FLOPs, as neuron-profile's
    if out.current and is_transpose and config.nc_version >= 3:
        return _pe_transpose(out, stationary, moving)
    ins.check_pe_tiling(api, tile_position, tile_size, stationary, moving)
    if out.current:
        no_packed(api, stationary, moving)
        allowed_dst = (dt.float32, dt.bfloat16) if config.nc_version >= 4 else (dt.float32,)
        if dst.dtype not in allowed_dst:
            raise KernelUsageError(f"{api}: dst '{dst.name}' is {dst.dtype}; the product lands in a float32 PSUM "
                                   f"tile (bfloat16 too from NeuronCore-v4); target is {config.target}")
        for operand, arg in ((stationary, "stationary"), (moving, "moving")):
            if alu.is_tile(operand) and operand.dtype not in PE_DTYPES:
                raise KernelUsageError(f"{api}: {arg} is {operand.dtype}; the Tensor engine multiplies float8, "
                                       f"bfloat16, float16 and (t)float32 tiles")
        _ocp_fp8_rules(api, stationary, moving)
    fmax = 4096 if out.current and config.nc_version >= 4 else 512
    if double_row is not None:
        values = _double_row(out, double_row, stationary, moving, fmax, tile_position or tile_size)
    else:
        values = ins.matmul(api, stationary, moving, moving_fmax=fmax, copies_psum=not out.current,
                            flatten_free=out.current)
    if out.current:
        fresh = out.accumulate(values, accumulate)
        if _run.recordings and double_row is None and isinstance(stationary, Tensor) and isinstance(moving, Tensor):
            operands = replay.array_of(stationary), replay.array_of(moving)
            if fresh is True:  # a form that reads nothing of dst, so a replay need not fill it first
                _form(out, dst.shape, shaped_product, *operands, replay.array_of(dst).shape)
            else:
                _form(out, dst.shape, accumulated_product, *operands, replay.array_of(dst), fresh)
        return dst
    written = out.selected
    if operand_mask is not None:
        written = operand_mask if written is None else operand_mask & np.broadcast_to(written, operand_mask.shape)
    tile = out.put(values, dt.float32, where=written, buffer=memory.psum, account=False)
    tile.accumulates = True
    return tile


def _ocp_fp8_rules(api: str, *operands) -> None:
    """OCP float8_e4m3fn operands from NeuronCore-v4 only, never beside legacy float8_e4m3 (nc_matmul
    page; 2.32 release notes)."""
    dtypes = {t.dtype for t in operands if alu.is_tile(t)}
    if dt.float8_e4m3fn in dtypes and active_config().nc_version < 4:
        raise KernelUsageError(f"{api}: float8_e4m3fn (OCP FP8) operands need NeuronCore-v4 (trn3); target is "
                               f"{active_config().target}")
    if {dt.float8_e4m3, dt.float8_e4m3fn} <= dtypes:
        raise KernelUsageError(f"{api}: legacy float8_e4m3 and OCP float8_e4m3fn cannot be mixed in one matmul")


def _double_row(out, mode: str, stationary, moving, fmax: int, tiled) -> np.ndarray:
    """FP8 double-row mode (trn2+): operands [K, 2, F] hold a contraction of 2K rows. The current page
    refuses it with PE tiling; the legacy compiler copies PSUM operands to SBUF."""
    api, config = out.api, active_config()
    if config.nc_version < 3:
        raise KernelUsageError(f"{api}: perf_mode={mode} needs trn2 or later (the FP8 double-row mode needs "
                               f"NeuronCore-v3 or newer); target is {config.target}")
    if tiled and out.current:
        raise KernelUsageError(f"{api}: {mode} cannot be combined with PE tiling")
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        require_tile_operand(operand, api, arg)
        if out.current:
            ins.require_sbuf(operand, api, arg)
        if operand.dtype not in FP8:
            raise KernelUsageError(f"{api}: {mode} multiplies fp8 operands, got {arg} in {operand.dtype}")
        if operand.ndim != 3 or operand.shape[1] != 2:
            raise KernelUsageError(f"{api}: {mode} operands are [K, 2, F], got {arg} of shape {list(operand.shape)}")
    s = dt.to_f32(read(stationary, api, "stationary"))
    m = dt.to_f32(read(moving, api, "moving"))
    if s.shape[0] != m.shape[0]:
        raise KernelUsageError(f"{api}: contraction sizes differ: {list(s.shape)} vs {list(m.shape)}")
    for size, limit, what in ((s.shape[0], 128, "contraction (partition) size"),
                              (s.shape[2], 128, "stationary free size"), (m.shape[2], fmax, "moving free size")):
        if size > limit:
            violation(TileLimitError(f"{api}: {what} {size} exceeds the Tensor engine limit of {limit}"))
    return s.reshape(-1, s.shape[2]).T @ m.reshape(-1, m.shape[2])


def _pe_transpose(out, stationary, moving):
    """Transpose mode (trn2 and later): ``moving`` is an identity, so ``dst = stationary.T``, bit-exact
    (NaN and Inf pass through), in dst's dtype, overwriting ``dst``."""
    api = out.api
    for operand, arg in ((stationary, "stationary"), (moving, "moving")):
        require_tile_operand(operand, api, arg)
        ins.require_sbuf(operand, api, arg)
    s, m = read(stationary, api, "stationary"), read(moving, api, "moving")
    if s.ndim != 2 or m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != s.shape[0]:
        raise KernelUsageError(f"{api}(is_transpose=True): moving must be a square identity over stationary's "
                               f"{s.shape[0]} partitions, got stationary {list(s.shape)}, moving {list(m.shape)}")
    if not np.array_equal(dt.to_f32(m), np.eye(m.shape[0], dtype=np.float32)):
        raise UnsupportedError(f"{api}(is_transpose=True) with a moving operand that is not an identity")
    if _run.recordings and isinstance(stationary, Tensor):
        _form(out, s.T.shape, ins.transposed, replay.array_of(stationary), False)
    return out.put(ins.pe_transpose(s))


def nc_transpose(out, data, engine=UNKNOWN):
    """Partition <-> free transpose: Tensor engine (<= 128 x 128, SBUF -> PSUM) or Vector engine (<= 32 x 32,
    SBUF/PSUM -> SBUF); ``unknown`` picks Vector when both sizes are <= 32. The legacy compiler copies a
    PSUM input for the Tensor engine; the current page keeps data's dtype in dst."""
    api, dst = out.api, out.dst
    out.on_chip(data, "data")
    if out.current and dst.dtype != data.dtype:  # the page: "The output dst tile must have the same data type"
        raise KernelUsageError(f"{api}: dst must have the same dtype as data; got data '{data.name}' in {data.dtype} "
                               f"and dst '{dst.name}' in {dst.dtype} (transpose first, then cast with "
                               f"nisa.tensor_copy)")
    values, on_vector = ins.transpose(api, data, int(engine), out.selected, copies_psum=not out.current)
    if out.current and not on_vector and dst.buffer is not memory.psum:
        raise MemorySpaceError(f"Expected operand 'dst' of '{api}' on the Tensor engine to be in 'psum', got "
                               f"'{dst.buffer.space}'")
    if _run.recordings and isinstance(data, Tensor):
        _form(out, values.shape, ins.transposed, replay.array_of(data), on_vector)
    return out.put(values, data.dtype, where=None, buffer=memory.sbuf if on_vector else memory.psum,
                   account=on_vector)


# ---------------------------------------------------------------------------------- Scalar engine

def activation(out, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=IDLE):
    """``op(data * scale + bias)``; scale a scalar or (P, 1), bias (P, 1) (a scalar too from NeuronCore-v3 in
    the current API). With ``reduce_res`` or a ``reduce_cmd``, the Scalar engine's accumulators add the
    result's free-axis sums, and ``reduce_res`` receives them."""
    api = out.api
    out.on_chip(data, "data")
    if out.current:
        if bias is not None and not alu.is_tile(bias) and active_config().nc_version < 3:
            raise KernelUsageError(f"{api}: bias must be a (P, 1) tensor on {active_config().target}")
        float32_operand(api, "scale", scale)
    elif bias is not None and not isinstance(bias, (Tensor, Access)):
        raise KernelUsageError(f"{api}: bias must be a (P, 1) tile, got {type(bias).__name__}")
    compute = ins.activation_plan(api, op, data, bias, scale, out.selected, out=out.result_buffer())
    values = compute()
    result = out.put(values, data.dtype)
    registers = ins.activation_accumulate(api, reduce_op, values, reduce_cmd, reduce_res, out.selected)
    if reduce_res is not None:
        out.also(reduce_res, "reduce_res").put(registers, where=None)
    if _run.recordings:
        if registers is None:
            _put_form(compute, result)
            replay.replays_as(_put, out, compute, data.dtype)
        elif (getattr(compute, "form", None) is not None and out.current and compute.form[0] == out.dst.shape
              and (reduce_res is None or registers.shape == reduce_res.shape)):
            replay.form(_activation_folded, replay.array_of(out.dst), compute.form[1:],
                        ins.registers_of(api, "scalar"), int(reduce_cmd), reduce_op,
                        None if reduce_res is None else replay.array_of(reduce_res), api,
                        writes=(out.dst, reduce_res))
    return result


def _activation_folded(dst, form, regs, cmd: int, reduce_op, reduce_res, api: str) -> None:
    """``activation``'s array form with the Scalar engine's accumulator registers: the values into dst, their
    row sums into the registers, and the registers into ``reduce_res``."""
    fn, *args = form
    values = fn(*args)
    replay.into(dst, np.asarray, values)
    registers = ins.fold(api, regs, values, cmd, reduce_op)
    if reduce_res is not None:
        replay.into(reduce_res, np.asarray, registers)


ACTIVATE2_REDUCE = ("add", "maximum", "minimum", "abs_max", "abs_min")


def activate2(out, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=IDLE):
    """``op((data op0 imm0) op1 imm1)`` on the Scalar engine (NeuronCore-v4 and newer), with an optional
    free-axis reduction into the Scalar engine's accumulators (shared with activation)."""
    api = out.api
    require_v4(api)
    out.on_chip(data, "data")
    no_packed(api, data)
    if reduce_op is not None and op_name(reduce_op) not in ACTIVATE2_REDUCE:
        raise KernelUsageError(f"{api}: reduce_op must be one of nl.{', nl.'.join(ACTIVATE2_REDUCE)}, got "
                               f"{getattr(reduce_op, '__name__', reduce_op)!r}")
    values = ins.activate2(api, op, data, imm0, imm1, op0, op1, relu_param, reverse0, reverse1)
    result = out.put(values, data.dtype)
    accumulate_into(out, reduce_op, values, reduce_cmd, reduce_res, "scalar")
    return result


# ---------------------------------------------------------------------------------- Vector engine

def tensor_tensor(out, data1, data2, op, engine=UNKNOWN):
    """``op(data1, data2)`` of two tiles with equal partitions and sizes (or a (P, 1) operand broadcast
    along the free axes). Arithmetic on float types is fp32 math; in the current API, when every tile is
    int32 or uint32 and none is in PSUM, the default engine is GpSimd's native 32-bit integer arithmetic
    (the page: exact for all 32-bit values; sums and products wrap), ``engine=vector`` keeping fp32."""
    api, engine = out.api, int(engine)
    if out.current:
        dst = out.dst
        no_packed(api, data1, data2)
        if op_name(op) == "power":  # checked before dst may hold the result (the inputs: in the core)
            ins.require_power_operand(dst, api, "dst")
        if ins.gpsimd_integer(engine, op, (dst, data1, data2), dst.dtype):
            return out.put(ins.integer_tensor_tensor(api, data1, data2, op, dst.dtype))
    compute, promoted = ins.tensor_tensor_plan(api, data1, data2, op, engine, out.selected,
                                               out=out.result_buffer(engine))
    out.check_engine(engine)
    if _run.recordings:
        result = replay.tail(_put, out, compute, promoted)
        _put_form(compute, result)
        return result
    return out.put(compute(), promoted)


def _put(out, compute, default):
    """An instruction's result, computed (``compute()``) and put: what a replay of it calls."""
    return out.put(compute(), default)


def _put_form(compute, result) -> None:
    """The array form of an instruction whose plan gave one (``compute.form``, its last argument the fp32 array
    the plan may compute into), into the tensor it wrote: computed in its storage when that is fp32 (a legacy
    new tile's too, which the plan had no storage of yet)."""
    form = getattr(compute, "form", None)
    if form is not None and isinstance(result, Tensor):
        storage = replay.array_of(result)
        if form[-1] is None and storage.dtype == np.float32 and storage.flags.c_contiguous:
            form = (*form[:-1], storage)
        _into(result, *form)


def _form(out, shape, fn, *args) -> None:
    """A current-API instruction's array form, into dst (``_into``)."""
    if out.current:
        _into(out.dst, shape, fn, *args)


def _into(target: Tensor, shape, fn, *args) -> None:
    """Register an instruction's array form (``replay.form``): ``fn(*args)``, its values of ``shape`` (the
    target's, or it has none), rounded into the storage of ``target``."""
    if shape == tuple(target.shape):
        replay.form(replay.into, replay.array_of(target), fn, *args, writes=(target,))


# The operator pairs the trn2 Scalar engine runs (nisa.tensor_scalar page, NKI 0.6).
TRN2_SCALAR_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


def tensor_scalar(out, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=UNKNOWN):
    """``(data op0 operand0) op1 operand1``; operands are scalars or (P, 1) vectors."""
    api, engine = out.api, int(engine)
    out.on_chip(data, "data")
    if out.current:
        for op, operand, arg in ((op0, operand0, "operand0"), (op1, operand1, "operand1")):
            if op is None or op_name(op) in alu.BITWISE:
                continue
            if alu.is_tile(operand) and operand.dtype.kind in "iu":
                raise KernelUsageError(f"{api}: {arg} of an arithmetic operator must be float32, got an "
                                       f"{operand.dtype} tile (cast it with nisa.tensor_copy first)")
            float32_operand(api, arg, operand)
        if engine == SCALAR and active_config().nc_version == 3:
            pair = (op_name(op0), None if op1 is None else op_name(op1))
            if pair not in TRN2_SCALAR_PAIRS or reverse0 or reverse1:
                raise KernelUsageError(f"{api}: the Scalar engine on trn2 takes only op0=multiply with op1=add or "
                                       f"none, or op0=add with no op1 (unreversed); got op0={pair[0]}, op1={pair[1]}")
    compute = ins.tensor_scalar_plan(api, data, op0, operand0, reverse0, op1, operand1, reverse1, engine,
                                     out.selected, out=out.result_buffer(engine))
    values = compute()
    out.check_engine(engine)
    result = out.put(values, data.dtype)
    if _run.recordings:
        _put_form(compute, result)
        replay.replays_as(_put, out, compute, data.dtype)
    return result


def scalar_tensor_tensor(out, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False):
    """``(data op0 operand0) op1 operand1`` with ``operand0`` scalar/(P, 1) and ``operand1`` a full tile."""
    out.on_chip(data, "data")
    out.on_chip(operand1, "operand1")
    compute = ins.scalar_tensor_tensor_plan(out.api, data, op0, operand0, op1, operand1, reverse0, reverse1,
                                            out.selected, out=out.result_buffer())
    result = out.put(compute(), data.dtype)
    if _run.recordings:
        _put_form(compute, result)
    return result


def reciprocal(out, data):
    out.on_chip(data, "data")
    buffer = out.result_buffer()
    result = out.put(ins.reciprocal(out.api, data, out.selected, out=buffer), data.dtype)
    if _run.recordings and isinstance(data, Tensor):
        _form(out, data.shape, ins.reciprocal_values, replay.array_of(data), buffer)
    return result


def tensor_copy(out, src, engine=UNKNOWN):
    """Copy with a cast to the output dtype (bit-exact when the dtypes agree)."""
    api = out.api
    out.on_chip(src, "src")
    check_engine_access(src, int(engine), api, "src")
    out.check_engine(engine)
    if out.current and int(engine) == SCALAR and active_config().nc_version < 3:
        raise KernelUsageError(f"{api}: the Scalar engine cannot tensor_copy on {active_config().target}; use "
                               f"nisa.activation(op=nl.copy)")
    result = out.put(read(src, api, "src", out.selected), src.dtype)
    if _run.recordings and isinstance(src, Tensor):
        _form(out, src.shape, np.asarray, replay.array_of(src))
    return result


def memset(out, value, shape=(), engine=UNKNOWN):
    """Fill the output (a new tile of ``shape`` in legacy, dst in current) with ``value`` (an int for an
    integer dtype; only 0 for packed types)."""
    api, dst = out.api, out.dst
    dtype = out.out_dtype(None)
    if out.current:
        out.check_engine(engine)
        if dtype.names:
            if value != 0:
                raise KernelUsageError(f"{api}: packed dtype {dtype.names[0]} can only be set to 0, got {value!r}")
            touch(dst)
            dst.data[...] = np.zeros((), dtype)
            return dst
        if dtype.kind in "iu" and isinstance(value, (float, np.floating)):
            if not float(value).is_integer():
                raise KernelUsageError(f"{api}: value {value!r} does not match the integer dtype {dtype} of dst "
                                       f"'{dst.name}' (pass an int)")
            _float_memset_into_int(api, value, dst)
    result = out.put(np.full(tuple(shape), value, np.float64 if dt.is_float(dtype) else np.int64))
    if _run.recordings and out.current:
        storage = replay.array_of(dst)
        # What it writes depends on nothing the kernel reads.
        replay.form(replay.fill, storage, storage.copy(), writes=(dst,))
    return result


def _float_memset_into_int(api: str, value, dst) -> None:
    """NKI 0.3.0 release notes, breaking changes: "nisa.memset - Enforces strict type matching between value and
    destination dtype. ... Kernels that pass float values to integer-typed tensors (e.g., value=2.0 instead of
    value=2) will now raise an error at compile time." A warning, not an error, for a float holding an integer:
    AWS's kernel library (@d2ad3a5) clears integer tiles with value=0.0 in kernels it tests: moe_tkg's
    gate_up_projection_mx (its uint8 MX scale tile, nisa.memset(dst=scale_sb[...], value=0.0, ...)) and
    core/utils/cross_partition_copy.py (uint32 index tiles of router_topk, nisa.memset(dst=temp_src, value=0.0))."""
    unfit("a simulator warning")
    warnings.warn(f"{user_site()}: {api}: value {value!r} is a float but dst '{dst.name}' is {dst.dtype}; the NKI "
                  f"0.3.0 release notes make a float value for an integer dst a compile error (pass "
                  f"{int(value)!r})", SimulatorWarning, stacklevel=5)


def tensor_reduce(out, op, data, axis, negate=False, keepdims=False):
    """Reduce along free axes ``axis`` with an ALU operator; ``negate`` multiplies the result by -1. The
    current page: the axes are the last contiguous free dimension(s), and dst keeps them (size 1)."""
    api = out.api
    out.on_chip(data, "data")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % data.ndim for a in axes)
    if 0 in axes:
        raise KernelUsageError(f"{api}: reducing along the partition dimension (axis 0) is not supported; reduce "
                               f"along free axes, transpose first, or use nisa.tensor_partition_reduce")
    if out.current:
        trailing = tuple(range(data.ndim - len(set(axes)), data.ndim))
        if tuple(sorted(set(axes))) != trailing:
            # The page: "The reduction axes must be the last contiguous free dimension(s) of the tile, ending
            # at the final dimension."
            raise KernelUsageError(f"{api}: the reduction axes must be the last contiguous free dimension(s), "
                                   f"ending at the final one (for data of shape {list(data.shape)}: {trailing}); "
                                   f"got axis={axis!r}")
    result = ins.tensor_reduce(api, op, data, axes, negate, keepdims or out.current, out.selected)
    if _run.recordings and isinstance(data, Tensor):
        _form(out, result.shape, ins.reduced, api, op, replay.array_of(data), axes, negate, True)
    return out.put(result, data.dtype, where=None)


def tensor_partition_reduce(out, op, data):
    """Reduce across partitions: (P, F) -> (1, F) on the GpSimd engine."""
    out.on_chip(data, "data")
    return out.put(ins.tensor_partition_reduce(out.api, op, data, out.selected), data.dtype, where=None)


def tensor_tensor_scan(out, data0, data1, initial, op0, op1, reverse0=False, reverse1=False):
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` per partition from ``initial`` (a scalar or
    (P, 1)), on the Vector engine; the result has ``data0``'s shape."""
    out.on_chip(data0, "data0")
    out.on_chip(data1, "data1")
    result = ins.tensor_tensor_scan(out.api, data0, data1, initial, op0, op1, reverse0, reverse1)
    result = result.reshape(data0.shape)
    if out.selected is not None:
        # The scan is computed over whole rows and written where the mask holds; that is the masked
        # instruction only when each row's selection starts at its first element.
        rows = np.broadcast_to(out.selected, result.shape).reshape(result.shape[0], -1)
        if np.any(rows[:, 1:] > rows[:, :-1]):
            raise UnsupportedError("nki.isa.tensor_tensor_scan with a mask that does not start at the first free "
                                   "element")
    return out.put(result, data0.dtype)


TENSOR_SCALAR_REDUCE = ("add", "multiply", "maximum", "minimum")


def tensor_scalar_reduce(out, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=RESET_REDUCE, reduce_init=None, reduce_res_negate=False):
    """``data <op0> operand0``, and the Vector engine's accumulators fold its free-axis ``reduce_op`` of the fp32
    result in (before it is rounded to the output dtype; ``load_reduce`` starts from ``reduce_init``; the
    legacy API has no ``reduce_cmd``: reset_reduce); ``reduce_res`` receives them, negated with
    ``reduce_res_negate`` (the registers keep the sign). A legacy mask restricts the reduction."""
    api = out.api
    out.on_chip(data, "data")
    if out.current:
        if reverse0:  # the page: "reverse0: (not supported yet) ... <-- currently not supported yet."
            raise KernelUsageError(f"{api}: reverse0=True is not supported yet (operand0 is always the rhs of op0); "
                                   f"got reverse0={reverse0!r} (use nisa.tensor_scalar with reverse0 and a separate "
                                   f"reduction)")
        if op_name(reduce_op) not in TENSOR_SCALAR_REDUCE:
            raise KernelUsageError(f"{api}: reduce_op must be one of nl.add, nl.multiply, nl.maximum, nl.minimum; "
                                   f"got {getattr(reduce_op, '__name__', reduce_op)!r}")
        loads = int(reduce_cmd) == LOAD_REDUCE
        if loads != (reduce_init is not None):
            raise KernelUsageError(f"{api}: reduce_init must be given exactly when reduce_cmd is load_reduce (got "
                                   f"reduce_cmd={reduce_cmd!r}, reduce_init="
                                   f"{'set' if reduce_init is not None else None})")
    values = ins.tensor_scalar(api, data, op0, operand0, reverse0, selected=out.selected)
    result = out.put(values, data.dtype)
    accumulate_into(out, reduce_op, values, reduce_cmd, reduce_res, initial=reduce_init, negate=reduce_res_negate,
                    masked=True)
    return result


CUMULATIVE_DTYPES = (dt.bfloat16, dt.float16, dt.float32, dt.float8_e4m3, dt.float8_e5m2, dt.uint8, dt.uint16,
                     dt.int8, dt.int16)


def tensor_scalar_cumulative(out, src, op0, op1, imm0, imm1=None, reduce_cmd=RESET_REDUCE):
    """``dst[:, i] = acc = op1(op0(src[:, i], imm0), acc)`` along the free axis on the Vector engine, the
    accumulator starting per ``reduce_cmd`` (reset_reduce: op1's identity, reduce: where the last Vector-engine
    accumulation left it, load_reduce: ``imm1``)."""
    api = out.api
    if out.selected is not None:
        raise UnsupportedError("nki.isa.tensor_scalar_cumulative with a mask")
    out.on_chip(src, "src")
    if out.current:
        for x, arg in ((src, "src"), (out.dst, "dst")):
            if x.dtype not in CUMULATIVE_DTYPES:
                raise KernelUsageError(f"{api}: {arg} dtype must be one of {', '.join(map(str, CUMULATIVE_DTYPES))}"
                                       f", got {x.dtype}")
        if trace.listening:
            trace.engine(VECTOR)
    values = read(src, api, "src")
    return out.put(ins.tensor_scalar_cumulative(api, values, op0, imm0, op1, imm1, reduce_cmd))


EXP_DST = (dt.float8_e4m3, dt.float8_e5m2, dt.float16, dt.bfloat16, dt.float32, dt.int8, dt.int16, dt.int32,
           dt.uint8, dt.uint16)
EXP_REDUCE_RES = (dt.float8_e4m3, dt.float8_e5m2, dt.float16, dt.bfloat16, dt.float32)


def exponential(out, src, max_value=0.0, reduce_res=None, reduce_cmd=IDLE, reduce_init=0.0):
    """``exp(src - max_value)`` on the Vector engine (NeuronCore-v4 and newer); under ``reduce_cmd`` the row
    sums go into the Vector engine's accumulators (reset_reduce: from 0, reduce: on top, load_reduce: from
    ``reduce_init``), which ``reduce_res`` receives."""
    api = out.api
    require_v4(api)
    out.on_chip(src, "src")
    no_packed(api, src)
    dtype = out.out_dtype(dt.float32)
    if dtype not in EXP_DST:
        raise KernelUsageError(f"{api}: dst dtype must be one of {', '.join(map(str, EXP_DST))}, got {dtype}")
    if reduce_res is not None and reduce_res.dtype not in EXP_REDUCE_RES:
        raise KernelUsageError(f"{api}: reduce_res dtype must be one of {', '.join(map(str, EXP_REDUCE_RES))}, got "
                               f"{reduce_res.dtype}")
    loads = int(reduce_cmd) == LOAD_REDUCE
    if not loads and (alu.is_tile(reduce_init) or float(reduce_init) != 0.0):
        raise KernelUsageError(f"{api}: reduce_init is used only with reduce_cmd=load_reduce; leave it 0.0 with "
                               f"{reduce_cmd!r}")
    if int(reduce_cmd) == RESET:
        raise KernelUsageError(f"{api}: reduce_cmd must be idle, reset_reduce, reduce or load_reduce, got "
                               f"{reduce_cmd!r}")
    values = ins.exponential(api, src, max_value)
    result = out.put(values, src.dtype)
    accumulate_into(out, np.add, values, reduce_cmd, reduce_res, initial=reduce_init if loads else None)
    return result


def bn_stats(out, data):
    """Per partition: (count, mean, count * variance) of the even- and of the odd-indexed elements, six values;
    under a legacy mask only the selected elements count (a partition with none selected keeps poison)."""
    out.on_chip(data, "data")
    stats, rows = ins.bn_stats(out.api, data, out.selected)
    return out.put(stats, dt.float32, where=rows)


def bn_aggr(out, data):
    """Combine ``bn_stats`` outputs (P, 6k) into per-partition (mean, population variance) (P, 2)."""
    out.on_chip(data, "data")
    return out.put(ins.bn_aggr(out.api, data, out.selected), dt.float32, where=None)


# --------------------------------------------------------------- Vector engine: selects, top-8

def range_select(out, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=RESET_REDUCE, reduce_res=None,
                 reduce_op=None, range_start=0, on_false_value=None):
    """Keep element ``j`` of partition ``p`` where ``comp_op0(j + range_start, bound0[p])`` and
    ``comp_op1(j + range_start, bound1[p])``, else ``on_false_value`` (default fp32 min); the result's
    free-axis reduction (default max) goes to the Vector engine's accumulators (NeuronCore-v3 and newer)."""
    api = out.api
    config = active_config()
    if config.nc_version < 3:
        raise KernelUsageError(f"{api} needs NeuronCore-v3 (trn2) or newer, the target is {config.target}")
    values = read(out.on_chip(on_true_tile, "on_true_tile"), api, "on_true_tile", out.selected)
    false_value = ins.FP32_MIN if on_false_value is None else on_false_value
    result = ins.range_select(api, values, comp_op0, comp_op1, bound0, bound1, range_start, false_value)
    if out.current:
        written = out.put(result)
    accumulate_into(out, np.maximum if reduce_op is None else reduce_op, result, reduce_cmd, reduce_res)
    return written if out.current else out.put(result.reshape(values.shape), on_true_tile.dtype)


def select_reduce(out, predicate, on_true, on_false, reduce_res=None, reduce_cmd=IDLE, reduce_op=None,
                  reverse_pred=False):
    """``where(predicate, on_true, on_false)`` (``on_false`` a scalar or (P, 1)), with the result's free-axis
    reduction (default max) into the Vector engine's accumulators (``reduce_cmd``) and ``reduce_res``."""
    api = out.api
    pred = _predicate(out, predicate, SELECT_PREDICATES)
    if out.current:
        ins.check_select_reduce_dtypes(api, out.on_chip(on_true, "on_true"),
                                       reduce_res if alu.is_tile(reduce_res) else None)
    if getattr(on_true, "buffer", None) is memory.psum and getattr(predicate, "buffer", None) is memory.psum:
        raise MemorySpaceError(f"{api}: predicate and on_true cannot both be in PSUM")
    raw = read(on_true, api, "on_true", out.selected)
    result = _selected(api, pred, raw, on_false, reverse_pred)
    if out.current:
        written = out.put(result)
        if (_run.recordings and int(reduce_cmd) == IDLE and reduce_res is None
                and isinstance(on_false, (int, float)) and ins.live([predicate, on_true], [pred, raw])):
            _form(out, result.shape, _selected, api, pred, raw, on_false, reverse_pred)
    accumulate_into(out, np.maximum if reduce_op is None else reduce_op, result, reduce_cmd, reduce_res)
    return written if out.current else out.put(result)


def _selected(api: str, pred: np.ndarray, on_true: np.ndarray, on_false, reverse_pred) -> np.ndarray:
    """``select_reduce``'s values: its array form too, where there is no reduction and ``on_false`` is a scalar."""
    return ins.select(api, pred, dt.to_f32(on_true), on_false, reverse_pred)


def tensor_copy_predicated(out, src, predicate, reverse_pred=False):
    """Copy ``src`` (a tile or a scalar) into dst where ``predicate`` is nonzero (zero with ``reverse_pred``);
    elsewhere dst keeps its values."""
    api, dst = out.api, out.dst
    pred = _predicate(out, predicate, COPY_PREDICATES)
    if alu.is_tile(src) and src.dtype != dst.dtype:
        raise KernelUsageError(f"{api}: src ({src.dtype}) and dst ({dst.dtype}) must have the same dtype")
    values = value_of(src, api, "src", out.selected)
    current = dst.data if out.current else read(dst, api, "dst", out.selected)
    result = ins.copy_predicated(api, pred, values, current, reverse_pred)
    if _run.recordings and out.current and ins.live([src, predicate, dst], [values, pred, current]):
        _form(out, result.shape, ins.copy_predicated, api, pred, values, current, reverse_pred)
    return out.put(result)


def max8(out, src):
    """The 8 largest values of each partition in descending order, [P, 8]."""
    values = read(out.on_chip(src, "src"), out.api, "src", out.selected)
    return out.put(ins.max8(out.api, values, _keep(out.selected, values.shape)), src.dtype, where=None)


INDEX_DTYPES = (dt.uint16, dt.uint32)


def nc_find_index8(out, data, vals):
    """Per partition, the index of the first occurrence of each of the 8 ``vals`` in ``data`` (a legacy mask
    restricts the elements searched): uint32 or uint16, all ones for a value not found."""
    api = out.api
    dtype = out.out_dtype(dt.uint32)
    if dtype not in INDEX_DTYPES:
        # The page: "The output will contain exactly 8 elements per partition and will be uint16 or uint32 type."
        raise KernelUsageError(f"{api}: dst holds indices, so it must be uint16 or uint32; got dst '{out.dst.name}' "
                               f"in {dtype}" if out.current else f"{api}: indices are uint16 or uint32, got "
                               f"dtype={dtype}")
    values = read(out.on_chip(data, "data"), api, "data", out.selected)
    index = ins.find_index8(api, values, read(out.on_chip(vals, "vals"), api, "vals"), _keep(out.selected,
                                                                                           values.shape))
    return out.put_raw(index, dt.uint32)


def nc_match_replace8(out, data, vals, imm, dst_idx=None):
    """``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced by ``imm`` (duplicates
    matched in reverse; a legacy mask restricts the elements searched); the matched positions go to
    ``dst_idx`` when given."""
    api = out.api
    values = read(out.on_chip(data, "data"), api, "data", out.selected)
    keep = _keep(out.selected, values.shape)
    result, index = ins.match_replace8(api, values, read(out.on_chip(vals, "vals"), api, "vals"), imm, keep)
    if out.current:
        written = out.put(result)
    if dst_idx is not None:
        out.also(dst_idx, "dst_idx").put_raw(index)
    return written if out.current else out.put(result, data.dtype, where=keep)


def nc_stream_shuffle(out, src, shuffle_mask):
    """Within each 32-partition quadrant, partition ``i`` of dst becomes partition ``shuffle_mask[i]`` of
    ``src``; 255 (and in legacy masked-off elements) leave dst's partition as it is."""
    api, dst = out.api, out.dst
    values = read(out.on_chip(src, "src"), api, "src")
    if out.current:
        return out.put(ins.stream_shuffle(api, values, dst.data, shuffle_mask))
    shape = tuple(dst.shape)
    result = ins.stream_shuffle(api, values, np.zeros(shape, values.dtype), shuffle_mask)
    rows = np.array([int(shuffle_mask[p % 32]) != 255 for p in range(shape[0])])
    written = np.broadcast_to(rows.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    if out.selected is not None:
        written = written & mask_for(out.selected, shape)
    return out.put(result, where=written)


# ---------------------------------------------------------------------------------- GpSimd engine

def local_gather(out, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None):
    """Gather within each GpSimd core's 16 partitions (``core.gpsimd.local_gather``): the output keeps
    ``src_buffer``'s dtype; indices are uint16."""
    api, dst = out.api, out.dst
    if out.selected is not None:
        raise UnsupportedError("nki.isa.local_gather with a mask")
    if out.current:
        sbuf_operand(dst, api, "dst")
    if index.dtype != dt.uint16:
        raise KernelUsageError(f"{api}: index must be uint16, got {index.dtype}")
    if out.current and dst.dtype != src_buffer.dtype:
        raise KernelUsageError(f"{api}: dst ({dst.dtype}) must have src_buffer's dtype ({src_buffer.dtype}); "
                               f"local_gather does not cast")
    values, indices = gpsimd_read(out, src_buffer, "src_buffer"), gpsimd_read(out, index, "index")
    if out.current and trace.listening:
        trace.engine(GPSIMD)
    result = gpsimd.local_gather(api, values, indices, int(num_elem_per_idx), num_valid_indices)
    if out.current:
        if dst.shape[0] != result.shape[0] or dst.size != result.size:
            raise KernelUsageError(f"{api}: dst {list(dst.shape)} must hold {result.shape[0]} partitions of "
                                   f"{result.shape[1]} gathered elements")
        result = result.reshape(dst.shape)
    return out.put(result, src_buffer.dtype, where=None)


def sequence_bounds(out, segment_ids):
    """For segment ids [1, n], each element's segment start and end, [1, 2, n] (``core.gpsimd.sequence_bounds``);
    float32 or int32."""
    api, dst = out.api, out.dst
    if out.current:
        sbuf_operand(dst, api, "dst")
    dtype = out.out_dtype(segment_ids.dtype)
    for kind, arg in ((segment_ids.dtype, "segment_ids"), (dtype, "dst" if out.current else "dtype")):
        if kind not in (dt.float32, dt.int32):
            raise KernelUsageError(f"{api}: {arg} must be float32 or int32, got {kind}")
    ids = gpsimd_read(out, segment_ids, "segment_ids")
    if ids.shape[0] != 1 or (out.current and dst.shape[0] != 1):
        shown = f" and dst {list(dst.shape)}" if out.current else ""
        raise KernelUsageError(f"{api}: the partition size must be 1, got segment_ids {list(segment_ids.shape)}"
                               f"{shown}")
    if out.current:
        if dst.size != 2 * ids.size:
            raise KernelUsageError(f"{api}: dst {list(dst.shape)} must hold 2 x {ids.size} values ([1, 2, n])")
        if trace.listening:
            trace.engine(GPSIMD)
    bounds = gpsimd.sequence_bounds(api, ids[0])
    return out.put(bounds.reshape(dst.shape if out.current else (1, 2, -1)), dtype, where=None)


def affine_values(partitions, pattern, offset, channel_multiplier, api) -> np.ndarray:
    """``offset + p * channel_multiplier + sum(step_k * i_k)`` over a [[step, num], ...] access pattern (the
    current API's iota and affine_select), int32 values."""
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



def affine_select(out, keep, on_true_tile, on_false_value, cmp_op=None):
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value``: ``keep`` is the legacy
    predicate's values, or (current) a function of dst's partition count giving the affine values, compared
    with 0 by ``cmp_op`` (default: equal) once the operands are checked. The current page (2.32) keeps both
    in SBUF; the legacy compiler moves a PSUM ``on_true_tile`` (the public flash-attention kernels select
    straight from the matmul's PSUM tile), its page naming no restriction."""
    api, dst = out.api, out.dst
    if out.current:
        if dst.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand 'dst' of '{api}' to be in address space 'sbuf'")
        out.on_chip(on_true_tile, "on_true_tile")
        if on_true_tile.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand 'on_true_tile' of '{api}' to be in address space 'sbuf', but "
                                   f"got a tensor in '{on_true_tile.buffer.space}' instead (tensor "
                                   f"'{on_true_tile.name}'; copy it to SBUF with nisa.tensor_copy first)")
    if callable(keep):
        affine = keep(dst.shape[0])
        keep = (alu.COMPARE["equal"] if cmp_op is None else ins.alu_op(cmp_op, api)[1])(affine, 0)
    values = ins.affine_select(api, keep, on_true_tile, on_false_value, out.selected)
    if _run.recordings and isinstance(on_true_tile, Tensor):
        _form(out, values.shape, ins.selected_values, replay.array_of(on_true_tile),
              ins.select_mask(api, keep, values.shape), on_false_value)
    return out.put(values, on_true_tile.dtype)


def iota(out, values):
    """Index values as a tile: the legacy API's evaluated ``nl.arange``/``nl.mgrid`` expression, or (current)
    a function of dst's partition count giving an access pattern's values; the current dst is in SBUF."""
    if out.current and out.dst.buffer is not memory.sbuf:
        raise MemorySpaceError(f"Expected operand 'dst' of '{out.api}' to be in address space 'sbuf', got "
                               f"'{out.dst.buffer.space}'")
    return out.put(values(out.dst.shape[0]) if callable(values) else values)


def nonzero_with_count(out, src, index_offset=0, padding_val=-1):
    """Per GpSimd core (partitions 0, 16, ..., 112 only; other partitions of dst untouched): the positions of
    src's nonzero elements plus ``index_offset``, then ``padding_val``, then the count (dst has one more free
    element than src). trn2 and later."""
    api, dst = out.api, out.dst
    if active_config().nc_version < 3:
        raise KernelUsageError(f"{api} needs trn2 or later, target is {active_config().target}")
    for x, arg in ((src, "src"), (dst, "dst")):
        if x.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', got "
                                   f"'{x.buffer.space}'")
    values = read(src, api, "src").reshape(src.shape[0], -1)
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
    return out.put(result.reshape(dst.shape))


def nc_n_gather(out, data, indices):
    """Per partition, ``data.flatten()[indices]`` (free dims flattened; uint32 indices; all SBUF; dst has data's
    dtype)."""
    api, dst = out.api, out.dst
    for x, arg in ((data, "data"), (indices, "indices"), (dst, "dst")):
        out.on_chip(x, arg)
        if x.buffer is not memory.sbuf:
            raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'sbuf', got "
                                   f"'{x.buffer.space}'")
    if indices.dtype != dt.uint32:
        raise KernelUsageError(f"{api}: indices must be uint32, got {indices.dtype}")
    if dst.dtype != data.dtype:
        raise KernelUsageError(f"{api}: dst ({dst.dtype}) must have data's dtype ({data.dtype})")
    values, where = read(data, api, "data"), read(indices, api, "indices")
    if dst.shape[0] != values.shape[0] or where.size != dst.size:
        raise KernelUsageError(f"{api}: data {list(data.shape)}, indices {list(indices.shape)} and dst "
                               f"{list(dst.shape)} must share partitions, indices giving dst's elements")
    return out.put(ins.gather_flattened(api, values, where, data.name))


def topk(values_out, index_out, src, n):
    """The K largest bf16 values of each 16-partition snake, ascending, into ``values_out``, and their snake
    positions (uint32) into ``index_out`` (two ``Dst``); K is the values' free size (``core.gpsimd.topk``)."""
    api, val_dst, idx_dst = values_out.api, values_out.dst, index_out.dst
    sbuf_operand(val_dst, api, "val_dst")
    sbuf_operand(idx_dst, api, "idx_dst")
    for x, arg, dtype in ((src, "src", dt.bfloat16), (val_dst, "val_dst", dt.bfloat16),
                          (idx_dst, "idx_dst", dt.uint32)):
        if x.dtype != dtype:
            raise KernelUsageError(f"{api}: {arg} must be {dtype}, got {x.dtype}")
    values = dt.to_f32(gpsimd_read(values_out, src, "src"))
    if val_dst.ndim != 2 or idx_dst.shape != val_dst.shape or val_dst.shape[0] != values.shape[0]:
        raise KernelUsageError(f"{api}: val_dst and idx_dst must both be [par_dim, K] with src's "
                               f"{values.shape[0]} partitions; got {list(val_dst.shape)} and {list(idx_dst.shape)}")
    if trace.listening:
        trace.engine(GPSIMD)
    top, positions, written = gpsimd.topk(api, values, int(n), val_dst.shape[1])
    # Slots outside the output snake keep what dst held.
    values_out.put(np.where(written, top, dt.to_f32(val_dst.data)))
    return index_out.put(np.where(written, positions, idx_dst.data.astype(np.int64)))


replay.steps(globals(), helpers=("float32_operand", "accumulate_into", "sbuf_operand", "gpsimd_read",
                                 "affine_values"))  # every instruction's outermost call is a replay step
