"""Generalized IoU and GIoU loss of paired xyxy boxes: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import register, resolve
from ..._checks import check_box_pair, check_reduction
from ...cpp import backend as cpp_backend
from .._common import reduce_loss
from .._nki_backend import register_nki
from .cpp import giou_cpp, giou_loss_cpp
from .nki import giou_loss_nki, giou_nki
from .reference import GIOU_EPS, giou_loss_reference, giou_reference

__all__ = ["GIOU_EPS", "giou", "giou_loss"]


def giou(boxes1: torch.Tensor, boxes2: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """Generalized IoU of ``boxes1[..., 4]`` and ``boxes2[..., 4]`` (xyxy), elementwise -> ``[...]``.

    Zero-area and identical boxes give finite values (see ``reference.GIOU_EPS``).
    """
    check_box_pair(boxes1, boxes2)
    return resolve("giou", backend, boxes1.device, (boxes1, boxes2))(boxes1, boxes2)


def giou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, reduction: str = "none", *,
              backend: str = "auto") -> torch.Tensor:
    """``1 - giou(boxes1, boxes2)``, differentiable in both arguments.

    ``reduction``: ``"none"`` (shape ``[...]``), ``"mean"`` (0 for an empty batch) or ``"sum"``.
    """
    check_box_pair(boxes1, boxes2)
    check_reduction(reduction)
    loss = resolve("giou_loss", backend, boxes1.device, (boxes1, boxes2))(boxes1, boxes2)
    return reduce_loss(loss, reduction)


register("giou", "torch", giou_reference)
register("giou_loss", "torch", giou_loss_reference)
for _op, _fn in (("giou", giou_cpp), ("giou_loss", giou_loss_cpp)):
    register(_op, "cpp", _fn, cpp_backend.unavailable_reason("giou"), cpp_backend.label,
             input_reason=lambda boxes1, boxes2: cpp_backend.input_reason("GIoU", boxes1))
register_nki("giou", giou_nki)
register_nki("giou_loss", giou_loss_nki)
