"""``load`` and ``load_library`` with the signatures of ``torch_neuronx.xla_impl.custom_op``.

On a Neuron host (``torch_neuronx`` importable) both hand over to the real functions, which
compile the compute sources for the GpSimd cores; nothing here changes their behaviour.
Elsewhere they build and register the CPU emulation, so ``torch.ops.<namespace>.<op>``
(the namespace of ``NEURON_LIBRARY``, not ``name``) runs on CPU tensors, under the checks
described in ``nki_ops.cpp``. Typical use, identical on both::

    from nki_ops.cpp import custom_op
    custom_op.load(name="relu", compute_srcs=["relu.cpp"], shape_srcs=["shape.cpp"],
                   build_directory=os.getcwd(), multicore=True)   # writes librelu.so
    custom_op.load_library("librelu.so")                           # e.g. in another process
    torch.ops.my_ops.relu_forward(x)
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from . import _build, _emulation


# Cached: every op call asks (through the backend registry), and a failing import searches sys.path.
@functools.cache
def neuron_custom_op():
    """The real ``torch_neuronx.xla_impl.custom_op`` module, or None when this is not a Neuron host."""
    try:
        from torch_neuronx.xla_impl import custom_op
    except ImportError:
        return None
    return custom_op


def default_work_directory(name: str) -> Path:
    """Where intermediate files of ``load`` go when no ``build_directory`` is given."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "nki-ops" / "custom-ops" / name


def load(name, compute_srcs, shape_srcs, extra_cflags=None, extra_include_paths=None, build_directory=None,
         multicore=False, verbose=False):
    """Build the custom-op library ``name`` and register its ops.

    With ``build_directory``, also writes ``<build_directory>/lib<name>.so`` for ``load_library``.
    Raises ``BuildError`` (compiler errors with file:line, and the failing command) when a source does not build.
    """
    real = neuron_custom_op()
    if real is not None:
        return real.load(name=name, compute_srcs=compute_srcs, shape_srcs=shape_srcs,
                         extra_cflags=extra_cflags or [], extra_include_paths=extra_include_paths or [],
                         build_directory=build_directory, multicore=multicore, verbose=verbose)
    work = Path(build_directory) / f"{name}.emulation" if build_directory else default_work_directory(name)
    shape_library, compute_library, metadata = _build.build(
        name, compute_srcs, shape_srcs, extra_cflags=extra_cflags or [], extra_include_paths=extra_include_paths or [],
        work_dir=work, multicore=multicore, verbose=verbose)
    if build_directory:
        _build.pack(_build.archive_path(build_directory, name), shape_library, compute_library, metadata)
    _emulation.register(shape_library, compute_library, metadata)
    return None


def load_library(libname, verbose=False):
    """Register the ops of a library that ``load(..., build_directory=...)`` wrote (``lib<name>.so``)."""
    real = neuron_custom_op()
    if real is not None:
        return real.load_library(libname, verbose=verbose)
    folder, metadata = _build.unpack(Path(libname))
    if verbose:
        print(f"loading {metadata.name}: ops {[f'{o.namespace}::{o.op}' for o in metadata.ops]} from {folder}")
    _emulation.register(folder / metadata.shape_library, folder / metadata.compute_library, metadata)
    return None
