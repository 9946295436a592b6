"""nki-ops: custom operators for AWS Trainium/Inferentia (NKI kernels and GpSimd C++ operators),
with a CPU simulator for NKI, a CPU build of the C++ operators, and a compiler/loader tuner."""

from ._backends import BackendUnavailableError, availability
from .ops.attention import attention
from .ops.box_iou import box_iou
from .ops.giou import giou, giou_loss
from .ops.nms import batched_nms, nms
from .ops.rms_norm import rms_norm

__version__ = "0.1.0"

__all__ = ["attention", "giou", "giou_loss", "box_iou", "nms", "batched_nms", "rms_norm",
           "availability", "BackendUnavailableError", "__version__"]
