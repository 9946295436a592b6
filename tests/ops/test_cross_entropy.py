"""nki_ops.cross_entropy and nki_ops.fused_linear_cross_entropy on every backend against the float64
reference (itself checked against torch.nn.functional.cross_entropy): every reduction with ignore_index,
label smoothing and softcap, odd sizes, three dtypes, -inf logits; gradients of every input, computed in
the forward pass; the fused op's memory; torch.compile training; bad inputs."""

from __future__ import annotations

import itertools
import math
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import nki_ops
from nki_ops.ops.cross_entropy import nki_kernel, torch_op
from nki_ops.ops.cross_entropy.nki_op import (
    cross_entropy_forward_nki,
    fused_linear_cross_entropy_forward_nki,
    scale_rows_nki,
)
from nki_ops.ops.cross_entropy.reference import cross_entropy_reference, fused_linear_cross_entropy_reference
from nki_ops.sim import configure

from .compiled_training import check_compiled_training

# Every combination of the options: reduction x ignored rows x label smoothing x softcap.
OPTIONS = [dict(reduction=r, ignore_index=i, label_smoothing=s, softcap=c)
           for r, i, s, c in itertools.product(("mean", "sum", "none"), (-100, 3), (0.0, 0.2), (None, 4.0))]


def _option_id(options):
    return "-".join(f"{k}={v}" for k, v in options.items())


def _inputs(rows, vocab, dtype=torch.float32, seed=0, ignored=(3, 17), ignore_index=-100):
    """Logits with a spread like a language model's (a few nats), and targets with rows ``ignored`` set
    to ``ignore_index`` (a class index too when it is >= 0: rows of that class are ignored as well)."""
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, vocab, generator=g)).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=g)
    for row in ignored:
        if row < rows:
            target[row] = ignore_index
    return logits, target


def _loss_and_grad(logits, target, options, backend, grad=None):
    x = logits.detach().clone().requires_grad_()
    loss = nki_ops.cross_entropy(x, target, **options, backend=backend) if backend else \
        cross_entropy_reference(x, target, options.get("ignore_index", -100), options.get("reduction", "mean"),
                                options.get("label_smoothing", 0.0), options.get("softcap"))
    if grad is None:
        grad = torch.randn(loss.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    loss.backward(grad.to(loss.dtype))
    return loss.detach(), x.grad


def _expected(logits, target, options):
    return _loss_and_grad(logits.double(), target, options, None)


# ------------------------------------------------------------------------------- torch reference

@pytest.mark.parametrize("options", OPTIONS, ids=_option_id)
def test_reference_is_torch_cross_entropy_of_the_softcapped_logits(options):
    logits, target = _inputs(37, 11, torch.float64, ignore_index=options["ignore_index"])
    softcap = options["softcap"]
    capped = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    expected = F.cross_entropy(capped, target, ignore_index=options["ignore_index"], reduction=options["reduction"],
                               label_smoothing=options["label_smoothing"])
    torch.testing.assert_close(nki_ops.cross_entropy(logits, target, **options, backend="torch"), expected,
                               rtol=0, atol=0)


def test_label_smoothing_by_hand():
    # loss = (1 - s) * (lse - x_t) + s * (lse - mean(x)), mean over the counted rows.
    logits, target = _inputs(9, 5, torch.float64)
    lse = logits.logsumexp(1)
    counted = target != -100
    rows = 0.9 * (lse - logits.gather(1, target.clamp(min=0)[:, None])[:, 0]) + 0.1 * (lse - logits.mean(1))
    got = nki_ops.cross_entropy(logits, target, label_smoothing=0.1, backend="torch")
    torch.testing.assert_close(got, rows[counted].mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("options", [dict(), dict(label_smoothing=0.3, softcap=2.0, reduction="sum")])
def test_torch_path_gradcheck_in_float64(options):
    logits, target = _inputs(6, 7, torch.float64)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: nki_ops.cross_entropy(x, target, **options, backend="torch"),
                                    (logits,))


# ------------------------------------------------------------------------------------ nki kernels

@pytest.mark.simulation
@pytest.mark.parametrize("options", OPTIONS, ids=_option_id)
def test_nki_matches_the_float64_reference_for_every_option(options):
    logits, target = _inputs(130, 1030, ignore_index=options["ignore_index"])
    loss, grad = _loss_and_grad(logits, target, options, "nki")
    expected_loss, expected_grad = _expected(logits, target, options)
    assert loss.dtype == torch.float32 and loss.shape == expected_loss.shape
    # fp32 sums over 1,030 classes (and, reduced, 130 rows) against float64.
    torch.testing.assert_close(loss.double(), expected_loss, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-7)
    ignored = target == options["ignore_index"]
    assert torch.equal(grad[ignored], torch.zeros_like(grad[ignored]))


@pytest.mark.simulation
@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, 2), (127, 513), (129, 512), (257, 3)])
def test_nki_odd_sizes(rows, vocab):
    logits, target = _inputs(rows, vocab)
    options = dict(label_smoothing=0.1, softcap=10.0)
    loss, grad = _loss_and_grad(logits, target, options, "nki")
    expected_loss, expected_grad = _expected(logits, target, options)
    torch.testing.assert_close(loss.double(), expected_loss, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-7)


