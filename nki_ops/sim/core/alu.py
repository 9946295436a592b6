"""The ALU: element-wise operator tables (fp32 compute, integer bitwise ops) and the element-wise
instruction both front ends and the tile operators (``a + b``, ``a < b``) use.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from . import dtypes as dt
from .errors import KernelUsageError


def is_tile(x) -> bool:
    return isinstance(x, (memory.Tensor, indexing.Access))


def as_columns(values: list[np.ndarray]) -> list[np.ndarray]:
    """A reduced (P,) per-partition vector broadcasts as (P, 1) against 2-D tiles."""
    if builtins.max(v.ndim for v in values) >= 2:
        return [v[:, None] if v.ndim == 1 else v for v in values]
    return values


def elementwise(api: str, fn, operands, names, dtype, mask, *, default_dtype=None, float_compute=True):
    selected = indexing.mask_values(mask)
    values = [memory.value_of(x, api, n, selected) for x, n in zip(operands, names)]
    if not builtins.any(is_tile(x) for x in operands):
        raise KernelUsageError(f"{api} needs at least one tile operand")
    if dtype is not None:
        out_dtype = dt.as_dtype(dtype)
    else:
        out_dtype = default_dtype or dt.result_dtype(v.dtype for v in values)
    values = as_columns(values)
    if active_config().timing_only:  # shapes only: no values are computed
        shape = np.broadcast_shapes(*(v.shape for v in values))
        return memory.tile_from_values(np.zeros(shape, out_dtype), out_dtype, api, mask=selected, fresh=True)
    operands = [dt.to_f32(v) for v in values] if float_compute else values
    result = np.asarray(fn(*operands))
    # A ufunc's result is a new array; an identity-like op may hand back an operand, which must be copied.
    fresh = result.flags.owndata and builtins.all(result is not v for v in operands)
    return memory.tile_from_values(result, out_dtype, api, mask=selected, fresh=fresh)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    import torch
    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))


def _gelu_dx(x):
    return 0.5 * (1.0 + _erf(x / np.float32(math.sqrt(2.0)))) + x * np.exp(-0.5 * x * x) / np.float32(
        math.sqrt(2.0 * math.pi))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + 0.044715 * x ** 3)))


def _gelu_sigmoid_dx(x):
    """d/dx of x * sigmoid(1.702 x)."""
    s = _sigmoid(np.float32(1.702) * x)
    return s + np.float32(1.702) * x * s * (1.0 - s)


def _softplus(x):
    return np.logaddexp(np.float32(0.0), x)


def _scalar_engine_sin(x):
    """The Scalar engine's sin: no range reduction, so outside [-pi, pi] its fitting polynomial
    "extrapolates a cubic" and "sin(9.0) returns ~27.65" (nki.api.shared page, activation table note).
    The page gives no coefficients; the Taylor cubic of sin at the nearer endpoint, d^3 / 6 - d with
    d = x -/+ pi, reproduces its 27.65 (27.6526) and joins sin smoothly there."""
    pi = np.float32(math.pi)
    d = x - np.sign(x) * pi
    return np.where(np.abs(x) <= pi, np.sin(x), d * (d * d / 6 - 1))


def _logical_right_shift(a, b):
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    return (a.view(unsigned) >> b.astype(unsigned)).view(a.dtype)


# Flat op tables: name -> NumPy implementation on fp32 (bitwise: on the integers themselves).
UNARY = {
    "exp": np.exp, "log": np.log, "cos": np.cos, "sin": np.sin, "tan": np.tan, "tanh": np.tanh,
    "arctan": np.arctan, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "reciprocal": np.reciprocal,
    "square": np.square, "abs": np.abs, "sign": np.sign, "negative": np.negative, "trunc": np.trunc,
    "floor": np.floor, "ceil": np.ceil, "sigmoid": _sigmoid, "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu, "gelu_dx": _gelu_dx, "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(np.float32(1.702) * x), "silu": lambda x: x * _sigmoid(x),
    "silu_dx": lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))), "erf": _erf,
    "erf_dx": lambda x: np.float32(2.0 / math.sqrt(math.pi)) * np.exp(-x * x), "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
}
BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum, "mod": np.mod, "fmod": np.fmod,
}
COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "less": np.less, "less_equal": np.less_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}
BITWISE = {
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": _logical_right_shift,
}


def _abs_max(x, y):
    return np.where(np.abs(x) > np.abs(y), x, y)


def _abs_min(x, y):
    return np.where(np.abs(x) < np.abs(y), x, y)


# NeuronCore-v4 ALU operators (current API): the signed input of larger / smaller magnitude, y on a
# tie (nl.abs_max / nl.abs_min pages: abs_max(-5, 3) = -5, abs_max(1, -1) = -1).
MAGNITUDE = {"abs_max": _abs_max, "abs_min": _abs_min}
# Activation functions only the current API lists (NKI 0.6 activation table).
UNARY_CURRENT = {"gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx}
ACTIVATION = {**UNARY, **UNARY_CURRENT}
# The activation instruction where it departs from the exact function and the page says how: sin
# outside its valid range. Outside the other narrow ranges (log, arctan, sqrt, rsqrt, reciprocal) the
# page only says results "may" be invalid, without values, so those stay exact.
SCALAR_ENGINE = {"sin": _scalar_engine_sin}


def binary(name: str, x, y, *, dtype=None, mask=None):
    """Element-wise ``name`` of two operands (tiles or scalars, NumPy broadcasting)."""
    api = f"nl.{name}"
    if name in BITWISE:
        for operand in (x, y):
            kind = operand.dtype.kind if is_tile(operand) else dt.scalar_dtype(operand).kind
            if kind not in "iub":
                shown = operand.dtype if is_tile(operand) else type(operand).__name__
                raise KernelUsageError(f"{api} needs integer operands, got {shown}")
        return elementwise(api, BITWISE[name], (x, y), ("x", "y"), dtype, mask, float_compute=False)
    if name in COMPARE:
        return elementwise(api, COMPARE[name], (x, y), ("x", "y"), dtype, mask, default_dtype=dt.bool_)
    if name == "divide" and _is_integer(x) and _is_integer(y) and (dtype is None or dt.as_dtype(dtype).kind in "iu"):
        # An integer quotient of integers truncates toward zero (C semantics): the public resize-nearest
        # kernel, run on devices, computes row indices as int_tile / width and stays in bounds only so.
        return elementwise(api, _int_divide, (x, y), ("x", "y"), dtype, mask)
    return elementwise(api, BINARY[name], (x, y), ("x", "y"), dtype, mask)


def _is_integer(x) -> bool:
    return (x.dtype if is_tile(x) else dt.scalar_dtype(x)).kind in "iu" and not isinstance(x, bool)


def _int_divide(a, b):
    return np.trunc(a / b)


def unary(name: str, x, *, dtype=None, mask=None):
    return elementwise(f"nl.{name}", UNARY[name], (x,), ("x",), dtype, mask)


def invert(x, *, dtype=None, mask=None):
    """Bitwise NOT of an integer tile (logical NOT of a bool tile)."""
    if x.dtype.kind not in "iub":
        raise KernelUsageError(f"nl.invert needs an integer or bool tile, got {x.dtype}")
    return elementwise("nl.invert", np.invert, (x,), ("x",), dtype, mask, float_compute=False)


def _operator(name: str, reflected: bool = False):
    def operator(self, other):
        if is_tile(other) and self.shape[:1] != other.shape[:1] and self.ndim > 1 and other.ndim > 1:
            raise KernelUsageError(
                f"operator on tiles with {self.shape[0]} and {other.shape[0]} partitions: tile operators do not "
                f"broadcast along the partition dimension; use nl.{name} or broadcast_to")
        return binary(name, other, self) if reflected else binary(name, self, other)
    return operator


class TileOperators:
    """Python operators on tiles and accesses: ``a + b`` is ``nl.add(a, b)``, ``a < b`` is ``nl.less``."""

    __slots__ = ()
    __hash__ = object.__hash__

    def __neg__(self):
        return unary("negative", self)

    def __invert__(self):
        return invert(self)


for _dunder, _name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "divide"),
                       ("pow", "power"), ("mod", "mod"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                       ("xor", "bitwise_xor"), ("lshift", "left_shift"), ("rshift", "right_shift")):
    setattr(TileOperators, f"__{_dunder}__", _operator(_name))
    setattr(TileOperators, f"__r{_dunder}__", _operator(_name, reflected=True))
for _dunder, _name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"), ("ge", "greater_equal"),
                       ("eq", "equal"), ("ne", "not_equal")):
    setattr(TileOperators, f"__{_dunder}__", _operator(_name))


# Imported last: tensors inherit TileOperators, so this module must be complete before they load.
from . import indexing, memory  # noqa: E402
from .run import active_config  # noqa: E402
