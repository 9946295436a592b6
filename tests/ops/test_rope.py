"""nki_ops.rope on every backend against the float64 reference: the rotate-half convention, odd B, H, S and D
(Hq != Hkv), tables [S, D], [1, S, D] and [B, S, D], three dtypes, gradients of q and k (none for the
tables), empty inputs, the NKI kernels' position tiling and SBUF use, torch.compile training, bad inputs."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.ops.rope import nki_kernel
from nki_ops.ops.rope.reference import rope_reference
from nki_ops.sim import SimulatorWarning

from .compiled_training import check_compiled_training

# Error of each computed element against the float64 value, relative to the sum of its two terms'
# magnitudes |x * cos| + |rotate_half(x) * sin|: fp32 rounds each product and the sum (3 unit roundoffs
# of 2**-24); the half types add one rounding of the fp32 result to the output (unit roundoff 2**-8 bf16,
# 2**-11 fp16, relative to the value, which is at most that sum). fp16's smallest subnormal is 2**-24.
REL = {torch.float32: 3 * 2.0 ** -24, torch.bfloat16: 2.0 ** -8 + 2.0 ** -22, torch.float16: 2.0 ** -11 + 2.0 ** -22}
ABS = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 2.0 ** -24}


def _swap(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


def _tables(shape, dtype=torch.float32, seed=1):
    """Hugging Face Llama's tables for ``shape`` ([S, D] or [T, S, D]): angles pos * 10000**(-2i/D), each
    frequency twice; the batch rows of a [T, S, D] table start at different positions."""
    g = torch.Generator().manual_seed(seed)
    seq, dim = shape[-2:]
    offsets = torch.randint(0, 1000, shape[:-2] + (1,), generator=g).double()
    positions = torch.arange(seq, dtype=torch.float64) + offsets
    freqs = positions[..., None] * 10000.0 ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _inputs(b, hq, hkv, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, s, d, generator=g).to(dtype).requires_grad_(),
            torch.randn(b, hkv, s, d, generator=g).to(dtype).requires_grad_())


def _rotated_and_grads(q, k, cos, sin, backend, grads):
    """``(q', k', dq, dk)`` for the given output gradients; backend None: the float64 reference."""
    if backend is None:
        q, k = (t.detach().double().requires_grad_() for t in (q, k))
        q_rot, k_rot = rope_reference(q, k, cos.double(), sin.double())
        grads = tuple(g.double() for g in grads)
    else:
        q.grad = k.grad = None
        q_rot, k_rot = nki_ops.rope(q, k, cos, sin, backend=backend)
    torch.autograd.backward((q_rot, k_rot), grads)
    return q_rot.detach(), k_rot.detach(), q.grad, k.grad


def _magnitudes(x, cos, sin, backward):
    """|x * cos| + |the rotated term| per element, in float64 (the error scale of REL): forward
    ``rotate_half(x) * sin``, backward ``rotate_half^T(x * sin)``."""
    x, cos, sin = x.detach().double().abs(), cos.double().abs(), sin.double().abs()
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + (_swap(x * sin) if backward else _swap(x) * sin)


def _check(q, k, cos, sin, backend="nki"):
    dtype = q.dtype
    grads = tuple(torch.randn(t.shape, generator=torch.Generator().manual_seed(2)).to(dtype) for t in (q, k))
    got = _rotated_and_grads(q, k, cos, sin, backend, grads)
    expected = _rotated_and_grads(q, k, cos, sin, None, grads)
    scales = [_magnitudes(q, cos, sin, False), _magnitudes(k, cos, sin, False),
              _magnitudes(grads[0], cos, sin, True), _magnitudes(grads[1], cos, sin, True)]
    for name, g, e, scale, like in zip(("q_rot", "k_rot", "dq", "dk"), got, expected, scales, (q, k, q, k)):
        assert g.dtype == dtype and g.shape == like.shape, name
        error = (g.double() - e).abs()
        bound = REL[dtype] * scale + ABS[dtype]
        assert (error <= bound).all(), f"{name}: error {error.max().item():.3g} over bound at " \
                                       f"{(error > bound).nonzero()[0].tolist()}"


# --------------------------------------------------------------------------------- torch reference

def test_rotate_half_convention_is_a_complex_rotation_of_the_two_halves():
    # With Llama's tables (each frequency twice), feature i and i + D/2 form x_i + i x_{i+D/2},
    # turned by the angle: the rotate-half convention, as opposed to adjacent pairs (2i, 2i + 1).
    q, k = (t.detach().double() for t in _inputs(2, 3, 1, 7, 8))
    cos, sin = _tables((7, 8), torch.float64)
    q_rot, k_rot = nki_ops.rope(q, k, cos, sin, backend="torch")
    turn = torch.complex(cos[:, :4], sin[:, :4])
    for x, x_rot in ((q, q_rot), (k, k_rot)):
        expected = torch.view_as_real(torch.complex(x[..., :4], x[..., 4:]) * turn)
        torch.testing.assert_close(x_rot, torch.cat((expected[..., 0], expected[..., 1]), dim=-1),
                                   rtol=1e-15, atol=1e-15)


def test_torch_path_gradcheck_in_float64():
    q, k = (t.detach().double().requires_grad_() for t in _inputs(2, 3, 2, 5, 6))
    cos, sin = torch.randn(2, 5, 6, dtype=torch.float64), torch.randn(2, 5, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: nki_ops.rope(a, b, cos, sin, backend="torch"), (q, k))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_backend_within_the_rounding_bound(dtype):
    q, k = _inputs(2, 3, 1, 9, 10, dtype)
    _check(q, k, *_tables((2, 9, 10)), backend="torch")


# ------------------------------------------------------------------------------ NKI kernels

CASES = {
    # name: (B, Hq, Hkv, S, D, table shape as a function of (B, S, D))
    "GQA, one position tile, [S, D] tables": (2, 4, 1, 130, 8, lambda b, s, d: (s, d)),
    "Hq < Hkv, [B, S, D] tables": (2, 1, 3, 129, 64, lambda b, s, d: (b, s, d)),
    "3 positions per partition, [1, S, D]": (1, 5, 3, 300, 128, lambda b, s, d: (1, s, d)),
    "full runs, whole-run tail, 1-position tail": (1, 1, 2, 1100, 128, lambda b, s, d: (s, d)),
    "D = 256, odd S": (3, 3, 1, 127, 256, lambda b, s, d: (b, s, d)),
    "tables in SBUF, D = 1026": (1, 3, 1, 40, 1026, lambda b, s, d: (s, d)),
    "single position and D = 2": (1, 1, 1, 1, 2, lambda b, s, d: (s, d)),
}


@pytest.mark.simulation
@pytest.mark.parametrize("case", CASES)
def test_nki_matches_the_float64_reference_forward_and_gradients(case):
    b, hq, hkv, s, d, table = CASES[case]
    q, k = _inputs(b, hq, hkv, s, d)
    _check(q, k, *_tables(table(b, s, d)))


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nki_half_precision_keeps_the_dtype_within_one_rounding(dtype):
    q, k = _inputs(2, 3, 2, 140, 64, dtype)
    _check(q, k, *_tables((2, 140, 64), dtype))


@pytest.mark.simulation
def test_tables_in_another_dtype_than_q_and_k():
    q, k = _inputs(1, 2, 1, 70, 32, torch.bfloat16)
    _check(q, k, *_tables((70, 32), torch.float32))


@pytest.mark.simulation
def test_the_table_forms_agree_with_a_table_per_batch_row():
    q, k = _inputs(3, 2, 1, 50, 16)
    cos, sin = _tables((50, 16))
    per_row = nki_ops.rope(q, k, cos.expand(3, 50, 16), sin.expand(3, 50, 16), backend="nki")
    for form in ((cos, sin), (cos[None], sin[None])):
        for got, want in zip(nki_ops.rope(q, k, *form, backend="nki"), per_row):
            assert torch.equal(got, want)


def test_position_tiles_cover_the_sequence_once_with_whole_runs():
    assert nki_kernel.position_tiles(300, 3) == ((0, 100, 3),)
    assert nki_kernel.position_tiles(1100, 8) == ((0, 128, 8), (1024, 9, 8), (1096, 4, 1))
    for seq, run in ((1, 1), (129, 1), (4097, 16), (1000, 7)):
        covered = [s0 + i for s0, parts, r in nki_kernel.position_tiles(seq, run) for i in range(parts * r)]
        assert covered == list(range(seq))


@pytest.mark.simulation
@pytest.mark.parametrize("shape", [(0, 2, 1, 5, 4), (2, 2, 1, 0, 4), (2, 0, 3, 5, 4)])
def test_empty_inputs_give_empty_results_and_gradients(shape):
    b, hq, hkv, s, d = shape
    q, k = _inputs(b, hq, hkv, s, d)
    cos, sin = _tables((s, d))
    q_rot, k_rot = nki_ops.rope(q, k, cos, sin, backend="nki")
    assert q_rot.shape == q.shape and k_rot.shape == k.shape
    (q_rot.sum() + k_rot.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


@pytest.mark.parametrize("backend", ["torch", pytest.param("nki", marks=pytest.mark.simulation)])
def test_the_tables_get_no_gradient(backend):
    q, k = _inputs(1, 2, 1, 6, 4)
    cos, sin = (t.requires_grad_() for t in _tables((6, 4)))
    q_rot, k_rot = nki_ops.rope(q, k, cos, sin, backend=backend)
    (q_rot.sum() + k_rot.sum()).backward()
    assert cos.grad is None and sin.grad is None
    assert q.grad is not None and k.grad is not None


@pytest.mark.simulation
def test_an_unused_output_passes_a_zero_gradient():
    q, k = _inputs(1, 2, 1, 6, 4)
    q_rot, _ = nki_ops.rope(q, k, *_tables((6, 4)), backend="nki")
    q_rot.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))


@pytest.mark.simulation
@pytest.mark.parametrize("shape", [(1, 4, 2, 1024, 128), (1, 1, 1, 5, 8000)])
def test_the_on_chip_tiles_fit_trn1(monkeypatch, shape):
    # A Llama head size at full runs (8 positions per partition: PSUM full) and the widest D the
    # kernels keep in SBUF, on the smallest SBUF: no capacity warning (the compiler would spill).
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    q, k = _inputs(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulatorWarning)
        _check(q, k, *_tables(shape[-2:]))


def test_float64_is_refused_by_the_kernels_with_reason():
    q, k = (t.detach().double() for t in _inputs(1, 1, 1, 3, 4))
    with pytest.raises(nki_ops.BackendUnavailableError, match="float32"):
        nki_ops.rope(q, k, *_tables((3, 4)), backend="nki")


@pytest.mark.simulation
def test_opcheck_of_the_library_ops():
    from nki_ops.ops.rope.nki_op import rope_backward_nki, rope_nki
    q, k = _inputs(2, 3, 1, 5, 6)
    cos, sin = _tables((2, 5, 6))
    torch.library.opcheck(rope_nki, (q, k, cos, sin))
    torch.library.opcheck(rope_backward_nki, (torch.randn(2, 3, 5, 6), torch.randn(2, 1, 5, 6), cos, sin))


# ------------------------------------------------------------------------------- torch.compile

@pytest.mark.simulation
def test_compiled_fullgraph_training_step_through_the_public_op():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    tokens, target = torch.randn(2, 130, 32, generator=g), torch.randn(2, 130, 130, generator=g)
    project_q, project_k = torch.nn.Linear(32, 4 * 8), torch.nn.Linear(32, 2 * 8)
    parameters = [*project_q.parameters(), *project_k.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.05)
    cos, sin = _tables((130, 8))

    def loss_of(backend):
        q = project_q(tokens).view(2, 130, 4, 8).transpose(1, 2)
        k = project_k(tokens).view(2, 130, 2, 8).transpose(1, 2)
        q, k = nki_ops.rope(q, k, cos, sin, backend=backend)
        scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)  # grouped-query heads
        return (scores.mean(dim=1) - target).pow(2).mean()

    check_compiled_training(loss_of, parameters, optimizer)


# ---------------------------------------------------------------------------------- bad inputs

def _bad(**changes):
    q, k = (t.detach() for t in _inputs(2, 4, 2, 8, 16))
    cos, sin = _tables((8, 16))
    args = dict(q=q, k=k, cos=cos, sin=sin)
    args.update(changes)
    return args


@pytest.mark.parametrize("args, message", [
    (_bad(q=torch.rand(4, 8, 16)), r"q must be a 4-D tensor \[B, H, S, D\], got shape \(4, 8, 16\)"),
    (_bad(k=torch.rand(2, 2, 9, 16)), r"k must be \[2, Hkv, 8, 16\] \(q's batch, positions and head size\), "
                                      r"got \(2, 2, 9, 16\)"),
    (_bad(q=torch.rand(2, 4, 8, 15), k=torch.rand(2, 2, 8, 15), cos=torch.rand(8, 15), sin=torch.rand(8, 15)),
     r"head size D must be a positive even number .*got 15"),
    (_bad(q=torch.rand(2, 4, 8, 0), k=torch.rand(2, 2, 8, 0), cos=torch.rand(8, 0), sin=torch.rand(8, 0)),
     r"head size D must be a positive even number .*got 0"),
    (_bad(k=torch.rand(2, 2, 8, 16, dtype=torch.float64)), r"q and k must have the same dtype, got torch.float32 "
                                                           r"and torch.float64"),
    (_bad(sin=torch.rand(2, 8, 16)), r"cos and sin must have the same shape, got \(8, 16\) and \(2, 8, 16\)"),
    (_bad(cos=torch.rand(8, 8), sin=torch.rand(8, 8)),
     r"cos and sin must be \[S, D\] = \[8, 16\] or \[B, S, D\] = \[2, 8, 16\] \(B may be 1\), got \(8, 8\)"),
    (_bad(cos=torch.rand(3, 8, 16), sin=torch.rand(3, 8, 16)), r"\(B may be 1\), got \(3, 8, 16\)"),
    (_bad(cos=torch.rand(1, 2, 8, 16), sin=torch.rand(1, 2, 8, 16)), r"\(B may be 1\), got \(1, 2, 8, 16\)"),
    (_bad(sin=torch.rand(8, 16, dtype=torch.float16)), r"cos and sin must have the same dtype"),
    (_bad(cos=torch.ones(8, 16, dtype=torch.int32)), r"cos must have a floating dtype"),
    (_bad(q=[1.0]), r"q must be a torch.Tensor, got list"),
    (_bad(sin=torch.rand(8, 16, device="meta")), r"must be on the same device, got cpu and cpu and cpu and meta"),
])
@pytest.mark.parametrize("backend", ["torch", "nki"])
def test_bad_inputs_say_what_was_expected_and_what_came(args, message, backend):
    with pytest.raises(ValueError, match=message):
        nki_ops.rope(**args, backend=backend)


@pytest.mark.simulation
def test_the_kernels_check_their_own_inputs():
    q, k = torch.rand(1, 2, 4, 6), torch.rand(1, 1, 4, 6)
    with pytest.raises(AssertionError, match=r"cos must be HBM \[1, 4, 6\] or \[1, 4, 6\], got \(1, 4, 8\)"):
        nki_kernel.rope_kernel(q, k, torch.rand(1, 4, 8), torch.rand(1, 4, 8))
    with pytest.raises(AssertionError, match=r"head size D must be a positive even number, got 5"):
        nki_kernel.rope_backward_kernel(torch.rand(1, 2, 4, 5), torch.rand(1, 1, 4, 5), torch.rand(1, 4, 5),
                                        torch.rand(1, 4, 5))
    with pytest.raises(AssertionError, match=r"must be float32, bfloat16 or float16, got int32"):
        nki_kernel.rope_kernel(q.int(), k.int(), torch.rand(1, 4, 6), torch.rand(1, 4, 6))


@pytest.mark.neuron
def test_rope_on_a_neuron_device_matches_the_reference():
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()
    q, k = _inputs(2, 4, 2, 300, 128)
    cos, sin = _tables((300, 128))
    grads = (torch.randn(q.shape), torch.randn(k.shape))
    qd, kd = (t.detach().to(device).requires_grad_() for t in (q, k))
    rotated = nki_ops.rope(qd, kd, cos.to(device), sin.to(device), backend="nki")
    torch.autograd.backward(rotated, tuple(g.to(device) for g in grads))
    expected = _rotated_and_grads(q, k, cos, sin, None, grads)
    for got, want in zip((*rotated, qd.grad, kd.grad), expected):
        torch.testing.assert_close(got.detach().cpu().double(), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ conformance strategy

# (rtol, atol) against the reference on the conformance suite's values (up to 1e4, NaN and inf mixed
# in, tables in [-1, 1]): the kernels form the reference's two fp32 products and their fp32 sum, so an
# element may differ by an ulp of the output dtype, or where its terms cancel by an fp32 rounding of
# the terms (up to 2e4 * 2**-23 = 2.4e-3).
CONFORMANCE_TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (2.0 ** -23, 4e-3),
                   torch.float16: (2.0 ** -10, 4e-3), torch.bfloat16: (2.0 ** -7, 4e-3)}


@st.composite
def conformance_case(draw):
    """Random rope inputs for tests/ops/test_conformance.py, with head sizes and tables it must refuse."""
    from tests.ops.test_conformance import DTYPES, SIZES, Case, _values

    dtype = draw(st.sampled_from(DTYPES))
    batch, hkv = draw(st.sampled_from([1, 2, 0])), draw(st.sampled_from([1, 2, 0]))
    hq = draw(st.sampled_from([1, 3]))
    seq, dim = draw(SIZES), draw(st.sampled_from([2, 4, 10, 64, 3]))
    if batch * (hq + hkv) * seq * dim > 20000:
        seq = seq % 8
    finite = st.floats(-1e4, 1e4, allow_subnormal=False, width=16)
    q = _values(draw, (batch, hq, seq, dim), finite, 0.2).to(dtype)
    k = _values(draw, (batch, hkv, seq, dim), finite, 0.1).to(dtype)
    table_shape = draw(st.sampled_from([(seq, dim), (1, seq, dim), (batch, seq, dim)]))
    if draw(st.integers(0, 7)) == 0:
        table_shape = (seq + 1, dim)  # positions q and k do not have
    table_dtype = draw(st.sampled_from([dtype, torch.float32]))
    unit = st.floats(-1, 1, width=16)
    cos, sin = (_values(draw, table_shape, unit, 0.05).to(table_dtype) for _ in range(2))
    rtol, atol = CONFORMANCE_TOL[dtype]
    return Case([q, k, cos, sin], atol=atol, rtol=rtol)