# Half types in, fp32 math: the loss and dlogits are rounded once to the input dtype, and the backward
# rounds dlogits times the incoming gradient once more: two ulps of the half type.
HALF_TOLERANCE = {torch.bfloat16: dict(rtol=2.0 ** -6, atol=1e-6), torch.float16: dict(rtol=2.0 ** -9, atol=2.0 ** -23)}


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_TOLERANCE))
@pytest.mark.parametrize("options", [dict(), dict(reduction="none", label_smoothing=0.1, softcap=5.0)],
                         ids=_option_id)
def test_nki_half_precision(dtype, options):
    logits, target = _inputs(130, 700, dtype)
    loss, grad = _loss_and_grad(logits, target, options, "nki")
    # The reference on the same half logits, computed in float64, rounded as the op rounds.
    expected_loss, expected_grad = _expected(logits, target, options)
    assert loss.dtype == dtype and grad.dtype == dtype
    torch.testing.assert_close(loss.double(), expected_loss.to(dtype).double(), **HALF_TOLERANCE[dtype])
    torch.testing.assert_close(grad.double(), expected_grad.to(dtype).double(), **HALF_TOLERANCE[dtype])


@pytest.mark.simulation
@pytest.mark.parametrize("options", [dict(reduction="none"), dict(reduction="none", softcap=3.0),
                                     dict(label_smoothing=0.2)], ids=_option_id)
def test_minus_inf_logits_are_masked_classes(options):
    # Row 5 masks half its classes, row 6 its own target (an infinite loss, as torch's), row 3 is
    # ignored and masks everything: loss 0 and, as torch's (its softmax is 0 / 0), a NaN gradient.
    logits, target = _inputs(140, 600)
    logits[5, :300] = -math.inf
    logits[6, target[6]] = -math.inf
    logits[3] = -math.inf
    loss, grad = _loss_and_grad(logits, target, options, "nki")
    expected_loss, expected_grad = _loss_and_grad(logits, target, options, "torch")
    torch.testing.assert_close(loss, expected_loss, rtol=2e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-7, equal_nan=True)
    assert grad[5].isfinite().all()
    if options == dict(reduction="none"):  # a softcap makes -inf -softcap; smoothing gives every class -s / V
        assert torch.equal(grad[5, :300], torch.zeros(300))
        assert loss[6] == math.inf and loss[3] == 0 and loss[5].isfinite()


@pytest.mark.parametrize("backend", ["torch", pytest.param("nki", marks=pytest.mark.simulation)])
def test_a_mean_over_no_counted_row_is_nan_with_zero_gradients_as_torch(backend):
    for rows in (0, 4):
        logits, target = _inputs(rows, 9, ignored=range(rows))
        loss, grad = _loss_and_grad(logits, target, dict(), backend, grad=torch.tensor(1.0))
        assert loss.isnan() and torch.equal(grad, torch.zeros(rows, 9))
        assert nki_ops.cross_entropy(logits, target, reduction="sum", backend=backend) == 0


@pytest.mark.simulation
def test_the_backward_scales_the_saved_gradient_without_reading_the_logits(monkeypatch):
    logits, target = _inputs(130, 600)
    x = logits.clone().requires_grad_()
    loss = nki_ops.cross_entropy(x, target, reduction="none", backend="nki")
    calls = []
    for name in ("cross_entropy_kernel", "scale_rows_kernel"):
        original = getattr(nki_kernel, name)
        monkeypatch.setattr("nki_ops.ops.cross_entropy.nki_op." + name,
                            lambda *args, original=original, name=name: calls.append(name) or original(*args))
    grad = torch.randn(130)
    loss.backward(grad)
    assert calls == ["scale_rows_kernel"]
    _, expected = _loss_and_grad(logits.double(), target, dict(reduction="none"), None, grad=grad.double())
    torch.testing.assert_close(x.grad.double(), expected, rtol=1e-4, atol=1e-7)


