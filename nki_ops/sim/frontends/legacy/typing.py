"""``neuronxcc.nki.typing`` (``nt``): annotations only; the simulator does not check them."""

from ...core.annotations import mutable_tensor, tensor
from ...core.annotations import unsupported as __getattr__  # noqa: F401 (the module's attribute hook)

__all__ = ["mutable_tensor", "tensor"]
