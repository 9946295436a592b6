"""RMSNorm's tiling parameter, tuned per target on the cost model (``nki_ops.ops._tuned``).

The one tiling choice of both kernels is ``chunk``, the columns each engine instruction takes along D
(at most one 512-column PSUM bank of the weight broadcast; the backward also needs whole 128-column dw
blocks). The studies cost each value at the benchmark's workload, 4,096 x 1,024 fp32 (forward and
backward separately), checking its values at 130 x 1,000 against the float64 reference; every target's
choice is the kernels' default, 512: narrower chunks only add instructions and their fixed costs.
Rerun with ``python -m nki_ops.ops.retune rms_norm``.
"""

from __future__ import annotations

import torch

from .._tuned import Tuned
from .nki_kernel import CHUNK, rms_norm_backward_kernel, rms_norm_kernel
from .reference import rms_norm_reference

EPS = 1e-6
WORKLOAD = (4096, 1024)  # benchmarks/rms_norm.py's
CHECK_SHAPE = (130, 1000)  # odd: a tail row tile and a tail chunk for every value searched
SPACE = {"chunk": [CHUNK, 384, 256, 128]}
STUDY = ("tune_kernel grid over chunk, {kernel} at 4096 x 1024 fp32, checked at 130 x 1000; "
         "studies rms_norm-{kernel}-trn1/-trn2/-trn3 (python -m nki_ops.ops.retune rms_norm)")

TUNED = {
    "forward": Tuned("rms_norm_kernel", {"chunk": CHUNK}, SPACE,
                     {"trn1": {"chunk": 512}, "trn2": {"chunk": 512}, "trn3": {"chunk": 512}},
                     STUDY.format(kernel="forward")),
    "backward": Tuned("rms_norm_backward_kernel", {"chunk": CHUNK}, SPACE,
                      {"trn1": {"chunk": 512}, "trn2": {"chunk": 512}, "trn3": {"chunk": 512}},
                      STUDY.format(kernel="backward")),
}


def _inputs(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x, (1 + 0.1 * torch.randn(1, shape[1], generator=g)), torch.randn(shape, generator=g)


def build_forward(chunk):
    x, weight, _ = _inputs(WORKLOAD)
    return rms_norm_kernel, (x, weight, EPS, chunk)


def check_forward(chunk):
    x, weight, _ = _inputs(CHECK_SHAPE, seed=1)
    expected = rms_norm_reference(x.double(), weight[0].double(), EPS).float()
    torch.testing.assert_close(rms_norm_kernel(x, weight, EPS, chunk), expected, rtol=1e-5, atol=1e-6)


def build_backward(chunk):
    x, weight, grad = _inputs(WORKLOAD)
    return rms_norm_backward_kernel, (grad, x, weight, EPS, chunk)


def check_backward(chunk):
    x, weight, grad = _inputs(CHECK_SHAPE, seed=1)
    x64 = x.double().requires_grad_()
    w64 = weight[0].double().requires_grad_()
    rms_norm_reference(x64, w64, EPS).backward(grad.double())
    dx, dw = rms_norm_backward_kernel(grad, x, weight, EPS, chunk)
    torch.testing.assert_close(dx, x64.grad.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw.reshape(-1), w64.grad.float(), rtol=1e-4, atol=1e-4)


BUILD = {"forward": (build_forward, check_forward), "backward": (build_backward, check_backward)}