@pytest.mark.simulation
def test_inputs_are_left_alone():
    logits, target = _inputs(130, 600)
    saved = logits.clone(), target.clone()
    x = logits.requires_grad_()
    nki_ops.cross_entropy(x, target, label_smoothing=0.1, backend="nki").backward()
    assert torch.equal(logits.detach(), saved[0]) and torch.equal(target, saved[1])


@pytest.mark.simulation
def test_float64_is_refused_with_reason():
    logits, target = _inputs(3, 8, torch.float64)
    with pytest.raises(nki_ops.BackendUnavailableError, match="float32"):
        nki_ops.cross_entropy(logits, target, backend="nki")


@pytest.mark.simulation
def test_opcheck_of_the_library_ops():
    logits = torch.randn(5, 24, requires_grad=True)
    target = torch.tensor([[1.0], [-1.0], [0.0], [23.0], [5.0]])
    weight = torch.tensor([[0.25], [0.0], [0.25], [0.25], [0.25]])
    torch.library.opcheck(cross_entropy_forward_nki, (logits, target, weight, 0.1, 2.0))
    torch.library.opcheck(scale_rows_nki, (torch.randn(5, 24), torch.randn(5)))


@pytest.mark.simulation
def test_compiled_fullgraph_training_step_through_the_public_op():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    features, target = torch.randn(130, 32, generator=g), torch.randint(0, 300, (130,), generator=g)
    target[:7] = -100
    head = torch.nn.Linear(32, 300)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)

    def loss_of(backend):
        return nki_ops.cross_entropy(head(features), target, label_smoothing=0.1, softcap=30.0, backend=backend)

    check_compiled_training(loss_of, list(head.parameters()), optimizer, loss_atol=1e-6)


# ---------------------------------------------------------------------------------- bad inputs

LOGITS = torch.randn(4, 6)
TARGET = torch.tensor([0, 5, -100, 2])


@pytest.mark.parametrize("args, options, message", [
    ((torch.randn(6), TARGET), {}, r"logits must be a 2-D tensor \[N, V\] with V >= 1 classes, got shape \(6,\)"),
    ((torch.randn(4, 0), TARGET), {}, r"V >= 1 classes, got shape \(4, 0\)"),
    ((torch.ones(4, 6, dtype=torch.int64), TARGET), {}, r"logits must have a floating dtype"),
    ((LOGITS, TARGET.float()), {}, r"target must be an integer tensor of class indices, got torch.float32"),
    ((LOGITS, [0, 1, 2, 3]), {}, r"target must be an integer tensor of class indices, got list"),
    ((LOGITS, TARGET[:3]), {}, r"one class index per row \(4\), got shape \(3,\)"),
    ((LOGITS, torch.tensor([0, 6, 1, 2])), {}, r"class indices in \[0, 6\) or ignore_index \(-100\), got values "
                                                r"from 0 to 6"),
    ((LOGITS, torch.tensor([0, -1, 1, 2])), {}, r"got values from -1 to 2"),
    ((LOGITS, TARGET), dict(reduction="avg"), r"'none', 'mean' or 'sum', got 'avg'"),
    ((LOGITS, TARGET), dict(label_smoothing=1.5), r"label_smoothing must be a finite number in \[0, 1\], got 1.5"),
    ((LOGITS, TARGET), dict(softcap=0.0), r"softcap must be None or a number > 0, got 0"),
    ((LOGITS, TARGET), dict(softcap=-math.inf), r"softcap must be a finite number >= 0, got -inf"),
    ((LOGITS, TARGET), dict(ignore_index=2.0), r"ignore_index must be an int, got 2.0"),
    ((LOGITS, TARGET.to("meta")), {}, r"logits and target must be on the same device, got cpu and meta"),
])
@pytest.mark.parametrize("backend", ["torch", pytest.param("nki", marks=pytest.mark.simulation)])
def test_bad_inputs_say_what_was_expected_and_what_came(args, options, message, backend):
    with pytest.raises(ValueError, match=message):
        nki_ops.cross_entropy(*args, **options, backend=backend)


@pytest.mark.simulation
@pytest.mark.parametrize("kernel, args, message", [
    (nki_kernel.cross_entropy_kernel, (torch.zeros(3, 8), torch.zeros(3, 1), torch.zeros(2, 1), 0.0, 0.0),
     r"row_weight must be HBM \[3, 1\] float32, got \(2, 1\) float32"),
    (nki_kernel.cross_entropy_kernel, (torch.zeros(3, 8).int(), torch.zeros(3, 1), torch.zeros(3, 1), 0.0, 0.0),
     r"logits must be float32, bfloat16 or float16, got int32"),
    (nki_kernel.cross_entropy_kernel, (torch.zeros(3, 8), torch.zeros(3, 1), torch.zeros(3, 1), 1.5, 0.0),
     r"label_smoothing must be in \[0, 1\], got 1.5"),
    (nki_kernel.scale_rows_kernel, (torch.zeros(3, 8), torch.zeros(3, 2)),
     r"grad must be HBM \[3, 1\] float32, got \(3, 2\) float32"),
])
def test_the_kernels_check_their_own_inputs(kernel, args, message):
    with pytest.raises(AssertionError, match=message):
        kernel(*args)


