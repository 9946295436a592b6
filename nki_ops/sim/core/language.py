"""The meaning of the ``nl`` (``nki.language``) functions, written once for both API generations.

A front end spells each function (its signature, returned tiles and ``mask=`` in the legacy API) and
calls in here with its :class:`Rules`: where a result lands, and what its generation's API pages say
differently about the same function (a reduction's result dtype and shape, a select's dtype, which
operands the compiler copies first). ``mask`` is the legacy ``mask=`` argument (the current API passes
None). The current API's element-wise functions lower to the ISA instructions (``lowered_unary``,
``lowered_binary``); the legacy ones compute as ``instructions.elementwise`` does.
"""

from __future__ import annotations

import builtins
import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import alu, instructions, random, replay, tensors, trace
from . import dtypes as dt
from . import run as _run
from .errors import KernelUsageError, MemorySpaceError, TileLimitError, UnsupportedError
from .indexing import mask_values
from .memory import fit, hbm_values, new_tensor, psum, read, require_on_chip, sbuf, tile_from_values, value_of, write
from .run import active_config, current_run, unfit, violation
from .tensors import Access, MaskedOperand, Tensor


@replay.static
@dataclass(frozen=True)
class Rules:
    """One API generation's ``nl`` functions, where the two generations' pages differ."""

    # (values, dtype, api, buffer=sbuf, mask=None) -> the new tensor holding a result (legacy: poison outside mask)
    place: Callable
    as_dtype: Callable  # a dtype argument as one of the generation's dtypes
    partition_hint: str  # what the error of a reduction along the partition axis suggests instead
    checks_operands: bool  # current: operands are on-chip tensors, checked first; rms_norm computes in fp32 only
    int_mean_dtype: np.dtype | None  # nl.mean/var of integers: float32 (legacy), else x's dtype
    all_dtype: np.dtype | None  # nl.all: bool_ (legacy), else x's dtype
    reduced_2d: bool  # current: results keep (P, 1) and fold further free axes; nl.var always keeps dims
    promoting_where: bool  # legacy: nl.where defaults to the promoted dtype of x and y, (P,) as (P, 1) columns;
    # current: to x's dtype (y's for a scalar x), integers selected exactly
    copies_psum: bool  # legacy: the compiler copies PSUM operands to SBUF and transposes nl.matmul's x itself
    lnc: bool  # current: a launch is one to LNC ranks on one axis (axis 0 when unlaunched), not an SPMD grid


# nl functions besides the element-wise ones that are ALU operator constants of ISA calls too (op=nl.invert).
OPERATORS = {"sum": ("add", np.add), "max": ("maximum", np.maximum), "min": ("minimum", np.minimum),
             "invert": ("invert", np.invert), "logical_not": ("logical_not", np.logical_not),
             "copy": ("copy", lambda v: v)}


def operator_constants(namespace: dict) -> None:
    """Make the ``OPERATORS`` functions of an ``nl`` module operator constants."""
    for name, alu_op in OPERATORS.items():
        namespace[name].alu = alu_op


def named(op, name: str, doc: str, alu_op=None):
    """``op`` as the ``nl`` function ``name``; ``alu_op`` (name, function) makes it an operator constant too."""
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    if alu_op is not None:
        op.alu = alu_op
    return op


def define(namespace: dict, make, *tables) -> None:
    """Define ``make(name, fn)`` in ``namespace`` for each operator of the ``alu`` tables."""
    for table in tables:
        for name, fn in table.items():
            namespace[name] = make(name, fn)


def operand(rules: Rules, x, api: str, arg: str):
    """The current API checks that an operand is an on-chip tensor before anything else."""
    if rules.checks_operands:
        if not alu.is_tile(x):
            raise KernelUsageError(f"operand '{arg}' of '{api}' must be a tensor, got {type(x).__name__}")
        require_on_chip(x, api, arg)
    return x


def out_dtype(dtype, default):
    return default if dtype is None else dtype


# ------------------------------------------------------------------------------- reductions

