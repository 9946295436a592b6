"""NKI kernels of the gated linear units ``act(gate) * up``: SwiGLU (act = silu) and GeGLU (act = gelu, exact
or its tanh approximation), forward and gradients of both inputs.

Elementwise: the kernels take gate, up (and the output's gradient) as HBM ``[N, F]`` of one shape, any
N and F (the torch op views any tensor so, as ``[128, numel / 128]`` when it can, to fill every
partition). Rows go on the partition axis in tiles of 128 (``tile_range``: full tiles, then one
narrower tail tile), columns in chunks of ``CHUNK``. The activation runs on the Scalar engine, the
products on the Vector engine, in fp32. The backward recomputes the activation from gate rather than
reading a stored one. Written for the current ``nki`` API (NKI 0.6).
"""

from __future__ import annotations

import math

from ...nki_api import nisa, nki, nl
from .._nki_tiling import PARTITIONS, is_float_dtype, kernel_check, tile_range

# Columns per chunk: long enough to amortise each instruction's fixed cost, while the backward's
# dozen fp32 chunk temporaries (4 KiB per partition each) stay a small share of SBUF.
CHUNK = 1024
# The activations, by the name the torch op passes: silu, gelu (erf form) and its tanh approximation.
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
# gelu_tanh(x) = 0.5 * x * (1 + tanh(SQRT_2_OVER_PI * (x + CUBIC * x**3)))
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _check_inputs(gate, up, activation):
    kernel_check(len(gate.shape) == 2, f"gate must be HBM [N, F], got shape {gate.shape}")
    kernel_check(up.shape == gate.shape, f"up must have gate's shape {gate.shape}, got {up.shape}")
    kernel_check(is_float_dtype(gate.dtype) and up.dtype == gate.dtype,
                 f"gate and up must both be float32, bfloat16 or float16, got {gate.dtype} and {up.dtype}")
    kernel_check(activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _load(hbm, start, size, c0, cols):
    """Rows ``start .. start + size``, columns ``c0 .. c0 + cols`` of an HBM tensor, in its own dtype."""
    tile = nl.ndarray((size, cols), dtype=hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=hbm[start:start + size, c0:c0 + cols])
    return tile


def _fp32(shape):
    return nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)


def _activation_op(activation):
    if activation == "silu":
        return nl.silu
    return nl.gelu if activation == "gelu" else nl.gelu_apprx_tanh


@nki.jit
def glu_kernel(gate, up, activation):
    """``act(gate) * up``, elementwise, with act silu (SwiGLU) or gelu (GeGLU).

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        F: columns (any count), on the free axis in chunks of ``CHUNK``.

    Args:
        gate: HBM ``[N, F]`` float32, bfloat16 or float16.
        up: HBM ``[N, F]``, gate's dtype.
        activation: ``"silu"``, ``"gelu"`` (``0.5 * x * (1 + erf(x / sqrt(2)))``) or ``"gelu_tanh"``
            (``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``).

    Returns:
        HBM ``[N, F]`` in gate's dtype.

    Notes:
        The activation is one Scalar-engine instruction (``nl.silu``, ``nl.gelu``,
        ``nl.gelu_apprx_tanh``) into fp32, the product one Vector-engine instruction rounding once
        to the output dtype. SBUF holds a chunk of each input and two fp32 chunks per partition.

    Pseudocode:
        for each row tile (start, p), each column chunk c:
            out[start:start+p, c] = act(gate[start:start+p, c]) * up[start:start+p, c]
    """
    _check_inputs(gate, up, activation)
    rows, cols_total = gate.shape
    out = nl.ndarray((rows, cols_total), dtype=gate.dtype, buffer=nl.shared_hbm)
    for start, size in tile_range(rows, PARTITIONS):
        for c0, cols in tile_range(cols_total, CHUNK):
            gate_tile = _load(gate, start, size, c0, cols)
            up_tile = _load(up, start, size, c0, cols)
            activated = _fp32((size, cols))
            nisa.activation(dst=activated, op=_activation_op(activation), data=gate_tile)
            y = nl.ndarray((size, cols), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=y, data1=activated, data2=up_tile, op=nl.multiply)
            nisa.dma_copy(dst=out[start:start + size, c0:c0 + cols], src=y)
    return out