# ------------------------------------------------------------------------- fused linear cross-entropy

# Every combination the fused op takes: reduction (no "none") x ignored rows x smoothing x softcap x bias.
FUSED_OPTIONS = [dict(reduction=r, ignore_index=i, label_smoothing=s, softcap=c, bias=b)
                 for r, i, s, c, b in itertools.product(("mean", "sum"), (-100, 3), (0.0, 0.2), (None, 4.0),
                                                        (True, False))]


def _bias_on(options):
    """On for half of the combinations of reduction, smoothing and softcap: by their parity."""
    flags = (options["reduction"] == "mean", options["label_smoothing"] > 0, options["softcap"] is not None)
    return sum(flags) % 2 == 0


# Each combination of the four loss options once, with the bias on for half of them.
FUSED_OPTION_CASES = [o for o in FUSED_OPTIONS if o["bias"] is _bias_on(o)]


def _fused_inputs(rows, hidden_size, vocab, dtype=torch.float32, seed=0, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=g).to(dtype)
    weight = (2 * torch.randn(vocab, hidden_size, generator=g) / hidden_size ** 0.5).to(dtype)
    bias = (0.5 * torch.randn(vocab, generator=g)).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[3::11] = ignore_index
    return hidden, weight, bias, target


def _fused_loss_and_grads(hidden, weight, bias, target, options, backend, grad=2.5):
    """The loss and the gradients of hidden, weight (and bias) for an incoming gradient ``grad``."""
    options = dict(options)
    leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias if options.pop("bias", True)
                                                           else None) if t is not None]
    args = (leaves[0], leaves[1], target, leaves[2] if len(leaves) == 3 else None)
    loss = nki_ops.fused_linear_cross_entropy(*args, **options, backend=backend) if backend else \
        fused_linear_cross_entropy_reference(*args, options.get("ignore_index", -100), options.get("reduction", "mean"),
                                             options.get("label_smoothing", 0.0), options.get("softcap"))
    loss.backward(torch.tensor(grad, dtype=loss.dtype))
    return [loss.detach(), *(t.grad for t in leaves)]


def _fused_expected(hidden, weight, bias, target, options):
    return _fused_loss_and_grads(hidden.double(), weight.double(), bias.double(), target, options, None)