def free_axes(api: str, x, axis, rules: Rules) -> tuple[int, ...]:
    """``axis`` (an int or a sequence) as free axes of ``x``; the partition axis cannot be reduced."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % x.ndim for a in axes)
    if 0 in axes:
        raise KernelUsageError(f"{api}: reducing along the partition dimension (axis 0) is not supported; "
                               f"{rules.partition_hint}")
    return axes


def f32_within_mask(x, api: str, selected):
    """fp32 values of tile ``x``; under a mask, a masked array so reductions skip excluded elements."""
    values = dt.to_f32(read(x, api, "x", selected))
    if selected is None:
        return values
    return np.ma.masked_array(values, mask=~np.broadcast_to(selected, values.shape))


def unmasked(result, dtype) -> np.ndarray:
    """Results with every input element masked out hold poison."""
    # Only a masked reduction made a masked array, and importing numpy.ma to ask costs a process 7 ms.
    if "numpy.ma" in sys.modules and np.ma.isMaskedArray(result):
        return np.ma.filled(result, active_config().fill_value(dt.as_dtype(dtype)))
    return np.asarray(result)


# fp32 NumPy reductions: np.sum/max/min/prod are the add/maximum/minimum/multiply reductions of
# nisa.tensor_reduce, bit for bit.
REDUCTIONS = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod, "var": np.var,
              "all": lambda v, axis, keepdims: np.all(v != 0, axis=axis, keepdims=keepdims)}


def reduce(rules: Rules, name: str, x, axis, dtype=None, keepdims=False, mask=None):
    """``nl.sum``/``max``/``min``/``mean``/``prod``/``var``/``all`` along free axes, computed in fp32; the
    result dtype and shape follow the generation's rules (``int_mean_dtype``, ``all_dtype``, ``reduced_2d``)."""
    api = f"nl.{name}"
    operand(rules, x, api, "x")
    axes = free_axes(api, x, axis, rules)
    values = f32_within_mask(x, api, mask_values(mask))
    if dtype is None:
        if name == "all" and rules.all_dtype is not None:
            dtype = rules.all_dtype
        elif name in ("mean", "var") and x.dtype.kind in "iub" and rules.int_mean_dtype is not None:
            dtype = rules.int_mean_dtype
        else:
            dtype = x.dtype
    with np.errstate(all="ignore"):
        result = REDUCTIONS[name](values, axis=axes, keepdims=keepdims or rules.reduced_2d)
    if rules.reduced_2d and not keepdims and name != "var" and result.ndim > 2:
        result = result.reshape(result.shape[0], -1)
    return rules.place(unmasked(result, dtype), dtype, api)


def reduction(rules: Rules, name: str, spell):
    """The ``nl`` reduction ``name``: ``spell(reduce_it)`` gives the generation's signature."""
    op = spell(lambda x, axis, dtype, keepdims, mask=None: reduce(rules, name, x, axis, dtype, keepdims, mask))
    return named(op, name, f"{name} along free axes ``axis`` (partition axis excluded), computed in fp32.")


def softmax(rules: Rules, x, axis, dtype=None, mask=None):
    """exp(x - max) / sum(exp(x - max)) along free ``axis``, in fp32."""
    api = "nl.softmax"
    operand(rules, x, api, "x")
    axes = free_axes(api, x, axis, rules)
    selected = mask_values(mask)
    values = f32_within_mask(x, api, selected)
    with np.errstate(all="ignore"):
        shifted = np.exp(values - values.max(axis=axes, keepdims=True))
        result = shifted / shifted.sum(axis=axes, keepdims=True)
    dtype = out_dtype(dtype, x.dtype)
    return rules.place(unmasked(result, dtype), dtype, api, mask=selected)


def rms_norm(rules: Rules, x, w, axis, n, epsilon, dtype=None, compute_dtype=None, mask=None):
    """x / sqrt(sum(x^2, axis) / n + epsilon) * w, in fp32."""
    api = "nl.rms_norm"
    operand(rules, x, api, "x")
    if rules.checks_operands and compute_dtype is not None and np.dtype(compute_dtype) != dt.float32:
        raise UnsupportedError(f"{api}(compute_dtype={np.dtype(compute_dtype)})", "it computes in float32")
    axes = free_axes(api, x, axis, rules)
    selected = mask_values(mask)
    values = f32_within_mask(x, api, selected)
    weight = dt.to_f32(value_of(w, api, "w"))
    try:
        result = instructions.rms_norm(values, weight, axes, n, epsilon)
    except ValueError:
        raise KernelUsageError(f"{api}: w of shape {list(np.shape(weight))} does not broadcast against x "
                               f"{list(values.shape)}") from None
    dtype = out_dtype(dtype, x.dtype)
    return rules.place(unmasked(result, dtype), dtype, api, mask=selected)


