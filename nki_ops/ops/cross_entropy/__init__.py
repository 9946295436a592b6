"""Cross-entropy over a vocabulary, and fused linear cross-entropy (the loss of ``hidden @ weight.T + bias``
without the logits): public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_number, check_reduction, check_same_device, check_tensor
from .._define import define_op
from .nki_op import cross_entropy_nki, fused_linear_cross_entropy_nki
from .reference import cross_entropy_reference
from .torch_op import fused_linear_cross_entropy_torch

__all__ = ["cross_entropy", "fused_linear_cross_entropy"]


def _demo_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(130, 700, generator=g), torch.randint(0, 700, (130,), generator=g)


@define_op("cross_entropy", torch=cross_entropy_reference, nki=cross_entropy_nki, demo=_demo_inputs,
           differentiable=True, benchmark="cross_entropy")
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, softcap: float | None = None, *,
                  backend: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.cross_entropy(logits, target, ...)`` for ``logits[N, V]`` and class indices
    ``target[N]``, after ``softcap * tanh(logits / softcap)`` when ``softcap`` is given.

    Rows whose target is ``ignore_index`` give 0 and do not count in the mean; ``label_smoothing`` s
    mixes the one-hot target with ``s / V`` on every class. The loss is in the logits' dtype;
    differentiable in the logits, whose gradient the nki backend computes in the forward pass.
    """
    check_tensor("logits", logits)
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits must be a 2-D tensor [N, V] with V >= 1 classes, got shape {tuple(logits.shape)}")
    _check_target(target, logits.shape[0], logits.shape[1], ignore_index, logits=logits)
    _check_options(ignore_index, reduction, label_smoothing, softcap)
    impl = resolve("cross_entropy", backend, logits.device, (logits,))
    return impl(logits, target, ignore_index, reduction, float(label_smoothing),
                None if softcap is None else float(softcap))


def _fused_demo_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(130, 48, generator=g), 0.2 * torch.randn(700, 48, generator=g),
            torch.randint(0, 700, (130,), generator=g), 0.1 * torch.randn(700, generator=g))


@define_op("fused_linear_cross_entropy", torch=fused_linear_cross_entropy_torch, nki=fused_linear_cross_entropy_nki,
           demo=_fused_demo_inputs, differentiable=True, benchmark="cross_entropy")
def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
                               label_smoothing: float = 0.0, softcap: float | None = None, *,
                               backend: str = "auto") -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` for ``hidden[N, H]``, ``weight[V, H]`` and
    ``bias[V]`` (or None), without the ``[N, V]`` logits: both backends compute the gradients of hidden,
    weight and bias in the forward pass, the nki backend a vocabulary chunk of a token chunk's logits at
    a time, the torch backend a token chunk's logits no larger than hidden at a time. ``reduction`` is
    ``"mean"`` or ``"sum"`` (the weight's gradient sums over the rows, so per-row losses would need a
    second pass); the rest as ``cross_entropy``. The loss is in hidden's dtype.
    """
    check_tensor("hidden", hidden)
    check_tensor("weight", weight)
    if hidden.dim() != 2 or hidden.shape[1] == 0:
        raise ValueError(f"hidden must be a 2-D tensor [N, H] with H >= 1, got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1] or weight.shape[0] == 0:
        raise ValueError(f"weight must be a 2-D tensor [V, {hidden.shape[1]}] with V >= 1 classes (H from hidden), "
                         f"got shape {tuple(weight.shape)}")
    tensors = {"hidden": hidden, "weight": weight}
    if bias is not None:
        check_tensor("bias", bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must be None or a 1-D tensor [{weight.shape[0]}] (one per class), got shape "
                             f"{tuple(bias.shape)}")
        tensors["bias"] = bias
    if len({t.dtype for t in tensors.values()}) > 1:
        raise ValueError(f"{', '.join(tensors)} must have the same dtype, got "
                         f"{', '.join(str(t.dtype) for t in tensors.values())}")
    _check_target(target, hidden.shape[0], weight.shape[0], ignore_index, **tensors)
    _check_options(ignore_index, reduction, label_smoothing, softcap)
    if reduction == "none":
        raise ValueError("reduction must be 'mean' or 'sum' for fused_linear_cross_entropy (its weight gradient "
                         "sums over the rows in the forward pass), got 'none'")
    impl = resolve("fused_linear_cross_entropy", backend, hidden.device, tuple(tensors.values()))
    return impl(hidden, weight, target, bias, ignore_index, reduction, float(label_smoothing),
                None if softcap is None else float(softcap))


def _check_target(target, rows: int, vocab: int, ignore_index, **inputs) -> None:
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise ValueError(f"target must be an integer tensor of class indices, got "
                         f"{getattr(target, 'dtype', type(target).__name__)}")
    if target.dim() != 1 or target.shape[0] != rows:
        raise ValueError(f"target must be a 1-D tensor with one class index per row ({rows}), got shape "
                         f"{tuple(target.shape)}")
    check_same_device(**inputs, target=target)
    # The values are data: checked in eager mode; a compiled graph does not stop to read them.
    if not torch.compiler.is_compiling() and target.numel() and isinstance(ignore_index, int):
        counted = target[target != ignore_index]
        if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= vocab):
            raise ValueError(f"target must hold class indices in [0, {vocab}) or ignore_index ({ignore_index}), "
                             f"got values from {int(counted.min())} to {int(counted.max())}")


def _check_options(ignore_index, reduction, label_smoothing, softcap) -> None:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"ignore_index must be an int, got {ignore_index!r}")
    check_reduction(reduction)
    check_number("label_smoothing", label_smoothing, low=0.0, high=1.0)
    if softcap is not None:
        check_number("softcap", softcap, low=0.0)
        if softcap == 0:
            raise ValueError("softcap must be None or a number > 0, got 0")