def _assert_fused_close(got, expected, rtol, atol):
    for name, g, e in zip(("loss", "d_hidden", "d_weight", "d_bias"), got, expected):
        assert g.shape == e.shape, name
        scale = e.abs().max().item()
        torch.testing.assert_close(g.double(), e, rtol=rtol, atol=atol * scale, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("options", FUSED_OPTIONS[::3], ids=_option_id)
def test_fused_reference_is_cross_entropy_of_the_linear_layer(options):
    hidden, weight, bias, target = _fused_inputs(20, 6, 9, torch.float64, ignore_index=options["ignore_index"])
    options = dict(options)
    with_bias = options.pop("bias")
    logits = hidden @ weight.T + (bias if with_bias else 0)
    expected = nki_ops.cross_entropy(logits, target, **options, backend="torch")
    got = fused_linear_cross_entropy_reference(hidden, weight, target, bias if with_bias else None,
                                               *(options[k] for k in ("ignore_index", "reduction", "label_smoothing",
                                                                      "softcap")))
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("step", [1, 7, None])
@pytest.mark.parametrize("options", FUSED_OPTIONS[::3], ids=_option_id)
def test_fused_torch_backend_chunks_match_the_float64_reference(monkeypatch, options, step):
    # Chunks of 1 and 7 rows, and the rule's own (ceil(N * H / V) = 6 rows here), loss and gradients.
    if step is not None:
        monkeypatch.setattr(torch_op, "chunk_rows", lambda *shape: step)
    inputs = _fused_inputs(40, 9, 60, torch.float64, ignore_index=options["ignore_index"])
    got = _fused_loss_and_grads(*inputs, options, "torch", grad=0.7)
    _assert_fused_close(got, _fused_loss_and_grads(*inputs, options, None, grad=0.7), rtol=1e-12, atol=1e-14)


def test_fused_torch_chunk_rows_keep_the_logits_within_hiddens_size():
    assert torch_op.chunk_rows(4096, 1024, 32000) == 132  # 132 x 32,000 logits <= 4,096 x 1,024 hidden, about
    assert torch_op.chunk_rows(10, 1000, 50) == 10
    assert torch_op.chunk_rows(3, 1, 10 ** 6) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_torch_backend_half_precision(dtype):
    # fp32 math on half inputs, as the composition's reference: the same fp32 values up to summation order.
    inputs = _fused_inputs(50, 24, 300, dtype)
    options = dict(label_smoothing=0.1, softcap=20.0)
    got = _fused_loss_and_grads(*inputs, options, "torch")
    assert all(t.dtype == dtype for t in got)
    expected = [t.double() for t in _fused_loss_and_grads(*inputs, options, None)]
    _assert_fused_close(got, expected, rtol=2 ** -7, atol=2 ** -9)


def test_fused_torch_path_gradcheck_in_float64():
    hidden, weight, bias, target = (t.requires_grad_() if t.is_floating_point() else t
                                    for t in _fused_inputs(13, 4, 7, torch.float64))
    assert torch.autograd.gradcheck(
        lambda h, w, b: nki_ops.fused_linear_cross_entropy(h, w, target, b, label_smoothing=0.2, softcap=3.0,
                                                           backend="torch"), (hidden, weight, bias))


def test_fused_torch_opcheck_of_the_library_op():
    hidden, weight, bias, target = _fused_inputs(9, 8, 24)
    for b in (bias, None):
        torch.library.opcheck(torch_op.fused_linear_cross_entropy_chunked,
                              (hidden.requires_grad_(), weight.requires_grad_(), b, target, -100, "mean", 0.1, 2.0))


@pytest.mark.simulation
@pytest.mark.parametrize("options", FUSED_OPTION_CASES, ids=_option_id)
def test_fused_nki_matches_the_float64_reference_for_every_option(options):
    inputs = _fused_inputs(130, 72, 600, ignore_index=options["ignore_index"])
    got = _fused_loss_and_grads(*inputs, options, "nki")
    assert got[0].dtype == torch.float32 and got[0].shape == ()
    # fp32 matmuls and sums against float64: relative 1e-5 of each gradient's largest entry.
    _assert_fused_close(got, _fused_expected(*inputs, options), rtol=1e-4, atol=1e-5)


@pytest.mark.simulation
@pytest.mark.parametrize("rows, hidden_size, vocab", [(1, 1, 1), (1, 3, 2), (129, 129, 513), (257, 130, 7),
                                                      (127, 300, 129)])
def test_fused_nki_odd_sizes(rows, hidden_size, vocab):
    inputs = _fused_inputs(rows, hidden_size, vocab)
    options = dict(label_smoothing=0.1, softcap=10.0)
    _assert_fused_close(_fused_loss_and_grads(*inputs, options, "nki"), _fused_expected(*inputs, options),
                        rtol=1e-4, atol=1e-5)


@pytest.mark.simulation
@pytest.mark.parametrize("width, tiles", [(512, 1), (256, 2), (128, 3)])
def test_fused_nki_token_chunks_and_vocabulary_widths(monkeypatch, width, tiles):
    # 600 rows make 5 tiles: token chunks of 1, 2 and 3 tiles (d_weight added to in HBM across chunks,
    # a short last chunk), each with another vocabulary chunk width.
    monkeypatch.setattr(nki_kernel, "fused_chunks", lambda *shape: (width, tiles))
    inputs = _fused_inputs(600, 40, 700)
    options = dict(label_smoothing=0.1)
    _assert_fused_close(_fused_loss_and_grads(*inputs, options, "nki"), _fused_expected(*inputs, options),
                        rtol=1e-4, atol=1e-5)


def test_fused_chunk_sizes_follow_the_sbuf_budget():
    # (width, tiles) for N = 1M tokens: large chunks for a small H, narrower vocabulary chunks for a large one.
    assert nki_kernel.fused_chunks(10 ** 6, 1024, 32000, 2) == (512, 10)
    assert nki_kernel.fused_chunks(10 ** 6, 1024, 32000, 4) == (512, 5)
    assert nki_kernel.fused_chunks(300, 1024, 32000, 4) == (512, 3)  # no more tiles than rows
    assert nki_kernel.fused_chunks(10 ** 6, 4096, 128000, 4) == (256, 1)
    assert nki_kernel.fused_chunks(10 ** 6, 8192, 128000, 2) == (128, 1)
    assert nki_kernel.fused_chunks(10 ** 6, 16384, 128000, 2) == (0, 0)
    for rows, hidden_size, vocab, itemsize in itertools.product((10 ** 6,), (64, 1024, 4096, 8192), (1000, 128000),
                                                                (2, 4)):
        width, tiles = nki_kernel.fused_chunks(rows, hidden_size, vocab, itemsize)
        if tiles:
            used = nki_kernel._chunk_fixed_bytes(hidden_size, itemsize, width) + \
                tiles * nki_kernel._tile_bytes(hidden_size, vocab, itemsize, width)
            assert used + nki_kernel.SBUF_RESERVE <= nki_kernel.SBUF_BYTES


@pytest.mark.simulation
def test_fused_nki_fits_trn1_sbuf_at_its_chunk_size(monkeypatch, recwarn):
    # H = 1024 in fp32: 5 tiles of 128 rows per token chunk; the simulator warns when SBUF overflows.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    inputs = _fused_inputs(640, 1024, 300)
    assert nki_kernel.fused_chunks(640, 1024, 300, 4) == (512, 5)
    _fused_loss_and_grads(*inputs, dict(), "nki")
    assert not [w for w in recwarn if "capacity" in str(w.message)]


HALF_FUSED_TOLERANCE = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


@pytest.mark.simulation
@pytest.mark.parametrize("dtype", list(HALF_FUSED_TOLERANCE))
def test_fused_nki_half_precision(dtype):
    # Half matmul inputs (dlogits rounded to the input dtype before the gradient matmuls) against the
    # float64 reference on the same half inputs: within a few of the half type's roundings.
    inputs = _fused_inputs(130, 72, 600, dtype)
    options = dict(label_smoothing=0.1, softcap=20.0)
    got = _fused_loss_and_grads(*inputs, options, "nki")
    assert all(t.dtype == dtype for t in got)
    rtol, atol = HALF_FUSED_TOLERANCE[dtype]
    _assert_fused_close(got, _fused_expected(*inputs, options), rtol=rtol, atol=atol)


@pytest.mark.simulation
def test_fused_nki_never_holds_the_logits():
    # tracemalloc sees the simulator's memories (NumPy arrays): the plain op's dlogits alone is N x V fp32,
    # the fused op's peak stays a small fraction of that: its HBM arrays are weight- and hidden-sized,
    # and the simulated SBUF (a few MB here) is most of it. Replay is off: a call it records keeps every
    # tile the kernel made (up to replay.MAX_BYTES), which is the simulator's cache, not the kernel's memory.
    rows, hidden_size, vocab = 1024, 16, 8000
    hidden, weight, bias, target = _fused_inputs(rows, hidden_size, vocab)
    logits_bytes = rows * vocab * 4

    def traced_peak(run):
        with configure(replay=False):
            run()  # traced and warmed once
            tracemalloc.start()
            run()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return peak

    plain = traced_peak(lambda: nki_ops.cross_entropy((hidden @ weight.T + bias).requires_grad_(), target,
                                                      backend="nki").backward())
    fused = traced_peak(lambda: _fused_loss_and_grads(hidden, weight, bias, target, dict(), "nki"))
    assert plain >= 2 * logits_bytes  # the logits' gradient, and the copy the backward scales
    assert fused < 0.25 * logits_bytes, (fused, logits_bytes)


@pytest.mark.simulation
def test_fused_backward_scales_the_saved_gradients_without_a_second_pass(monkeypatch):
    hidden, weight, bias, target = (t.requires_grad_() if t.is_floating_point() else t
                                    for t in _fused_inputs(130, 40, 300))
    loss = nki_ops.fused_linear_cross_entropy(hidden, weight, target, bias, backend="nki")
    calls = []
    for name in ("fused_linear_cross_entropy_kernel", "scale_rows_kernel"):
        original = getattr(nki_kernel, name)
        monkeypatch.setattr("nki_ops.ops.cross_entropy.nki_op." + name,
                            lambda *args, original=original, name=name: calls.append(name) or original(*args))
    loss.backward(torch.tensor(0.5))
    assert calls == ["scale_rows_kernel"] * 3
    expected = _fused_loss_and_grads(hidden.detach().double(), weight.detach().double(), bias.detach().double(),
                                     target, dict(), None, grad=0.5)
    _assert_fused_close([loss.detach(), hidden.grad, weight.grad, bias.grad], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.simulation
def test_fused_inputs_are_left_alone():
    inputs = _fused_inputs(130, 40, 300)
    saved = [t.clone() for t in inputs]
    hidden, weight, bias, target = inputs
    nki_ops.fused_linear_cross_entropy(hidden, weight, target, bias, label_smoothing=0.1, backend="nki")
    assert all(torch.equal(a, b) for a, b in zip(inputs, saved))


@pytest.mark.simulation
def test_fused_opcheck_of_the_library_op():
    hidden, weight, bias, _ = _fused_inputs(5, 8, 24)
    target = torch.tensor([[1.0], [-1.0], [0.0], [23.0], [5.0]])
    row_weight = torch.tensor([[0.25], [0.0], [0.25], [0.25], [0.25]])
    for b in (bias, None):
        args = (hidden.requires_grad_(), weight.requires_grad_(), b, target, row_weight, 0.1, 2.0)
        torch.library.opcheck(fused_linear_cross_entropy_forward_nki, args)


@pytest.mark.simulation
def test_fused_compiled_fullgraph_training_step_through_the_public_op():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    tokens, target = torch.randint(0, 300, (130,), generator=g), torch.randint(0, 300, (130,), generator=g)
    target[:7] = -100
    embedding = torch.nn.Embedding(300, 32)
    head = torch.nn.Linear(32, 300)
    parameters = [*embedding.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.5)

    def loss_of(backend):
        return nki_ops.fused_linear_cross_entropy(torch.tanh(embedding(tokens)), head.weight, target, head.bias,
                                                  label_smoothing=0.1, softcap=30.0, backend=backend)

    check_compiled_training(loss_of, parameters, optimizer, loss_atol=1e-6)


HIDDEN, WEIGHT, BIAS = torch.randn(4, 3), torch.randn(6, 3), torch.randn(6)


@pytest.mark.parametrize("args, options, message", [
    ((torch.randn(4), WEIGHT, TARGET), {}, r"hidden must be a 2-D tensor \[N, H\] with H >= 1, got shape \(4,\)"),
    ((torch.randn(4, 0), torch.randn(6, 0), TARGET), {}, r"H >= 1, got shape \(4, 0\)"),
    ((HIDDEN, torch.randn(6, 4), TARGET), {}, r"weight must be a 2-D tensor \[V, 3\] with V >= 1 classes \(H from "
                                               r"hidden\), got shape \(6, 4\)"),
    ((HIDDEN, torch.randn(0, 3), TARGET), {}, r"V >= 1 classes \(H from hidden\), got shape \(0, 3\)"),
    ((HIDDEN, WEIGHT, TARGET, torch.randn(5)), {}, r"bias must be None or a 1-D tensor \[6\] \(one per class\), "
                                                   r"got shape \(5,\)"),
    ((HIDDEN, WEIGHT.double(), TARGET), {}, r"hidden, weight must have the same dtype, got torch.float32, "
                                            r"torch.float64"),
    ((HIDDEN, WEIGHT, TARGET, BIAS.half()), {}, r"hidden, weight, bias must have the same dtype"),
    ((HIDDEN, WEIGHT.int(), TARGET), {}, r"weight must have a floating dtype"),
    ((HIDDEN, WEIGHT, TARGET[:2]), {}, r"one class index per row \(4\), got shape \(2,\)"),
    ((HIDDEN, WEIGHT, torch.tensor([0, 6, 1, 2])), {}, r"class indices in \[0, 6\) or ignore_index \(-100\)"),
    ((HIDDEN, WEIGHT, TARGET), dict(reduction="none"), r"reduction must be 'mean' or 'sum' for "
                                                       r"fused_linear_cross_entropy .*got 'none'"),
    ((HIDDEN, WEIGHT, TARGET), dict(label_smoothing=-0.5), r"label_smoothing must be a finite number in \[0, 1\]"),
    ((HIDDEN, WEIGHT, TARGET), dict(softcap=0), r"softcap must be None or a number > 0, got 0"),
    ((HIDDEN, WEIGHT.to("meta"), TARGET), {}, r"hidden and weight and target must be on the same device"),
])
@pytest.mark.parametrize("backend", ["torch", pytest.param("nki", marks=pytest.mark.simulation)])
def test_fused_bad_inputs_say_what_was_expected_and_what_came(args, options, message, backend):
    with pytest.raises(ValueError, match=message):
        nki_ops.fused_linear_cross_entropy(*args, **options, backend=backend)


@pytest.mark.simulation
def test_the_fused_kernel_checks_its_own_inputs():
    hidden, weight, column = torch.zeros(3, 8), torch.zeros(5, 8), torch.zeros(3, 1)
    with pytest.raises(AssertionError, match=r"hidden \[N, H\] and weight \[V, H\] must share H > 0.*got \(3, 8\) "
                                             r"and \(8, 5\)"):
        nki_kernel.fused_linear_cross_entropy_kernel(hidden, weight.T.contiguous(), None, column, column, 0.0, 0.0)
    with pytest.raises(AssertionError, match=r"both be float32, bfloat16 or float16, got float32 and bfloat16"):
        nki_kernel.fused_linear_cross_entropy_kernel(hidden, weight.bfloat16(), None, column, column, 0.0, 0.0)
    with pytest.raises(AssertionError, match=r"bias must be HBM \[1, 5\] float32 or None, got \(5,\) float32"):
        nki_kernel.fused_linear_cross_entropy_kernel(hidden, weight, torch.zeros(5), column, column, 0.0, 0.0)
    with pytest.raises(AssertionError, match=r"H = 20000 is too large"):
        nki_kernel.fused_linear_cross_entropy_kernel(torch.zeros(3, 20000), torch.zeros(5, 20000), None, column,
                                                     column, 0.0, 0.0)


# ------------------------------------------------------------------------ conformance strategies

# (rtol, atol) of the loss against the reference on the conformance suite's logits, up to 30 with -inf
# (masked classes) mixed in: fp32 sums over the classes and rows in another order, half types rounded once.
CONFORMANCE_TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5), torch.float16: (2.0 ** -9, 1e-4),
                   torch.bfloat16: (2.0 ** -6, 1e-3)}