# ----------------------------------------------------------------------- selects and bit ops

def where(rules: Rules, condition, x, y, dtype=None, mask=None):
    """``x`` where ``condition`` is non-zero, else ``y``."""
    api = "nl.where"
    selected = mask_values(mask)
    cond = value_of(condition, api, "condition", selected)
    a, b = (value_of(v, api, n, selected) for v, n in ((x, "x"), (y, "y")))
    if rules.promoting_where:
        dtype = out_dtype(dtype, dt.result_dtype((a.dtype, b.dtype)))
        cond, a, b = instructions.as_columns([cond, a, b])
    else:
        dtype = dtype or (x.dtype if alu.is_tile(x) else y.dtype)
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":  # a select copies: integers stay exact
            return rules.place(np.where(cond != 0, a, b), dtype, api)
    return rules.place(np.where(cond != 0, dt.to_f32(a), dt.to_f32(b)), dtype, api, mask=selected)


def invert(rules: Rules, x, dtype=None, mask=None):
    """Bitwise NOT of an integer tensor (logical NOT of a bool one)."""
    if not rules.checks_operands:
        return instructions.invert(x, dtype=dtype, mask=mask)
    values = read(operand(rules, x, "nl.invert", "x"), "nl.invert", "x")
    if values.dtype.kind not in "iub":
        raise KernelUsageError(f"nl.invert needs an integer or bool tensor, got {values.dtype}")
    return rules.place(np.invert(values), dtype or x.dtype, "nl.invert")


def logical_not(rules: Rules, x, dtype=None, mask=None):
    """1 where ``x`` is 0, else 0; ``dtype`` defaults to bool_ (legacy page) or x's dtype (current page)."""
    if not rules.checks_operands:
        return instructions.elementwise("nl.logical_not", np.logical_not, (x,), ("x",), dtype, mask)
    operand(rules, x, "nl.logical_not", "x")
    return rules.place(np.logical_not(read(x, "nl.logical_not", "x")), dtype or x.dtype, "nl.logical_not")


def copy(rules: Rules, x, dtype=None, mask=None, arg="x"):
    """A copy of ``x`` (bit-exact for equal dtypes) into a new SBUF tile."""
    selected = mask_values(mask)
    values = read(operand(rules, x, "nl.copy", arg), "nl.copy", arg, selected)
    return rules.place(values, out_dtype(dtype, x.dtype), "nl.copy", mask=selected)


# ---------------------------------------------------------------------------- current lowering

def lowered_unary(rules: Rules, name: str, op, x, dtype=None):
    """The current API's element-wise ``nl.<name>(x)``: ``nisa.activation`` into a new SBUF tensor."""
    api = f"nl.{name}"
    operand(rules, x, api, "x")
    if name == "rsqrt" and x.buffer is psum:
        # NKI 0.5.0 release notes and migration guide: nl.rsqrt "now runs on the GpSimd Engine ... and no
        # longer accepts PSUM inputs".
        raise MemorySpaceError(f"Expected operand 'x' of '{api}' to be in address space 'sbuf', but got a tensor "
                               f"in 'psum' instead (tensor '{x.name}'; nl.rsqrt runs on the GpSimd engine; use "
                               f"nisa.activation(op=nl.rsqrt) for a PSUM input)")
    # nl.sin "applies additional instructions to perform range reduction before the activation"
    # (nki.api.shared page), unlike nisa.activation(op=nl.sin)
    values = instructions.activation(api, op, x, range_reduced=True)
    return rules.place(values, dtype or x.dtype, api)


