"""``nki.builtin``: the names the NKI compiler front end provides to kernels as builtins."""

from __future__ import annotations

from ...core.errors import UnsupportedError


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.builtin.{name}")