def _options_strategy(draw, reductions):
    options = {"reduction": draw(st.sampled_from(reductions)),
               "label_smoothing": draw(st.sampled_from([0.0, 0.1, 1.0]) | st.sampled_from([-0.1, 1.5, math.nan])),
               "softcap": draw(st.sampled_from([None, 5.0]) | st.sampled_from([0.0, -1.0]))}
    if draw(st.booleans()):
        options["ignore_index"] = draw(st.sampled_from([0, 2, -1]))
    return options


def _targets(draw, rows, vocab, options):
    ignore_index = options.get("ignore_index", -100)
    classes = st.integers(0, max(vocab - 1, 0)) | st.just(ignore_index) if vocab else st.just(ignore_index)
    target = draw(st.lists(classes | st.sampled_from([vocab, -2]), min_size=rows, max_size=rows)) \
        if draw(st.floats(0, 1)) < 0.1 else draw(st.lists(classes, min_size=rows, max_size=rows))
    return torch.tensor(target, dtype=torch.int64)


@st.composite
def _cross_entropy_case(draw):
    """Random cross_entropy inputs, with options and targets the op must refuse."""
    from tests.ops.test_conformance import DTYPES, SIZES, Case, _values

    dtype = draw(st.sampled_from(DTYPES))
    rows, vocab = draw(SIZES), draw(st.sampled_from([1, 2, 7, 129, 600]))
    logits = _values(draw, (rows, vocab), st.floats(-30, 30, width=16), 0.0)
    if logits.numel() and draw(st.floats(0, 1)) < 0.2:  # masked classes
        logits[torch.from_numpy(draw(arrays(np.bool_, tuple(logits.shape))))] = -math.inf
    options = _options_strategy(draw, ["mean", "sum", "none"])
    rtol, atol = CONFORMANCE_TOL[dtype]
    return Case([logits.to(dtype), _targets(draw, rows, vocab, options)], options, atol=atol, rtol=rtol)


