"""The ALU: element-wise operator tables (fp32 compute, integer bitwise ops) and the element-wise
instruction both front ends and the tile operators (``a + b``, ``a < b``) use.
"""

from __future__ import annotations

import math

import numpy as np

from .tensors import Access, Tensor

TILES = (Tensor, Access)  # (``isinstance(x, TILES)`` inline where a call per operand shows)


def is_tile(x) -> bool:
    return isinstance(x, TILES)


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
    # x * x * x, not x ** 3: NumPy's float32 power is ~100x slower than two products.
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + 0.044715 * (x * x * x))))


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