def lowered_binary(rules: Rules, name: str, op, x, y, dtype=None):
    """The current API's element-wise ``nl.<name>(x, y)``: ``nisa.tensor_tensor`` of two tensors (GpSimd's
    exact integer arithmetic for int32), ``nisa.tensor_scalar`` of a tensor and a scalar."""
    api = f"nl.{name}"
    if alu.is_tile(x) and alu.is_tile(y):
        operand(rules, x, api, "x"), operand(rules, y, api, "y")
        if x.size != y.size:
            # NKI 0.4.0 release notes, known issues (carried into 0.5.0 and 0.6.0): "Binary operations do not
            # support broadcasting - Operations like nl.add(a, b) require both operands to have the same shape."
            raise KernelUsageError(f"{api}: the nl binary operations do not broadcast; x and y must have the same "
                                   f"shape, got {list(x.shape)} and {list(y.shape)} (use nisa.tensor_scalar for "
                                   f"a (P, 1) operand, or nl.broadcast_to)")
        if x.dtype in instructions.INT32 and y.dtype in instructions.INT32:  # the lowering: nisa.tensor_tensor
            out = rules.as_dtype(dtype or dt.promote(x.dtype, y.dtype))
            if instructions.gpsimd_integer(instructions.UNKNOWN, op, (x, y), out):
                return rules.place(instructions.integer_tensor_tensor(api, x, y, op, out), out, api)
        values, promoted = instructions.tensor_tensor(api, x, y, op)
    elif alu.is_tile(x) or alu.is_tile(y):
        tile, scalar = (x, y) if alu.is_tile(x) else (y, x)
        operand(rules, tile, api, "x")
        if name == "power" and alu.is_tile(x):
            # NKI 0.4.0 release notes, known issues (carried into 0.6.0): "nki.language.power does not support
            # scalar exponents - nl.power(tile, scalar) is not supported."
            raise KernelUsageError(f"{api}: a scalar exponent is not supported; got nl.power(tile, {y!r}) (pass "
                                   f"the exponent as a tile of x's shape: nl.power(tile, tile))")
        values = instructions.tensor_scalar(api, tile, op, scalar, reverse0=not alu.is_tile(x))
        promoted = tile.dtype
    else:
        raise KernelUsageError(f"{api} needs at least one tensor operand")
    return rules.place(values, dtype or promoted, api)


# ------------------------------------------------------------------------------ Tensor engine

def masked_operands(api: str, stationary, moving):
    """Operand masking (``lhs_T[i_f < 64]``, legacy) restricts an operand's free axis, hence the result
    rows (stationary) or columns (moving) computed; a masked operand is read only where selected.
    Returns the operands as tiles and the result elements selected (None: all)."""
    tiles, free = [], []
    for x, arg in ((stationary, "stationary"), (moving, "moving")):
        if not isinstance(x, MaskedOperand):
            tiles.append(x)
            free.append(None)
            continue
        shape = tuple(x.shape)
        keep = tensors.mask_for(x.mask.values, shape).reshape(shape[0], -1)
        if not np.array_equal(keep.any(axis=0), keep.all(axis=0)):
            raise UnsupportedError(f"{api} with an operand mask on the contraction (partition) axis of '{arg}'",
                                   "mask the free axis")
        values = read(x.operand, api, arg, x.mask.values)
        tiles.append(tile_from_values(values, x.dtype, api, account=False))
        free.append(keep.any(axis=0))
    rows, cols = free
    if rows is None and cols is None:
        return tiles[0], tiles[1], None
    selected = np.ones((math.prod(tiles[0].shape[1:]), math.prod(tiles[1].shape[1:])), bool)
    if rows is not None:
        selected &= rows[:, None]
    if cols is not None:
        selected &= cols[None, :]
    return tiles[0], tiles[1], selected


def matmul(rules: Rules, x, y, transpose_x=False, mask=None):
    """``x.T @ y`` (``x @ y`` with ``transpose_x=False``, legacy only) into a new fp32 PSUM tile; masked
    operands (legacy ``x[mask]``, ``y[mask]``) restrict the result elements computed."""
    api = "nl.matmul"
    if mask is not None:
        raise UnsupportedError("nl.matmul(mask=...)", "index the operands to the valid region instead")
    if not transpose_x and not rules.copies_psum:
        raise UnsupportedError("nl.matmul(transpose_x=False)", "documented as unsupported in the current API; "
                                                               "pass x already transposed with transpose_x=True")
    if isinstance(x, MaskedOperand) and not transpose_x:
        raise UnsupportedError("nl.matmul with a masked x and transpose_x=False", "pass x transposed")
    x, y, selected = masked_operands(api, x, y)
    if not transpose_x:
        x_values = read(x, api, "x")
        if x_values.ndim != 2 or builtins.max(x_values.shape) > 128:
            violation(TileLimitError(f"nl.matmul: x of shape {list(x_values.shape)} must be at most "
                                     f"128 x 128 to be transposed on the Tensor engine"))
        if trace.listening:
            trace.engine(instructions.TENSOR)  # x is transposed on the Tensor engine first
        x = tile_from_values(x_values.T.copy(), x.dtype, "nl.transpose")
    values = instructions.matmul(api, x, y, copies_psum=rules.copies_psum)
    return rules.place(values, dt.float32, api, buffer=psum, mask=selected)