@st.composite
def _fused_case(draw):
    """Random fused_linear_cross_entropy inputs, with options, shapes and targets the op must refuse."""
    from tests.ops.test_conformance import DTYPES, SIZES, Case, _values

    dtype = draw(st.sampled_from(DTYPES))
    rows, hidden_size, vocab = draw(SIZES), draw(st.sampled_from([1, 3, 40, 129])), draw(st.sampled_from([1, 7, 600]))
    small = st.floats(-2, 2, width=16)
    hidden = _values(draw, (rows, hidden_size), small, 0.0)
    weight = _values(draw, (vocab, hidden_size), small, 0.0)
    tensors = [hidden.to(dtype), weight.to(dtype)]
    options = _options_strategy(draw, ["mean", "sum"] + (["none"] if draw(st.floats(0, 1)) < 0.05 else []))
    tensors.append(_targets(draw, rows, vocab, options))
    if draw(st.booleans()):
        tensors.append(_values(draw, (vocab,), small, 0.0).to(dtype))
    # Sums of H products and of V softmax terms, in another order: relative to the loss, which is >= 0.
    rtol, atol = CONFORMANCE_TOL[dtype]
    return Case(tensors, options, atol=atol * 10, rtol=rtol * 4)


conformance_cases = {"cross_entropy": _cross_entropy_case, "fused_linear_cross_entropy": _fused_case}
