"""nki-ops: custom operators for AWS Trainium/Inferentia (NKI kernels and GpSimd C++ operators),
with a CPU simulator for NKI, a CPU build of the C++ operators, and a compiler/loader tuner.

The ops (``nki_ops.giou``, ``nki_ops.attention``, ...) are found, not listed: every package under
``nki_ops/ops/`` is imported and the names in its ``__all__`` become attributes of ``nki_ops``.
"""

from ._backends import BackendUnavailableError, availability
from .ops import op_packages

__version__ = "0.1.0"

__all__ = ["availability", "BackendUnavailableError", "__version__"]
for _package in op_packages():
    globals().update({name: getattr(_package, name) for name in _package.__all__})
    __all__ += _package.__all__
del _package
