"""Differential test: every instruction both NKI generations have gives bit-identical values, and the same
rule errors, in the legacy (``neuronxcc.nki``) and current (``nki``) front ends.

Hypothesis draws the instruction's operator and flags, tile shapes, dtypes and target; each case is spelled
once per generation (returned tiles and ``dtype=`` in legacy, ``dst=`` in current, the output dtype fixed
so both round the same way) and run on the same inputs. A difference the two generations' pages document
is listed in ``DOCUMENTED`` with its source and excluded from the draw.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nki_ops.sim import SimConfig, configure
from nki_ops.sim.core.errors import SimulatorError, SimulatorWarning
from nki_ops.sim.frontends import current, legacy

pytestmark = pytest.mark.simulation

lnl, lnisa = legacy.language, legacy.isa
cnl, cnisa = current.language, current.isa

FLOATS = [np.float32, ml_dtypes.bfloat16, np.float16]
TARGETS = ["trn1", "trn2", "trn3"]
# Differences the pages document, not drawn: (what, source).
DOCUMENTED = [
    ("int32/uint32 tensor_tensor arithmetic: exact GpSimd integers in the current API, fp32 in legacy",
     "nki.isa.tensor_tensor pages, NKI 0.6 vs Neuron 2.26"),
]


@contextlib.contextmanager
def on_target(target):
    """Run both generations' kernels as ``target``: the legacy front end takes it from the config, the
    current one (whose kernels run as their ``platform_target``, else trn3) from NKI_OPS_SIM_TARGET."""
    previous = os.environ.get("NKI_OPS_SIM_TARGET")
    os.environ["NKI_OPS_SIM_TARGET"] = target
    try:
        with configure(SimConfig(target=target)):
            yield
    finally:
        if previous is None:
            del os.environ["NKI_OPS_SIM_TARGET"]
        else:
            os.environ["NKI_OPS_SIM_TARGET"] = previous


def _run(kernel, inputs, target):
    """The kernel's output, or the class of the simulator error it raised (checked, not its wording: each
    front end names its own API in messages), and how many simulator warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with on_target(target):
                result = np.asarray(kernel(*inputs))
        except SimulatorError as error:
            result = type(error)
    return result, sum(issubclass(w.category, SimulatorWarning) for w in caught)


def _agree(legacy_kernel, current_kernel, inputs, target):
    got_legacy, warned_legacy = _run(legacy_kernel, inputs, target)
    got_current, warned_current = _run(current_kernel, inputs, target)
    assert warned_legacy == warned_current, f"simulator warnings: legacy {warned_legacy}, current {warned_current}"
    if isinstance(got_legacy, type) or isinstance(got_current, type):
        assert got_legacy == got_current, f"legacy: {got_legacy!r}, current: {got_current!r}"
        return
    assert got_legacy.dtype == got_current.dtype and got_legacy.shape == got_current.shape
    np.testing.assert_array_equal(got_legacy.view(np.uint8), got_current.view(np.uint8))


def _array(draw, shape, dtype, low=-4.0, high=4.0):
    values = draw(st.lists(st.floats(low, high, width=32), min_size=1, max_size=16))
    flat = np.resize(np.asarray(values, np.float32), int(np.prod(shape)))
    return flat.reshape(shape).astype(dtype)


def _legacy(body):
    """A legacy kernel: load every input, ``body(*tiles)`` returns a tile, stored to an HBM output."""
    @legacy.jit
    def kernel(*arrays):
        tiles = [lnl.load(a) for a in arrays]
        result = body(*tiles)
        out = lnl.ndarray(result.shape, dtype=result.dtype, buffer=lnl.shared_hbm)
        lnl.store(out, result)
        return out
    return kernel


def in_sbuf(arrays) -> list:
    """Inside a current kernel: each HBM input copied to a new SBUF tile."""
    tiles = []
    for a in arrays:
        t = cnl.ndarray(a.shape, dtype=a.dtype, buffer=cnl.sbuf)
        cnisa.dma_copy(dst=t, src=a)
        tiles.append(t)
    return tiles


