"""Kernel argument annotations (``nt.tensor[shape, dtype]``, ``nt.mutable_tensor``), the same in both API
generations: annotations only, the simulator does not check them."""

from __future__ import annotations

from .errors import refuse_unknown


class _Annotation:
    def __class_getitem__(cls, item):
        return cls


class tensor(_Annotation):
    """``nt.tensor[shape, dtype]`` kernel argument annotation."""


class mutable_tensor(_Annotation):
    """``nt.mutable_tensor`` marks a kernel input the kernel may write."""


unsupported = refuse_unknown("nki.typing")  # a typing module's ``__getattr__``
