"""Differential test of the ``nl`` functions both NKI generations have (their meaning is written once, in
``nki_ops/sim/core/language.py``): bit-identical values and the same rule errors from the legacy and the
current front end, drawn as in ``test_differential.py``. Each case passes ``dtype=`` so both round the same
way; the differences the two generations' pages document (``core.language.Rules``) are listed in
``DOCUMENTED`` and not drawn.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nki_ops.sim.core.errors import KernelUsageError
from nki_ops.sim.frontends import current, legacy

from .test_differential import FLOATS, SETTINGS, TARGETS, _agree, _array, _legacy, frees, in_sbuf, partitions

pytestmark = pytest.mark.simulation

lnl = legacy.language
cnl, cnisa = current.language, current.isa

# What the generations' pages say differently of the same nl function, not drawn: (what, where it is decided).
DOCUMENTED = [
    ("nl.mean/nl.var of integers: float32 in legacy, x's dtype in current; nl.all: bool_ in legacy",
     "Rules.int_mean_dtype, Rules.all_dtype"),
    ("reduction shapes without keepdims: (P,) in legacy, (P, 1) in current (free axes folded); current nl.var "
     "always keeps dims", "Rules.reduced_2d"),
    ("nl.where: promoted dtype of x and y in legacy, x's in current (integers selected exactly)",
     "Rules.promoting_where"),
    ("element-wise integer arithmetic: fp32 in legacy, GpSimd's exact int32 in current; current nl binary "
     "operations do not broadcast", "core.language.lowered_binary"),
    ("nl.transpose lands in SBUF in legacy (the compiler copies), PSUM in current; nl.matmul(transpose_x=False) "
     "and PSUM operands only in legacy", "Rules.copies_psum"),
    ("nl.load of a rank-1 source: a (P,) column in legacy, a (1, N) row in current; nl.store from PSUM only in "
     "legacy", "core.language.load/store"),
]


def _current(body):
    """A current kernel: every input copied to SBUF, ``body(*tiles)``'s new tensor (PSUM copied to SBUF first)
    copied to an HBM output."""
    @current.jit
    def kernel(*arrays):
        result = body(*in_sbuf(arrays))
        if result.buffer is cnl.psum:
            result = cnl.copy(result)
        out = cnl.ndarray(result.shape, dtype=result.dtype, buffer=cnl.shared_hbm)
        cnisa.dma_copy(dst=out, src=result)
        return out
    return kernel


def _both(spell, inputs, target):
    """``spell(nl)`` is the call in either generation's ``nl``."""
    _agree(_legacy(spell(lnl)), _current(spell(cnl)), inputs, target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       name=st.sampled_from(["sum", "max", "min", "prod", "mean", "var", "all"]),
       in_dtype=st.sampled_from(FLOATS + [np.int32, np.uint8]), out_dtype=st.sampled_from(FLOATS + [np.int32]))
def test_reductions(data, p, f, target, name, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype, *((0.0, 8.0) if np.dtype(in_dtype).kind in "iu" else ()))
    _both(lambda nl: lambda x: getattr(nl, name)(x, axis=1, dtype=out_dtype, keepdims=True), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS), in_dtype=st.sampled_from(FLOATS),
       out_dtype=st.sampled_from(FLOATS), epsilon=st.floats(1e-6, 1e-2))
def test_softmax_and_rms_norm(data, p, f, target, in_dtype, out_dtype, epsilon):
    a, w = _array(data.draw, (p, f), in_dtype), _array(data.draw, (1, f), np.float32)
    _both(lambda nl: lambda x: nl.softmax(x, axis=1, dtype=out_dtype), (a,), target)
    _both(lambda nl: lambda x, g: nl.rms_norm(x, g, axis=1, n=f, epsilon=epsilon, dtype=out_dtype), (a, w), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS), in_dtype=st.sampled_from(FLOATS),
       out_dtype=st.sampled_from(FLOATS))
def test_where_and_copy(data, p, f, target, in_dtype, out_dtype):
    cond = (_array(data.draw, (p, f), np.float32) > 0).astype(np.float32)
    a, b = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), in_dtype)
    _both(lambda nl: lambda c, x, y: nl.where(c, x, y, dtype=out_dtype), (cond, a, b), target)
    _both(lambda nl: lambda x: nl.copy(x, dtype=out_dtype), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       name=st.sampled_from(["exp", "tanh", "square", "sigmoid", "gelu", "sqrt", "abs", "sin", "negative"]),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_element_wise_unary(data, p, f, target, name, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    _both(lambda nl: lambda x: getattr(nl, name)(x, dtype=out_dtype), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       name=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum", "equal", "less", "greater_equal"]),
       scalar=st.one_of(st.none(), st.floats(-3, 3, width=32)), in_dtype=st.sampled_from(FLOATS),
       out_dtype=st.sampled_from(FLOATS))
def test_element_wise_binary(data, p, f, target, name, scalar, in_dtype, out_dtype):
    a, b = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), in_dtype)
    if scalar is None:
        _both(lambda nl: lambda x, y: getattr(nl, name)(x, y, dtype=out_dtype), (a, b), target)
    else:
        _both(lambda nl: lambda x: getattr(nl, name)(x, scalar, dtype=out_dtype), (a,), target)


@SETTINGS
@given(data=st.data(), k=partitions, m=st.sampled_from([1, 5, 64, 128]), n=frees, target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS))
def test_matmul_and_transpose(data, k, m, n, target, in_dtype):
    x, y = _array(data.draw, (k, m), in_dtype), _array(data.draw, (k, n), in_dtype)
    _both(lambda nl: lambda s, t: nl.matmul(s, t, transpose_x=True), (x, y), target)
    _both(lambda nl: lambda s: nl.transpose(s), (x,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, g=st.sampled_from([1, 4, 9]), target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS), out_of_bounds=st.booleans())
def test_gather_flattened(data, p, f, g, target, in_dtype, out_of_bounds):
    a = _array(data.draw, (p, f), in_dtype)
    indices = data.draw(st.lists(st.integers(0, f - 1 + out_of_bounds), min_size=p * g, max_size=p * g))
    _both(lambda nl: lambda x, i: nl.gather_flattened(x, i), (a, np.asarray(indices, np.uint32).reshape(p, g)), target)


@pytest.mark.parametrize("generation", ["legacy", "current"])
def test_rms_norm_with_a_weight_that_does_not_broadcast_is_the_kernels_error(generation):
    a, w = np.ones((4, 6), np.float32), np.ones((1, 5), np.float32)
    kernel = (_legacy if generation == "legacy" else _current)(
        lambda x, g: (lnl if generation == "legacy" else cnl).rms_norm(x, g, axis=1, n=6))
    with pytest.raises(KernelUsageError, match=r"w of shape \[1, 5\] does not broadcast against x \[4, 6\]"):
        kernel(a, w)
