"""``nki.compiler``: compiler hints. Scheduling and allocation hints do not change what a kernel
computes, so the simulator runs the kernel as written; anything else is unsupported."""

from __future__ import annotations

import contextlib

from ...core.errors import refuse_unknown


@contextlib.contextmanager
def skip_middle_end_transformations():
    yield


__getattr__ = refuse_unknown("nki.compiler")
