"""Stand-ins for SDK submodules that public kernels import by path: internal
``neuronxcc.nki.compiler.backends.neuron`` modules used for type annotations only (the nki-samples
reference helpers annotate with ``TileIndex`` and import ``local_tile``), which get the simulator's
own classes under those names, ``neuronxcc.nki.language.constants.sizeinbytes`` and the
``neuronxcc.nki.isa.constants`` enums. Anything else
in them raises ``UnsupportedError``."""

from __future__ import annotations

import types

from ... import core
from ...core import dtypes as dt
from . import isa

_BASE = "neuronxcc.nki.compiler.backends"


def _module(name: str, **names) -> types.ModuleType:
    module = types.ModuleType(name, "nki-ops simulator stand-in for an internal Neuron compiler module")
    module.__dict__.update(names)
    module.__getattr__ = core.errors.refuse_unknown(name)
    return module


_tensor = _module(f"{_BASE}.neuron.tensor", local_tile=core.Tensor)
_indexing = _module(f"{_BASE}.neuron.indexing", TileIndex=core.IndexExpr)
_neuron = _module(f"{_BASE}.neuron", tensor=_tensor, indexing=_indexing)


def sizeinbytes(dtype) -> int:
    """Bytes per element of ``dtype``."""
    return dt.as_dtype(dtype).itemsize


MODULES = {
    "neuronxcc.nki.language.constants": _module("neuronxcc.nki.language.constants", sizeinbytes=sizeinbytes),
    # The isa enums, also importable from here (AWS's dma_transpose example imports dge_mode so).
    "neuronxcc.nki.isa.constants": _module("neuronxcc.nki.isa.constants", **{
        name: getattr(isa, name) for name in ("engine", "reduce_cmd", "nc_version", "oob_mode", "dge_mode")}),
    _BASE: _module(_BASE, neuron=_neuron),
    f"{_BASE}.neuron": _neuron,
    f"{_BASE}.neuron.tensor": _tensor,
    f"{_BASE}.neuron.indexing": _indexing,
}