def _current(shape, dtype, body):
    """A current kernel: copy every input to SBUF, ``body(dst, *tiles)`` writes an SBUF ``dst``."""
    @current.jit
    def kernel(*arrays):
        tiles = in_sbuf(arrays)
        dst = cnl.ndarray(shape, dtype=dtype, buffer=cnl.sbuf)
        body(dst, *tiles)
        out = cnl.ndarray(shape, dtype=dtype, buffer=cnl.shared_hbm)
        cnisa.dma_copy(dst=out, src=dst)
        return out
    return kernel


def _spec(op):
    """The same operator in both generations' namespaces."""
    return getattr(lnl, op), getattr(cnl, op)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
partitions = st.sampled_from([1, 7, 32, 128])
frees = st.sampled_from([1, 5, 64])


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum", "equal", "less", "greater_equal"]),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_tensor_tensor(data, p, f, target, op, in_dtype, out_dtype):
    a, b = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), in_dtype)
    _agree_tensor_tensor(op, a, b, out_dtype, target)


def _agree_tensor_tensor(op, a, b, out_dtype, target):
    lop, cop = _spec(op)
    _agree(_legacy(lambda x, y: lnisa.tensor_tensor(x, y, op=lop, dtype=out_dtype)),
           _current(a.shape, out_dtype, lambda d, x, y: cnisa.tensor_tensor(dst=d, data1=x, data2=y, op=cop)),
           (a, b), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op0=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]),
       op1=st.sampled_from([None, "add", "multiply", "maximum"]), reverse0=st.booleans(), reverse1=st.booleans(),
       operand0=st.floats(-3, 3, width=32), operand1=st.floats(-3, 3, width=32),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_tensor_scalar(data, p, f, target, op0, op1, reverse0, reverse1, operand0, operand1, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    (l0, c0), (l1, c1) = _spec(op0), (_spec(op1) if op1 else (None, None))
    second = {} if op1 is None else {"operand1": operand1, "reverse1": reverse1}
    _agree(_legacy(lambda x: lnisa.tensor_scalar(x, op0=l0, operand0=operand0, reverse0=reverse0, op1=l1,
                                                 dtype=out_dtype, **second)),
           _current((p, f), out_dtype, lambda d, x: cnisa.tensor_scalar(dst=d, data=x, op0=c0, operand0=operand0,
                                                                        reverse0=reverse0, op1=c1, **second)),
           (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op=st.sampled_from(["exp", "tanh", "square", "sigmoid", "copy", "gelu", "sqrt", "abs"]),
       scale=st.floats(-2, 2, width=32), with_bias=st.booleans(),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_activation(data, p, f, target, op, scale, with_bias, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    bias = _array(data.draw, (p, 1), np.float32)
    lop, cop = _spec(op)
    if with_bias:
        legacy_body = lambda x, b: lnisa.activation(op=lop, data=x, bias=b, scale=scale, dtype=out_dtype)  # noqa: E731
        current_body = lambda d, x, b: cnisa.activation(dst=d, op=cop, data=x, bias=b, scale=scale)  # noqa: E731
        inputs = (a, bias)
    else:
        legacy_body = lambda x: lnisa.activation(op=lop, data=x, scale=scale, dtype=out_dtype)  # noqa: E731
        current_body = lambda d, x: cnisa.activation(dst=d, op=cop, data=x, scale=scale)  # noqa: E731
        inputs = (a,)
    _agree(_legacy(legacy_body), _current((p, f), out_dtype, current_body), inputs, target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op=st.sampled_from(["add", "maximum", "minimum"]), negate=st.booleans(),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_tensor_reduce(data, p, f, target, op, negate, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    lop, cop = _spec(op)
    _agree(_legacy(lambda x: lnisa.tensor_reduce(lop, x, axis=1, negate=negate, keepdims=True, dtype=out_dtype)),
           _current((p, 1), out_dtype, lambda d, x: cnisa.tensor_reduce(dst=d, op=cop, data=x, axis=1,
                                                                        negate=negate, keepdims=True)),
           (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS + [np.int32, np.uint8]), out_dtype=st.sampled_from(FLOATS + [np.int32]))
def test_tensor_copy(data, p, f, target, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype, 0.0, 100.0)
    _agree(_legacy(lambda x: lnisa.tensor_copy(x, dtype=out_dtype)),
           _current((p, f), out_dtype, lambda d, x: cnisa.tensor_copy(dst=d, src=x)), (a,), target)


@SETTINGS
@given(data=st.data(), k=st.sampled_from([1, 32, 128]), m=st.sampled_from([1, 16, 128]),
       n=st.sampled_from([1, 64, 512]), target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from([np.float32, ml_dtypes.bfloat16]),
       tiling=st.sampled_from([((), ()), ((0, 0), (128, 128)), ((0, 64), (64, 64)), ((0, 0), (32, 32)),
                               ((0, 0), (96, 96)), ((32, 0), (64, 128))]))
def test_nc_matmul(data, k, m, n, target, in_dtype, tiling):
    s, mv = _array(data.draw, (k, m), in_dtype), _array(data.draw, (k, n), in_dtype)
    position, size = tiling

    @legacy.jit
    def legacy_kernel(s, mv):
        out = lnl.ndarray((m, n), dtype=lnl.float32, buffer=lnl.shared_hbm)
        product = lnisa.nc_matmul(lnl.load(s), lnl.load(mv), tile_position=position, tile_size=size)
        lnl.store(out, lnl.copy(product, dtype=lnl.float32))
        return out

    @current.jit
    def current_kernel(s, mv):
        st_, mv_ = (cnl.ndarray(x.shape, dtype=x.dtype, buffer=cnl.sbuf) for x in (s, mv))
        cnisa.dma_copy(dst=st_, src=s)
        cnisa.dma_copy(dst=mv_, src=mv)
        acc = cnl.ndarray((m, n), dtype=cnl.float32, buffer=cnl.psum)
        cnisa.nc_matmul(acc, st_, mv_, tile_position=position, tile_size=size)
        res = cnl.ndarray((m, n), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.tensor_copy(dst=res, src=acc)
        out = cnl.ndarray((m, n), dtype=cnl.float32, buffer=cnl.shared_hbm)
        cnisa.dma_copy(dst=out, src=res)
        return out

    _agree(legacy_kernel, current_kernel, (s, mv), target)


@SETTINGS
@given(data=st.data(), p=st.sampled_from([1, 8, 32]), f=st.sampled_from([1, 8, 32]), target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS))
def test_nc_transpose_on_the_vector_engine(data, p, f, target, in_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    _agree(_legacy(lambda x: lnisa.nc_transpose(x, engine=lnisa.engine.vector)),
           _current((f, p), in_dtype, lambda d, x: cnisa.nc_transpose(dst=d, data=x, engine=cnisa.engine.vector)),
           (a,), target)


@SETTINGS
@given(p=partitions, f=frees, target=st.sampled_from(TARGETS), value=st.floats(-5, 5, width=32),
       dtype=st.sampled_from(FLOATS))
def test_memset(p, f, target, value, dtype):
    @legacy.jit
    def legacy_kernel():
        out = lnl.ndarray((p, f), dtype=dtype, buffer=lnl.shared_hbm)
        lnl.store(out, lnisa.memset((p, f), value, dtype=dtype))
        return out

    _agree(legacy_kernel, _current((p, f), dtype, lambda d: cnisa.memset(dst=d, value=value)), (), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op=st.sampled_from(["bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]),
       in_dtype=st.sampled_from([np.int32, np.uint32, np.uint8, np.int16]))
def test_bitvec_tensor_tensor(data, p, f, target, op, in_dtype):
    a = _array(data.draw, (p, f), in_dtype, 0.0, 100.0)
    b = _array(data.draw, (p, f), in_dtype, 0.0, 7.0)
    _agree_tensor_tensor(op, a, b, in_dtype, target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op0=st.sampled_from(["add", "subtract", "multiply", "maximum"]),
       op1=st.sampled_from(["add", "subtract", "multiply", "minimum"]), reverse0=st.booleans(), reverse1=st.booleans(),
       in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_scalar_tensor_tensor_with_a_per_partition_operand(data, p, f, target, op0, op1, reverse0, reverse1, in_dtype,
                                                           out_dtype):
    a, b = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), in_dtype)
    column = _array(data.draw, (p, 1), np.float32)
    (l0, c0), (l1, c1) = _spec(op0), _spec(op1)
    _agree(_legacy(lambda x, y, c: lnisa.scalar_tensor_tensor(data=x, op0=l0, operand0=c, op1=l1, operand1=y,
                                                              reverse0=reverse0, reverse1=reverse1, dtype=out_dtype)),
           _current((p, f), out_dtype, lambda d, x, y, c: cnisa.scalar_tensor_tensor(
               dst=d, data=x, op0=c0, operand0=c, op1=c1, operand1=y, reverse0=reverse0, reverse1=reverse1)),
           (a, b, column), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS), in_dtype=st.sampled_from(FLOATS),
       out_dtype=st.sampled_from(FLOATS))
def test_reciprocal(data, p, f, target, in_dtype, out_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    _agree(_legacy(lambda x: lnisa.reciprocal(x, dtype=out_dtype)),
           _current((p, f), out_dtype, lambda d, x: cnisa.reciprocal(dst=d, data=x)), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=st.sampled_from([8, 64, 512]), target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS))
def test_bn_stats_then_bn_aggr(data, p, f, target, in_dtype):
    a = _array(data.draw, (p, f), in_dtype)

    def current_body(d, x):
        stats = cnl.ndarray((p, 6), dtype=cnl.float32, buffer=cnl.sbuf)
        cnisa.bn_stats(dst=stats, data=x)
        cnisa.bn_aggr(dst=d, data=stats)

    _agree(_legacy(lambda x: lnisa.bn_aggr(lnisa.bn_stats(x, dtype=lnl.float32), dtype=lnl.float32)),
           _current((p, 2), np.float32, current_body), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=st.sampled_from([8, 64]), target=st.sampled_from(TARGETS),
       in_dtype=st.sampled_from(FLOATS))
def test_max8(data, p, f, target, in_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    _agree(_legacy(lambda x: lnisa.max8(src=x)),
           _current((p, 8), in_dtype, lambda d, x: cnisa.max8(dst=d, src=x)), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op=st.sampled_from(["add", "maximum", "minimum"]), in_dtype=st.sampled_from(FLOATS))
def test_tensor_partition_reduce(data, p, f, target, op, in_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    lop, cop = _spec(op)
    _agree(_legacy(lambda x: lnisa.tensor_partition_reduce(lop, x)),
           _current((1, f), in_dtype, lambda d, x: cnisa.tensor_partition_reduce(dst=d, op=cop, data=x)),
           (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       commands=st.lists(st.sampled_from(["reset", "reduce", "reset_reduce", "idle"]), min_size=1, max_size=4))
def test_activation_accumulator_commands(data, p, f, target, commands):
    """A sequence of activations driving the Scalar engine's accumulator registers, the last writing reduce_res."""
    a = _array(data.draw, (p, f), np.float32)

    def legacy_body(x):
        acc = lnl.ndarray((p, 1), dtype=lnl.float32, buffer=lnl.sbuf)
        for i, command in enumerate(commands):
            res = acc if i == len(commands) - 1 else None
            lnisa.activation(op=lnl.exp, data=x, reduce_op=lnl.add, reduce_res=res,
                             reduce_cmd=getattr(lnisa.reduce_cmd, command))
        return acc

    def current_body(d, x):
        junk = cnl.ndarray((p, f), dtype=cnl.float32, buffer=cnl.sbuf)
        for i, command in enumerate(commands):
            res = d if i == len(commands) - 1 else None
            cnisa.activation(dst=junk, op=cnl.exp, data=x, reduce_op=cnl.add, reduce_res=res,
                             reduce_cmd=getattr(cnisa.reduce_cmd, command))

    _agree(_legacy(legacy_body), _current((p, 1), np.float32, current_body), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       op0=st.sampled_from(["add", "subtract", "multiply"]), reduce_op=st.sampled_from(["add", "maximum", "minimum"]),
       operand0=st.floats(-3, 3, width=32), in_dtype=st.sampled_from(FLOATS), out_dtype=st.sampled_from(FLOATS))
def test_tensor_scalar_reduce(data, p, f, target, op0, reduce_op, operand0, in_dtype, out_dtype):
    """reduce_res receives the reduction of the fp32 result, before it is rounded to the output dtype."""
    a = _array(data.draw, (p, f), in_dtype)
    (l0, c0), (lr, cr) = _spec(op0), _spec(reduce_op)

    def legacy_body(x):
        res = lnl.ndarray((p, 1), dtype=lnl.float32, buffer=lnl.sbuf)
        lnisa.tensor_scalar_reduce(data=x, op0=l0, operand0=operand0, reduce_op=lr, reduce_res=res, dtype=out_dtype)
        return res

    def current_body(d, x):
        result = cnl.ndarray((p, f), dtype=out_dtype, buffer=cnl.sbuf)
        cnisa.tensor_scalar_reduce(dst=result, data=x, op0=c0, operand0=operand0, reduce_op=cr, reduce_res=d)

    _agree(_legacy(legacy_body), _current((p, 1), np.float32, current_body), (a,), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS), reverse_pred=st.booleans(),
       on_false=st.floats(-3, 3, width=32), in_dtype=st.sampled_from(FLOATS))
def test_select_reduce(data, p, f, target, reverse_pred, on_false, in_dtype):
    a, pred = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), np.uint8, 0.0, 1.5)

    def legacy_body(x, predicate):
        dst = lnl.ndarray((p, f), dtype=lnl.float32, buffer=lnl.sbuf)
        lnisa.select_reduce(dst=dst, predicate=predicate, on_true=x, on_false=on_false, reverse_pred=reverse_pred)
        return dst

    _agree(_legacy(legacy_body),
           _current((p, f), np.float32, lambda d, x, predicate: cnisa.select_reduce(
               dst=d, predicate=predicate, on_true=x, on_false=on_false, reverse_pred=reverse_pred)), (a, pred), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS), reverse_pred=st.booleans(),
       in_dtype=st.sampled_from(FLOATS))
def test_tensor_copy_predicated(data, p, f, target, reverse_pred, in_dtype):
    a, b = _array(data.draw, (p, f), in_dtype), _array(data.draw, (p, f), in_dtype)
    pred = _array(data.draw, (p, f), np.uint8, 0.0, 1.5)

    def legacy_body(x, old, predicate):
        lnisa.tensor_copy_predicated(src=x, dst=old, predicate=predicate, reverse_pred=reverse_pred)
        return old

    def current_body(d, x, old, predicate):
        cnisa.tensor_copy(dst=d, src=old)
        cnisa.tensor_copy_predicated(dst=d, src=x, predicate=predicate, reverse_pred=reverse_pred)

    _agree(_legacy(legacy_body), _current((p, f), in_dtype, current_body), (a, b, pred), target)


@SETTINGS
@given(data=st.data(), p=partitions, f=frees, target=st.sampled_from(TARGETS),
       comp0=st.sampled_from(["greater_equal", "greater", "equal"]), comp1=st.sampled_from(["less", "less_equal"]),
       range_start=st.integers(-4, 4), in_dtype=st.sampled_from(FLOATS))
def test_range_select(data, p, f, target, comp0, comp1, range_start, in_dtype):
    a = _array(data.draw, (p, f), in_dtype)
    low, high = _array(data.draw, (p, 1), np.float32, -2.0, 30.0), _array(data.draw, (p, 1), np.float32, 0.0, 70.0)
    (l0, c0), (l1, c1) = _spec(comp0), _spec(comp1)
    _agree(_legacy(lambda x, b0, b1: lnisa.range_select(on_true_tile=x, comp_op0=l0, comp_op1=l1, bound0=b0,
                                                        bound1=b1, range_start=range_start, dtype=lnl.float32)),
           _current((p, f), np.float32, lambda d, x, b0, b1: cnisa.range_select(
               dst=d, on_true_tile=x, comp_op0=c0, comp_op1=c1, bound0=b0, bound1=b1, range_start=range_start)),
           (a, low, high), target)