def _gelu_tanh_and_derivative(gate_tile, shape):
    """``gelu_tanh(x)`` and its derivative ``0.5 * (1 + t) + 0.5 * x * (1 - t**2) * k * (1 + 3 * c * x**2)``
    with ``t = tanh(k * x * (1 + c * x**2))``, ``k = sqrt(2 / pi)``, ``c = 0.044715``: fp32 tiles.

    The activation table has no derivative of the tanh approximation, so it is composed from tanh;
    ``0.5 * (1 - t**2)`` is taken as ``half * (1 - t)`` with ``half = 0.5 * (1 + t)``: near ``t = +-1``
    (large ``|x|``) both factors are exact differences, where ``1 - t**2`` would first round ``t**2``."""
    square = _fp32(shape)
    nisa.activation(dst=square, op=nl.square, data=gate_tile)
    cubic = _fp32(shape)  # 1 + c * x**2
    nisa.tensor_scalar(dst=cubic, data=square, op0=nl.multiply, operand0=CUBIC, op1=nl.add, operand1=1.0)
    inner = _fp32(shape)  # x * (1 + c * x**2)
    nisa.tensor_tensor(dst=inner, data1=cubic, data2=gate_tile, op=nl.multiply)
    t = _fp32(shape)
    nisa.activation(dst=t, op=nl.tanh, data=inner, scale=SQRT_2_OVER_PI)
    half = _fp32(shape)  # 0.5 * (1 + t)
    nisa.tensor_scalar(dst=half, data=t, op0=nl.add, operand0=1.0, op1=nl.multiply, operand1=0.5)
    gelu = _fp32(shape)
    nisa.tensor_tensor(dst=gelu, data1=half, data2=gate_tile, op=nl.multiply)
    complement = _fp32(shape)  # 1 - t
    nisa.tensor_scalar(dst=complement, data=t, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)
    slope = _fp32(shape)  # k * (1 - t) * gelu = 0.5 * x * (1 - t**2) * k
    nisa.scalar_tensor_tensor(dst=slope, data=complement, op0=nl.multiply, operand0=SQRT_2_OVER_PI,
                              op1=nl.multiply, operand1=gelu)
    cubic_dx = _fp32(shape)  # 1 + 3 * c * x**2
    nisa.tensor_scalar(dst=cubic_dx, data=square, op0=nl.multiply, operand0=3.0 * CUBIC, op1=nl.add, operand1=1.0)
    tail = _fp32(shape)
    nisa.tensor_tensor(dst=tail, data1=slope, data2=cubic_dx, op=nl.multiply)
    derivative = _fp32(shape)
    nisa.tensor_tensor(dst=derivative, data1=tail, data2=half, op=nl.add)
    return gelu, derivative


def _activation_and_derivative(gate_tile, activation, shape):
    """``act(gate)`` and ``act'(gate)`` as fp32 tiles: silu and gelu have both in the activation table."""
    if activation == "gelu_tanh":
        return _gelu_tanh_and_derivative(gate_tile, shape)
    value = _fp32(shape)
    nisa.activation(dst=value, op=_activation_op(activation), data=gate_tile)
    derivative = _fp32(shape)
    nisa.activation(dst=derivative, op=nl.silu_dx if activation == "silu" else nl.gelu_dx, data=gate_tile)
    return value, derivative


@nki.jit
def glu_backward_kernel(grad, gate, up, activation):
    """Gradients of ``act(gate) * up`` with respect to gate and up, given the output's gradient.

    Dimensions:
        N: rows (any count), on the partition axis in tiles of 128.
        F: columns (any count), on the free axis in chunks of ``CHUNK``.

    Args:
        grad: HBM ``[N, F]`` gradient of the output, gate's dtype.
        gate: HBM ``[N, F]`` float32, bfloat16 or float16 (the forward input).
        up: HBM ``[N, F]``, gate's dtype.
        activation: ``"silu"``, ``"gelu"`` or ``"gelu_tanh"``, as in the forward.

    Returns:
        ``(dgate, dup)``: HBM ``[N, F]`` each, in gate's dtype, with
        ``dgate = grad * up * act'(gate)`` and ``dup = grad * act(gate)``.

    Notes:
        act(gate) is recomputed, not read from the forward. silu and gelu and their derivatives
        (``nl.silu_dx``, ``nl.gelu_dx``) are Scalar-engine activations; the tanh approximation's
        derivative is composed from ``nl.tanh`` and Vector-engine arithmetic. Computed in fp32,
        each gradient rounded once to the output dtype.

    Pseudocode:
        for each row tile (start, p), each column chunk c:
            g, x, u = grad, gate, up at [start:start+p, c]
            dup[start:start+p, c] = g * act(x)
            dgate[start:start+p, c] = (g * u) * act'(x)
    """
    _check_inputs(gate, up, activation)
    kernel_check(grad.shape == gate.shape, f"grad must have gate's shape {gate.shape}, got {grad.shape}")
    kernel_check(grad.dtype == gate.dtype, f"grad must have gate's dtype {gate.dtype}, got {grad.dtype}")
    rows, cols_total = gate.shape
    dgate = nl.ndarray((rows, cols_total), dtype=gate.dtype, buffer=nl.shared_hbm)
    dup = nl.ndarray((rows, cols_total), dtype=gate.dtype, buffer=nl.shared_hbm)
    for start, size in tile_range(rows, PARTITIONS):
        for c0, cols in tile_range(cols_total, CHUNK):
            grad_tile = _load(grad, start, size, c0, cols)
            gate_tile = _load(gate, start, size, c0, cols)
            up_tile = _load(up, start, size, c0, cols)
            value, derivative = _activation_and_derivative(gate_tile, activation, (size, cols))
            dup_tile = nl.ndarray((size, cols), dtype=dup.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=dup_tile, data1=grad_tile, data2=value, op=nl.multiply)
            nisa.dma_copy(dst=dup[start:start + size, c0:c0 + cols], src=dup_tile)
            gated = _fp32((size, cols))
            nisa.tensor_tensor(dst=gated, data1=grad_tile, data2=up_tile, op=nl.multiply)
            dgate_tile = nl.ndarray((size, cols), dtype=dgate.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=dgate_tile, data1=gated, data2=derivative, op=nl.multiply)
            nisa.dma_copy(dst=dgate[start:start + size, c0:c0 + cols], src=dgate_tile)
    return dgate, dup
