"""Generalized IoU and GIoU loss of paired xyxy boxes: public API and backend registration."""

from __future__ import annotations

import torch

from ..._backends import resolve
from ..._checks import check_box_pair, check_reduction
from ...cpp import backend as cpp_backend
from ...workloads import giou_workload
from .._common import reduce_loss
from .._define import define_op
from .cpp_op import giou_cpp, giou_loss_cpp
from .nki_op import giou_loss_nki, giou_nki
from .reference import GIOU_EPS, giou_loss_reference, giou_reference

__all__ = ["GIOU_EPS", "giou", "giou_loss"]


def _demo_inputs():
    return giou_workload(3, 100)


def _cpp_input_reason(boxes1, boxes2):
    return cpp_backend.input_reason("GIoU", boxes1)


@define_op("giou", torch=giou_reference, nki=giou_nki, cpp=giou_cpp, cpp_input_reason=_cpp_input_reason,
           demo=_demo_inputs, differentiable=True, benchmark="giou")
def giou(boxes1: torch.Tensor, boxes2: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """Generalized IoU of ``boxes1[..., 4]`` and ``boxes2[..., 4]`` (xyxy), elementwise -> ``[...]``.

    Zero-area and identical boxes give finite values (see ``reference.GIOU_EPS``).
    """
    check_box_pair(boxes1, boxes2)
    return resolve("giou", backend, boxes1.device, (boxes1, boxes2))(boxes1, boxes2)


@define_op("giou_loss", torch=giou_loss_reference, nki=giou_loss_nki, cpp=giou_loss_cpp, cpp_operator="giou",
           cpp_input_reason=_cpp_input_reason, demo=_demo_inputs, differentiable=True)
def giou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, reduction: str = "none", *,
              backend: str = "auto") -> torch.Tensor:
    """``1 - giou(boxes1, boxes2)``, differentiable in both arguments.

    ``reduction``: ``"none"`` (shape ``[...]``), ``"mean"`` (0 for an empty batch) or ``"sum"``.
    """
    check_box_pair(boxes1, boxes2)
    check_reduction(reduction)
    loss = resolve("giou_loss", backend, boxes1.device, (boxes1, boxes2))(boxes1, boxes2)
    return reduce_loss(loss, reduction)
