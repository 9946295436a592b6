"""nki_ops.attention on every backend against the float64 reference: ragged S and S_kv, S != S_kv, grouped
query heads, causal, sliding window, softcap, seq_lens with empty and full rows, D up to 128, three dtypes;
gradients; fully masked tiles skipped by the NKI kernels; torch.compile; bad inputs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

import nki_ops
from nki_ops.ops.attention import nki_kernel
from nki_ops.ops.attention.reference import attention_reference

# (atol, rtol) against the float64 reference, forward and gradients. Half types: the kernels round the
# probabilities (and d scores) to the input dtype before each matmul, the reference computes in fp32.
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (4e-2, 4e-2), torch.float16: (5e-3, 5e-3)}

CASES = {
    # name: (B, Hq, Hkv, S, S_kv, D, options)
    "ragged, S < S_kv": (1, 2, 1, 200, 300, 32, {}),
    "causal, GQA 4": (1, 4, 1, 130, 130, 64, dict(causal=True)),
    "causal, S > S_kv": (1, 2, 2, 300, 140, 32, dict(causal=True)),
    "window, GQA 2": (2, 4, 2, 150, 260, 128, dict(sliding_window=40)),
    "causal window, softcap": (1, 2, 1, 260, 260, 64, dict(causal=True, sliding_window=100, softcap=4.0)),
    "seq_lens empty, full, partial": (3, 2, 1, 140, 140, 32, dict(causal=True, seq_lens=[0, 140, 77])),
    "seq_lens, scale, no causal": (2, 1, 1, 129, 129, 32, dict(seq_lens=[129, 1], scale=0.3)),
}


def _inputs(b, hq, hkv, s, s_kv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).requires_grad_()
            for shape in ((b, hq, s, d), (b, hkv, s_kv, d), (b, hkv, s_kv, d))]


def _options(options):
    options = dict(options)
    if "seq_lens" in options:
        options["seq_lens"] = torch.tensor(options["seq_lens"])
    return options


def _forward_backward(q, k, v, options, backend, grad=None):
    """Output and the gradients of q, k, v for a fixed output gradient."""
    out = nki_ops.attention(q, k, v, **options, backend=backend) if backend else attention_reference(
        q, k, v, options.get("causal", False), options.get("sliding_window"), options.get("softcap"),
        options.get("scale"), options.get("seq_lens"))
    if grad is None:
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    q.grad = k.grad = v.grad = None
    out.backward(grad.to(out.dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


def _expected(q, k, v, options):
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    return _forward_backward(*wide, options, None)


def _assert_close(got, expected, dtype):
    atol, rtol = TOLERANCE[dtype]
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
        scale = max(1.0, e.abs().max().item())
        torch.testing.assert_close(g.double(), e, atol=atol * scale, rtol=rtol, msg=lambda m: f"{name}: {m}")


@pytest.mark.simulation
@pytest.mark.parametrize("case", CASES)
def test_nki_matches_the_float64_reference(case):
    *shape, options = CASES[case]
    options = _options(options)
    q, k, v = _inputs(*shape)
    _assert_close(_forward_backward(q, k, v, options, "nki"), _expected(q, k, v, options), torch.float32)


@pytest.mark.parametrize("case", CASES)
def test_torch_backend_matches_the_float64_reference(case):
    *shape, options = CASES[case]
    options = _options(options)
    q, k, v = _inputs(*shape)
    _assert_close(_forward_backward(q, k, v, options, "torch"), _expected(q, k, v, options), torch.float32)


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nki_half_precision(dtype):
    options = dict(causal=True, sliding_window=150, seq_lens=torch.tensor([200, 90]))
    q, k, v = _inputs(2, 2, 1, 200, 200, 64, dtype)
    got = _forward_backward(q, k, v, options, "nki")
    assert all(t.dtype == dtype for t in got)
    _assert_close(got, _expected(q, k, v, options), dtype)


@pytest.mark.parametrize("options", [dict(causal=True), dict(sliding_window=2, softcap=1.5),
                                     dict(causal=True, seq_lens=[0, 4]), dict(seq_lens=[3, 5], scale=0.7)])
def test_torch_path_gradcheck_in_float64(options):
    q, k, v = (t.detach().double().requires_grad_() for t in _inputs(2, 2, 1, 4, 5, 3))
    options = _options(options)
    assert torch.autograd.gradcheck(lambda *x: nki_ops.attention(*x, **options, backend="torch"), (q, k, v))


def test_rows_past_their_length_and_rows_seeing_no_key_give_zeros():
    q, k, v = _inputs(2, 2, 2, 6, 3, 8)
    out = nki_ops.attention(q, k, v, seq_lens=torch.tensor([0, 2]), backend="torch")
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[1, :, 2:], torch.zeros_like(out[1, :, 2:]))
    # sliding window 2 without causal: rows 4 and 5 are more than one position from keys 0..2
    out = nki_ops.attention(q, k, v, sliding_window=2, backend="torch")
    assert torch.equal(out[:, :, 4:], torch.zeros_like(out[:, :, 4:])) and out[:, :, :4].abs().sum() > 0


# ------------------------------------------------------------------------ conformance strategy

CONFORMANCE_TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (2e-5, 1e-4), torch.float16: (5e-3, 5e-3),
                   torch.bfloat16: (4e-2, 4e-2)}


@st.composite
def conformance_case(draw):
    """Random attention inputs and options for tests/ops/test_conformance.py."""
    from tests.ops.test_conformance import DTYPES, SIZES, Case, _values

    dtype = draw(st.sampled_from(DTYPES))
    batch, kv_heads, group = (draw(st.sampled_from([1, 2])) for _ in range(3))
    rows, cols, dim = draw(SIZES), draw(SIZES), draw(st.sampled_from([1, 8, 32]))
    finite = st.floats(-2, 2, width=16)
    q, k, v = (_values(draw, shape, finite, 0.0).to(dtype) for shape in
               ((batch, kv_heads * group, rows, dim), (batch, kv_heads, cols, dim), (batch, kv_heads, cols, dim)))
    options = {"causal": draw(st.booleans()), "sliding_window": draw(st.sampled_from([None, 1, 3, 130])),
               "softcap": draw(st.sampled_from([None, 2.0])), "scale": draw(st.sampled_from([None, 0.5]))}
    if draw(st.booleans()):
        options["seq_lens"] = torch.tensor(draw(st.lists(st.integers(0, cols), min_size=batch, max_size=batch)))
    atol, rtol = CONFORMANCE_TOL[dtype]
    return Case([q, k, v], options, atol=atol, rtol=rtol)


# --------------------------------------------------------------------------------- tiles skipped

def _count_matmuls(monkeypatch, run):
    count = {"n": 0}
    original = nki_kernel.nisa.nc_matmul

    def counting(*args, **kwargs):
        count["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(nki_kernel.nisa, "nc_matmul", counting)
    run()
    monkeypatch.setattr(nki_kernel.nisa, "nc_matmul", original)
    return count["n"]


@pytest.mark.simulation
@pytest.mark.parametrize("options, forward, backward", [
    # 4 query tiles of 128 over 512 keys. Forward: per query tile one score matmul per key block
    # and one probs @ v matmul per 128 keys. Backward: 5 matmuls per visited (query, key) tile pair.
    (dict(), 4 * (1 + 4), 5 * 16),
    (dict(causal=True), (1 + 1) + (1 + 2) + (1 + 3) + (1 + 4), 5 * 10),  # tile i sees 128 * (i + 1) keys
    (dict(causal=True, sliding_window=128), (1 + 1) + 3 * (1 + 2), 5 * 7),  # 255 keys: 2 chunks; 7 pairs
])
def test_fully_masked_tiles_are_skipped(monkeypatch, options, forward, backward):
    q, k, v = _inputs(1, 1, 1, 512, 512, 32)
    out = nki_ops.attention(q, k, v, **options, backend="nki")
    assert _count_matmuls(monkeypatch, lambda: nki_ops.attention(q, k, v, **options, backend="nki")) == forward
    assert _count_matmuls(monkeypatch, lambda: out.backward(torch.ones_like(out))) == backward


# ------------------------------------------------------------------------------- torch.compile

@pytest.mark.simulation
def test_compiles_with_fullgraph_and_trains():
    torch._dynamo.reset()
    q, k, v = _inputs(2, 2, 1, 20, 20, 16)
    seq_lens = torch.tensor([20, 13])

    # aot_eager traces forward and backward as inductor does (fake kernels, autograd formula) without
    # generating code; tests/test_training.py compiles the op with inductor.
    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(q, k, v):
        return nki_ops.attention(q, k, v, causal=True, seq_lens=seq_lens, backend="nki").square().sum()

    value = loss(q, k, v)
    value.backward()
    expected = [t.detach().double().requires_grad_() for t in (q, k, v)]
    reference = attention_reference(*expected, True, None, None, None, seq_lens).square().sum()
    reference.backward()
    torch.testing.assert_close(value.double(), reference, rtol=1e-5, atol=1e-5)
    for got, want in zip((q, k, v), expected):
        torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------- bad inputs

def _bad(**changes):
    q, k, v = (t.detach() for t in _inputs(2, 4, 2, 8, 8, 16))
    args = dict(q=q, k=k, v=v)
    args.update(changes)
    return args


@pytest.mark.parametrize("args, message", [
    (_bad(q=torch.rand(4, 8, 16)), r"q must be a 4-D tensor \[B, H, S, D\], got shape \(4, 8, 16\)"),
    (_bad(k=torch.rand(2, 3, 8, 16), v=torch.rand(2, 3, 8, 16)),
     r"multiple of the key/value heads, got Hq=4 and Hkv=3"),
    (_bad(v=torch.rand(2, 2, 9, 16)), r"k and v must have the same shape"),
    (_bad(k=torch.rand(2, 2, 8, 8), v=torch.rand(2, 2, 8, 8)), r"must be \[2, Hkv, S_kv, 16\]"),
    (_bad(q=torch.rand(2, 4, 8, 129), k=torch.rand(2, 2, 8, 129), v=torch.rand(2, 2, 8, 129)),
     r"head size D must be 1 to 128, got 129"),
    (_bad(q=torch.rand(2, 4, 8, 16, dtype=torch.float64)), r"same dtype, got torch.float64, torch.float32"),
    (_bad(q=torch.ones(2, 4, 8, 16, dtype=torch.int32)), r"q must have a floating dtype"),
    (_bad(causal=1), r"causal must be a bool, got 1"),
    (_bad(sliding_window=0), r"sliding_window must be None or an int >= 1, got 0"),
    (_bad(softcap=math.nan), r"softcap must be a finite number >= 0, got nan"),
    (_bad(scale=0.0), r"scale must be None or a number > 0, got 0"),
    (_bad(seq_lens=torch.tensor([8.0, 8.0])), r"seq_lens must be a 1-D integer tensor with one length per batch"),
    (_bad(seq_lens=torch.tensor([8])), r"one length per batch row \(2\), got torch.int64 of shape \(1,\)"),
    (_bad(seq_lens=torch.tensor([3, 9])), r"seq_lens must be in \[0, S_kv=8\], got \[3, 9\]"),
])
@pytest.mark.parametrize("backend", ["torch", "nki"])
def test_bad_inputs_say_what_was_expected_and_what_came(args, message, backend):
    with pytest.raises(ValueError, match=message):
        nki_ops.attention(**args, backend=backend)


def test_the_kernel_checks_its_own_inputs():
    q_t = torch.rand(1, 2, 16, 8)
    with pytest.raises(Exception, match=r"query heads \(2\) must be a multiple of the key/value heads \(3\)"):
        nki_kernel.flash_attention_kernel(q_t, torch.rand(1, 3, 16, 8), torch.rand(1, 3, 8, 16), None, 0.25, False,
                                          0, 0.0)
    with pytest.raises(Exception, match=r"q and k must both be float32, bfloat16 or float16, got int32"):
        nki_kernel.flash_attention_kernel(q_t.int(), torch.rand(1, 1, 16, 8).int(), torch.rand(1, 1, 8, 16).int(),
                                          None, 0.25, False, 0, 0.0)


# ------------------------------------------------------------------------------ training example

VIT = Path(__file__).resolve().parents[2] / "examples" / "vit_train.py"


def _vit_losses(attention: str) -> list[float]:
    env = dict(os.environ, NKI_OPS_TUNE_PARAMS=json.dumps({"steps": 3, "warmup_steps": 1, "batch_size": 4}))
    result = subprocess.run([sys.executable, str(VIT), "--attention", attention], env=env, capture_output=True,
                            text=True, check=True, timeout=300)
    line = next(line for line in result.stdout.splitlines() if line.startswith("losses: "))
    return [float(x) for x in line.split()[1:]]


@pytest.mark.simulation
def test_vit_example_trains_on_the_nki_kernels_along_the_torch_loss_curve():
    reference = _vit_losses("torch")
    assert len(reference) == 3
    torch.testing.assert_close(_vit_losses("nki"), reference, rtol=1e-4, atol=1e-5)