def transpose(rules: Rules, x, dtype=None, mask=None):
    """Partition <-> free transpose on the Tensor engine: into PSUM (current), or a 2-D tile of at most
    128 x 128 the legacy compiler copies to SBUF (NaN/Inf spread on NeuronCore-v2, ``pe_transpose``)."""
    api = "nl.transpose"
    if not rules.copies_psum:
        values, _ = instructions.transpose(api, x, instructions.TENSOR)
        return rules.place(values, out_dtype(dtype, x.dtype), api, buffer=psum)
    selected = mask_values(mask)
    values = read(x, api, "x", selected)
    if values.ndim != 2:
        raise KernelUsageError(f"nl.transpose supports 2-D tiles only, got shape {list(values.shape)}")
    if builtins.max(values.shape) > 128:
        violation(TileLimitError(f"nl.transpose: size of dimension exceeds architecture limitation of 128 "
                                 f"(tile shape {list(values.shape)})"))
    if trace.listening:
        trace.engine(instructions.TENSOR)
    return rules.place(instructions.pe_transpose(values, selected), out_dtype(dtype, x.dtype), api)


def expand_dims(rules: Rules, x, axis):
    """``x`` with a size-1 axis: legacy, after the last one only, in a new tile; current, at ``axis`` of the
    expanded shape, as a view of ``x``."""
    api = "nl.expand_dims"
    if not rules.checks_operands:
        values = read(x, api, "data")
        if axis not in (values.ndim, -1):
            raise KernelUsageError(f"{api} only adds an axis after the last one (axis={values.ndim}), got axis={axis}")
        return rules.place(values[..., None], x.dtype, api)
    if not callable(getattr(x, "expand_dim", None)):  # a current-API tensor, which has views
        raise KernelUsageError(f"{api} needs a tensor, got {type(x).__name__}")
    if not -x.ndim - 1 <= axis <= x.ndim:
        raise KernelUsageError(f"{api}: axis {axis} is outside [{-x.ndim - 1}, {x.ndim}] for a tensor of shape "
                               f"{list(x.shape)}")
    return x.expand_dim(axis)


# ----------------------------------------------------------------------------------- gathers

def gather_flattened(rules: Rules, api: str, data, indices, dtype=None, axis=0):
    """Per partition, ``data``'s flattened free axes at ``indices`` (uint32), in a new tile of ``indices``'
    shape."""
    operand(rules, data, api, "data")
    operand(rules, indices, api, "indices")
    if axis != 0:
        raise UnsupportedError(f"{api}(axis={axis})", "the API page does not say what another axis gathers")
    if indices.dtype != dt.uint32:
        raise KernelUsageError(f"{api}: indices must be uint32, got {indices.dtype}")
    values = instructions.gather_flattened(api, read(data, api, "data"), read(indices, api, "indices"),
                                           getattr(data, "name", "data"))
    return rules.place(values, out_dtype(dtype, data.dtype), "nl.gather_flattened")


# ---------------------------------------------------------------------------------------- DMA
# nl.load, nl.store and nl.load_transpose2d are DMAs between HBM and SBUF. The legacy ones take a mask
# and cast directly, a rank-1 source (x[0:128, 3]) loading as a (P,) tile that instructions treat as a
# (P, 1) column; the current ones follow nisa.dma_copy (a cast goes through fp32, no PSUM), a rank-1
# source loading as a (1, N) row. Each generation words the HBM operand check its own way.

def hbm_operand(rules: Rules, x, api: str, arg: str) -> None:
    if not rules.checks_operands:
        require_hbm(x, api.removeprefix("nl."), arg)
    elif not alu.is_tile(x) or x.buffer.on_chip:
        raise KernelUsageError(f"{api}: {arg} must be an HBM tensor, got {getattr(x, 'buffer', type(x))!r}")


