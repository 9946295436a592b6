"""``nki_cpu_simulator``: the entry point AWS's public NKI kernel library tests with
(``nki.cpu_simulate(kernel)[lnc](**inputs)``), as an alias of the nki-ops simulator's current-API
front end. Every module (``nki_cpu_simulator.nki``, ``.nki.language``, ``.nki.isa``,
``.nki.isa.constants``, ``.nki.typing``, ``.nki.compiler``, ``.nki.language.dtypes``, ``.nki.tensor``,
``.nki.builtin``) is registered on import, and ``neuron_dtypes`` too when the SDK's is absent.
"""

from __future__ import annotations

import importlib.util
import sys

from nki_ops.sim import neuron_dtypes as _neuron_dtypes
from nki_ops.sim.frontends import current as nki

for _name, _module in {"nki": nki, **nki.MODULES}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
if "neuron_dtypes" not in sys.modules and importlib.util.find_spec("neuron_dtypes") is None:
    sys.modules["neuron_dtypes"] = _neuron_dtypes

__all__ = ["nki"]
