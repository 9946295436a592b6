"""The one place the project's NKI kernels get ``nki``, ``nl`` and ``nisa`` from: the current API.

    from nki_ops.nki_api import nki, nl, nisa

gives the Neuron SDK's standalone ``nki`` package (SDK >= 2.27, NKI 0.6) when it is importable and
the nki-ops simulator's current-API front end otherwise. ``NKI_OPS_BACKEND=sim`` forces the
simulator even where the SDK is installed. ``SIMULATED`` tells which one was chosen.

A host with only the legacy ``neuronxcc.nki`` (SDK < 2.27) cannot run these kernels on its
NeuronCores, and the simulator is not chosen silently in its place: ``UNAVAILABLE`` then says
which SDK is needed (the kernels still import, on the simulator's modules), and the ``nki``
backend reports it. It is None when the kernels can run.
"""

from __future__ import annotations

import importlib.util
import os


def _real_nki():
    """The SDK's ``nki``, ``nki.language``, ``nki.isa``, or None when it is absent (or is the simulator)."""
    if importlib.util.find_spec("nki") is None:
        return None
    try:
        import nki as sdk_nki
        import nki.isa as sdk_isa
        import nki.language as sdk_language
    except ImportError:
        return None
    if getattr(sdk_nki, "__nki_ops_simulator__", False) or sdk_nki.__name__.startswith("nki_ops."):
        return None
    return sdk_nki, sdk_language, sdk_isa


def _legacy_sdk_only() -> bool:
    from nki_ops.sim.install import sdk_available
    return sdk_available()


def _load():
    unavailable = None
    if os.environ.get("NKI_OPS_BACKEND", "").lower() != "sim":
        real = _real_nki()
        if real is not None:
            return (*real, False, None)
        if _legacy_sdk_only():
            unavailable = ("the kernels are written for the standalone `nki` package of Neuron SDK >= 2.27 "
                           "(NKI 0.6); this host has only the legacy `neuronxcc.nki`. Install a current Neuron "
                           "SDK, or set NKI_OPS_BACKEND=sim to run them in the simulator on the CPU")
    from nki_ops.sim.frontends import current as sim_nki
    return sim_nki, sim_nki.language, sim_nki.isa, True, unavailable


nki, nl, nisa, SIMULATED, UNAVAILABLE = _load()

__all__ = ["nki", "nl", "nisa", "SIMULATED", "UNAVAILABLE"]