def load(rules: Rules, src, dtype=None, mask=None):
    """An HBM region in a new SBUF tile, cast to ``dtype``; one element lands in a (1, 1) tile."""
    api = "nl.load"
    hbm_operand(rules, src, api, "src")
    if not rules.checks_operands:
        selected = mask_values(mask)
        values = hbm_values(src, selected)
        values = values.reshape(1, 1) if values.ndim == 0 else values
        tile = rules.place(values, out_dtype(dtype, src.dtype), api, mask=selected)
        if _run.recordings and selected is None and isinstance(tile, Tensor) and instructions.live([src], [values]):
            replay.form(replay.into, tile.data, np.asarray, values, writes=(tile,))
        return tile
    values = hbm_values(src, None)
    if values.ndim < 2:
        values = values.reshape(1, -1) if values.ndim == 1 else values.reshape(1, 1)
    dtype = rules.as_dtype(dtype or src.dtype)
    return rules.place(instructions.dma_values(api, values, values.shape, dtype), dtype, api)


def store(rules: Rules, dst, value, mask=None) -> None:
    """An on-chip tile into an HBM region: legacy, from SBUF or PSUM (or a scalar) where ``mask`` holds;
    current, from SBUF (PSUM must be copied to SBUF first)."""
    api = "nl.store"
    if not rules.checks_operands:
        require_hbm(dst, "store", "dst")
        selected = mask_values(mask)
        values = value_of(value, "store", "value", selected if isinstance(value, Access) else None)
        write(dst, values, api, selected)
        if _run.recordings and selected is None and instructions.live([value], [values]):
            _store_form(dst, values)
        return None
    instructions.dma_operands(api, dst, value)
    if dst.buffer.on_chip:
        raise KernelUsageError(f"{api}: dst must be an HBM tensor, got a tensor in {dst.buffer!r}")
    write(dst, instructions.dma_values(api, read(value, api, "value"), dst.shape, dst.dtype), api)


def _store_form(dst, values: np.ndarray) -> None:
    """A legacy store's array form: the tile's values into the HBM view of ``dst`` (a tensor, or an access
    that is a strided slice of one)."""
    if isinstance(dst, Access):
        if dst.strided is None or dst.indirect or dst.offsets:
            return
        target, tensor = dst.tensor.data[dst.strided], dst.tensor
    else:
        target, tensor = dst.data, dst
    if values.shape == target.shape == tuple(dst.shape):
        replay.form(replay.into, target, np.asarray, values, writes=(tensor,))


def load_transpose2d(rules: Rules, src, dtype=None, mask=None):
    """A 2-D HBM region transposed (DMA transpose) into a new SBUF tile."""
    api = "nl.load_transpose2d"
    hbm_operand(rules, src, api, "src")
    legacy = None if rules.checks_operands else hbm_values(src, mask_values(mask))
    if src.ndim != 2:
        raise KernelUsageError(f"{api} needs a 2-D source, got shape {list(src.shape)}")
    if legacy is not None:
        return rules.place(np.ascontiguousarray(legacy.T), out_dtype(dtype, src.dtype), api)
    dtype = rules.as_dtype(dtype or src.dtype)
    values = np.ascontiguousarray(src.data.T)
    if trace.listening:  # nisa.dma_copy's record
        trace.engine(instructions.DMA)
        trace.read(src)
    return rules.place(instructions.dma_values(api, values, values.shape, dtype), dtype, api)


# ---------------------------------------------------------------------------- legacy HBM access

def require_hbm(x, api: str, arg: str) -> None:
    if not alu.is_tile(x):
        raise KernelUsageError(f"operand '{arg}' of '{api}' must be an HBM tensor, got {type(x).__name__}")
    if x.buffer.on_chip:
        raise MemorySpaceError(f"Expected operand '{arg}' of '{api}' to be in address space 'hbm', but got a "
                               f"tile in '{x.buffer.space}' instead (tensor '{x.name}')")


