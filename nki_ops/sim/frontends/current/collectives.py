"""``nki.collectives``: collective communication between NeuronCores is not modelled."""

from __future__ import annotations

from ...core.errors import UnsupportedError


class ReplicaGroup:
    """A group of ranks (accepted so kernels import; collectives themselves are unsupported)."""

    def __init__(self, *groups):
        self.groups = groups


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise UnsupportedError(f"nki.collectives.{name}", "collectives between NeuronCores are not modelled")
