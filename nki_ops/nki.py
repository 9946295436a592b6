"""The one place the project's NKI kernels get ``nki``, ``nl`` and ``nisa`` from.

    from nki_ops.nki import nki, nl, nisa

gives the Neuron SDK's ``neuronxcc.nki`` when it is importable and the nki-ops simulator
otherwise. ``NKI_OPS_BACKEND=sim`` forces the simulator even where the SDK is installed.
``SIMULATED`` tells which one was chosen.
"""

from __future__ import annotations

import os


def _load():
    if os.environ.get("NKI_OPS_BACKEND", "").lower() != "sim":
        try:
            import neuronxcc.nki as sdk_nki
            import neuronxcc.nki.isa as sdk_isa
            import neuronxcc.nki.language as sdk_language
            import neuronxcc.nki.typing as sdk_typing
            return sdk_nki, sdk_language, sdk_isa, sdk_typing, sdk_nki.__name__.startswith("nki_ops.")
        except ImportError:
            pass
    from nki_ops.sim import nki as sim_nki, nisa as sim_isa, nl as sim_language, nt as sim_typing
    return sim_nki, sim_language, sim_isa, sim_typing, True


nki, nl, nisa, nt, SIMULATED = _load()

__all__ = ["nki", "nl", "nisa", "nt", "SIMULATED"]
