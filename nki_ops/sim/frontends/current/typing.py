"""``nki.typing`` (``nt``): annotations only; the simulator does not check them."""

from __future__ import annotations

from ...core.errors import UnsupportedError


class _Annotation:
    def __class_getitem__(cls, item):
        return cls


class tensor(_Annotation):
    """``nt.tensor[shape, dtype]`` kernel argument annotation."""


class mutable_tensor(_Annotation):
    """``nt.mutable_tensor`` marks a kernel input the kernel may write."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.typing.{name}")
