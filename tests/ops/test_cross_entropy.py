"""nki_ops.cross_entropy on every backend against the float64 reference (itself checked against
torch.nn.functional.cross_entropy): every reduction with ignore_index, label smoothing and softcap,
odd sizes, three dtypes, -inf logits; gradients; torch.compile training; bad inputs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import nki_ops
from nki_ops.ops.cross_entropy import nki_kernel
from nki_ops.ops.cross_entropy.nki_op import cross_entropy_forward_nki, scale_rows_nki
from nki_ops.ops.cross_entropy.reference import cross_entropy_reference

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

    compiled = torch.compile(lambda: loss_of("nki"), fullgraph=True)
    loss = compiled()
    grads = torch.autograd.grad(loss, list(head.parameters()))
    expected_loss = loss_of("torch")
    expected_grads = torch.autograd.grad(expected_loss, list(head.parameters()))
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, expected_grads):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)

    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = compiled()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


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


conformance_cases = {"cross_entropy": _cross_entropy_case}
