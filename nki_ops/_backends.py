"""The backend registry: which implementations of each op exist and which can run.

Every public op takes ``backend="auto"|"torch"|"nki"|"cpp"``. Op modules register
their implementations here at import time; ``resolve`` picks one.

* An explicitly requested backend that cannot run raises ``BackendUnavailableError``
  naming the backend, the reason, and what is available. Nothing falls back silently.
* ``"auto"`` picks the NKI kernel when the tensors live on a Neuron (XLA) device,
  and otherwise the first available of ``AUTO_ORDER_CPU`` (compiled C++ before the
  torch reference; the simulated NKI kernel is never chosen automatically because
  simulator time is not device time).
* ``NKI_OPS_DEFAULT_BACKEND`` overrides what ``"auto"`` means, for whole test runs.
* An implementation may accept only some inputs (the C++ operators take no float64, for
  instance): its ``input_reason(*inputs)`` says why it cannot take these ones, seeing each
  tensor as a ``TensorSpec`` (dtype and device). Given the inputs, ``resolve`` lets ``"auto"``
  pass over it and raises for an explicit request.
* The choice is host logic (environment, files on disk, installed packages) that
  ``torch.compile`` must not trace: ``choose_backend`` runs once at trace time and the compiled
  graph keeps its answer, so public ops compile with ``fullgraph=True``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

BACKENDS = ("torch", "nki", "cpp")
AUTO_ORDER_CPU = ("cpp", "torch")
AUTO_ORDER_NEURON = ("nki", "torch")


class TensorSpec(NamedTuple):
    """What an ``input_reason`` sees of a tensor: enough to decide, and a constant under torch.compile."""
    dtype: torch.dtype
    device: torch.device


class BackendUnavailableError(RuntimeError):
    """A backend was requested explicitly and cannot run here."""


@dataclass(frozen=True)
class Implementation:
    op: str
    backend: str
    fn: Callable
    # Returns None when the implementation can run, else the reason it cannot.
    unavailable_reason: Callable[[], str | None]
    # How benchmarks and the demo name this implementation here, e.g. "nki (simulated on CPU)".
    label: Callable[[], str]
    # Returns None when the implementation takes these inputs, else the reason it does not.
    input_reason: Callable[..., str | None] = lambda *inputs: None


_REGISTRY: dict[str, dict[str, Implementation]] = {}


def register(op: str, backend: str, fn: Callable,
             unavailable_reason: Callable[[], str | None] = lambda: None,
             label: Callable[[], str] | None = None,
             input_reason: Callable[..., str | None] | None = None) -> None:
    """Register ``fn`` as ``op``'s ``backend`` implementation.

    ``unavailable_reason()`` returns None when it can run here, else a sentence saying why not.
    ``label()`` names it in benchmark and demo output; say there when it runs simulated or emulated.
    ``input_reason(*inputs)`` returns None when ``fn`` takes these inputs, else why not.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} for op {op!r}; expected one of {BACKENDS}")
    _REGISTRY.setdefault(op, {})[backend] = Implementation(
        op, backend, fn, unavailable_reason, label or (lambda: backend),
        input_reason or (lambda *inputs: None))


def label(op: str, backend: str) -> str:
    return _REGISTRY[op][backend].label()


def availability(op: str) -> dict[str, str | None]:
    """Map each backend to None (available) or the reason it is not, for ``op``."""
    return {b: _unavailable_reason(op, b) for b in BACKENDS}


def _unavailable_reason(op: str, backend: str) -> str | None:
    impls = _REGISTRY.get(op)
    if impls is None:
        raise KeyError(f"no op named {op!r}; registered ops: {sorted(_REGISTRY)}")
    impl = impls.get(backend)
    return f"{op} has no {backend} implementation" if impl is None else impl.unavailable_reason()


def is_neuron_device(device: torch.device) -> bool:
    """Neuron tensors live on torch-xla's device; plain CPU/CUDA tensors do not."""
    return device.type in ("xla", "neuron")


def resolve(op: str, backend: str, device: torch.device | None = None, inputs: tuple | None = None) -> Callable:
    """Return the implementation of ``op`` to call for ``backend`` (and for ``inputs``, when given)."""
    specs = None if inputs is None else tuple(
        TensorSpec(x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in inputs)
    return _REGISTRY[op][choose_backend(op, backend, device, specs)].fn


def choose_backend(op: str, backend: str, device: torch.device | None = None,
                   inputs: tuple | None = None) -> str:
    """The backend ``resolve`` uses: ``backend`` itself when it can run these inputs, else an error;
    for ``"auto"``, the first in the device's order that can."""
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be one of {('auto', *BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get("NKI_OPS_DEFAULT_BACKEND", "auto")
    # Only the backends tried are asked whether they can run (the C++ one looks for its build on disk).
    if backend == "auto":
        order = AUTO_ORDER_NEURON if device is not None and is_neuron_device(device) else AUTO_ORDER_CPU
        for candidate in order:
            if _unavailable_reason(op, candidate) is None and _input_reason(op, candidate, inputs) is None:
                return candidate
        raise BackendUnavailableError(f"{op}: no backend available: {_describe(availability(op))}")
    why_not = _unavailable_reason(op, backend)
    if why_not is not None:
        status = availability(op)
        raise BackendUnavailableError(
            f"{op}: backend {backend!r} is unavailable: {why_not}. "
            f"Available: {[b for b, why in status.items() if why is None] or 'none'}")
    why_not = _input_reason(op, backend, inputs)
    if why_not is not None:
        raise BackendUnavailableError(f"{op}: backend {backend!r} does not take these inputs: {why_not}")
    return backend


# torch.compiler.assume_constant_result(choose_backend), without its import of torch._dynamo,
# which would add ~2.5 s to every `import nki_ops` (each CLI call, each tuning trial): this marker
# is all that decorator sets. tests/test_training.py compiles through it with fullgraph=True.
choose_backend._dynamo_marked_constant = True


def _input_reason(op: str, backend: str, inputs: tuple | None) -> str | None:
    return None if inputs is None else _REGISTRY[op][backend].input_reason(*inputs)


def _describe(status: dict[str, str | None]) -> str:
    return "; ".join(f"{b}: {why or 'available'}" for b, why in status.items())
