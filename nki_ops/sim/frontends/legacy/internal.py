"""Stand-ins for SDK submodules that public kernels import by path: internal
``neuronxcc.nki.compiler.backends.neuron`` modules used for type annotations only (the nki-samples
reference helpers annotate with ``TileIndex`` and import ``local_tile``), which get the simulator's
own classes under those names, and ``neuronxcc.nki.language.constants.sizeinbytes``. Anything else
in them raises ``UnsupportedError``."""

from __future__ import annotations

import types

from ... import core
from ...core import dtypes as dt

_BASE = "neuronxcc.nki.compiler.backends"


def _module(name: str, **names) -> types.ModuleType:
    module = types.ModuleType(name, "nki-ops simulator stand-in for an internal Neuron compiler module")
    module.__dict__.update(names)

    def missing(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise core.UnsupportedError(f"{name}.{attr}")

    module.__getattr__ = missing
    return module


_tensor = _module(f"{_BASE}.neuron.tensor", local_tile=core.Tensor)
_indexing = _module(f"{_BASE}.neuron.indexing", TileIndex=core.IndexExpr)
_neuron = _module(f"{_BASE}.neuron", tensor=_tensor, indexing=_indexing)


def sizeinbytes(dtype) -> int:
    """Bytes per element of ``dtype``."""
    return dt.as_dtype(dtype).itemsize


MODULES = {
    "neuronxcc.nki.language.constants": _module("neuronxcc.nki.language.constants", sizeinbytes=sizeinbytes),
    _BASE: _module(_BASE, neuron=_neuron),
    f"{_BASE}.neuron": _neuron,
    f"{_BASE}.neuron.tensor": _tensor,
    f"{_BASE}.neuron.indexing": _indexing,
}
