"""``nki.builtin``: the names the NKI compiler front end provides to kernels as builtins."""

from __future__ import annotations

from ...core.errors import refuse_unknown

__getattr__ = refuse_unknown("nki.builtin")