def atomic_rmw(dst, value, op, mask=None) -> None:
    """``dst = op(dst, value)`` on an indexed HBM tensor, element by element and atomically: every
    repeated (indirect) index applies its value. Only ``np.add``, as documented; fp32 arithmetic."""
    api = "atomic_rmw"
    require_hbm(dst, api, "dst")
    if instructions.op_name(op) != "add":
        raise KernelUsageError(f"{api}: only op=np.add is supported, got {getattr(op, '__name__', op)!r}")
    if not isinstance(dst, Access):
        raise KernelUsageError(f"{api}: dst must be an indexed HBM tensor (e.g. t[indices_tile, ix])")
    selected = mask_values(mask)
    values = fit(dt.to_f32(value_of(value, api, "value", selected)), tuple(dst.shape), dst.name, api)
    tensor = dst.tensor
    where_ = dst.gather(np.arange(tensor.data.size).reshape(tensor.shape))  # flat element of each access position
    if selected is not None:
        keep = tensors.mask_for(selected, where_.shape)
        where_, values = where_[keep], values[keep]
    if trace.listening:
        trace.write(dst, f"nl.{api}", mask=selected)
    total = dt.to_f32(tensor.data).reshape(-1)
    np.add.at(total, where_.reshape(-1), values.reshape(-1))
    tensor.data[...] = dt.cast(total.reshape(tensor.shape), tensor.dtype)


# ------------------------------------------------------------------------------ random numbers

def random_seed(seed) -> None:
    """Legacy ``nl.random_seed``: seeds ``nl.rand`` (a NumPy generator) and ``nl.dropout`` (the Vector
    engine's XORWOW generators)."""
    run = current_run("nl.random_seed")
    unfit("random numbers")
    value = int(np.asarray(seed.data if isinstance(seed, Tensor) else seed).ravel()[0])
    run.random = np.random.default_rng(value)
    random.set_seed(run, "vector", value)


def loop_reduce(x, op, dtype=None, mask=None):
    """Legacy ``nl.loop_reduce``: ``x`` to be combined into the tile it is assigned to, ``op(x, dst)``."""
    api = "nl.loop_reduce"
    _, fn, float_compute = instructions.alu_op(op, api)
    selected = mask_values(mask)
    values = read(x, api, "x", selected)
    tile = new_tensor(values.shape, out_dtype(dtype, x.dtype), sbuf, api=api, min_rank=1)  # a (P,) vector stays one
    if selected is not None:
        tile.written = tensors.mask_for(selected, values.shape).copy()
    tile.combine = (fn, dt.to_f32(values) if float_compute else values)
    return tile


# ------------------------------------------------------------------------------ launch grid

def program_id(rules: Rules, axis: int) -> int:
    run = current_run("nl.program_id")
    if rules.lnc:
        if axis != 0:
            raise KernelUsageError(f"nl.program_id({axis}): an LNC launch has one axis (0)")
        return run.program_id[0] if run.program_id else 0
    if not 0 <= axis < len(run.program_id):
        raise KernelUsageError(f"nl.program_id({axis}): the launch grid has {len(run.grid)} dimension(s)")
    return run.program_id[axis]


def num_programs(rules: Rules, axes=None) -> int:
    """Instances along ``axes`` (all of them: None); an LNC launch counts its ranks whatever ``axes``."""
    run = current_run("nl.num_programs")
    if rules.lnc:
        return run.grid[0] if run.grid else 1
    if axes is None:
        return math.prod(run.grid)
    if isinstance(axes, (tuple, list)):
        return math.prod(run.grid[a] for a in axes)
    if not 0 <= axes < len(run.grid):
        raise KernelUsageError(f"nl.num_programs({axes}): the launch grid has {len(run.grid)} dimension(s)")
    return run.grid[axes]


def program_ndim(rules: Rules) -> int:
    grid = current_run("nl.program_ndim").grid
    return (1 if grid else 0) if rules.lnc else len(grid)


def device_print(prefix, x, host=lambda v: v) -> None:
    """Print a tensor's values (an access's elements); ``host`` converts anything else first."""
    unfit("device_print")
    if isinstance(x, Access):
        values = x.read()
    else:
        values = x.data if isinstance(x, Tensor) else host(x)
    print(prefix, values)


replay.steps(globals(), helpers=("operator_constants", "named", "define", "operand", "out_dtype", "free_axes",
                                 "f32_within_mask", "unmasked", "reduction", "hbm_operand", "require_hbm",
                                 "masked_operands", "program_id", "num_programs", "program_ndim"))
# (every other function's outermost call is a replay step)
