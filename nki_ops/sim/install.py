"""Make ``import neuronxcc.nki`` (and ``.language``, ``.isa``, ``.typing``) and ``import nki`` (with every
``nki.*`` module of the current API) resolve to the simulator when the real packages are absent."""

from __future__ import annotations

import importlib.util
import sys
import types

from . import neuron_dtypes
from .frontends import current as sim_current
from .frontends import legacy as sim_nki
from .frontends.legacy import internal as sim_internal

_MODULES = {
    "neuronxcc.nki": sim_nki,
    "neuronxcc.nki.language": sim_nki.language,
    "neuronxcc.nki.isa": sim_nki.isa,
    "neuronxcc.nki.typing": sim_nki.typing,
    "neuronxcc.nki.compiler": sim_nki.compiler,
    **sim_internal.MODULES,
}

# Installs not yet uninstalled, oldest first: each saved the modules it replaced.
_INSTALLED: list["install"] = []


def sdk_available() -> bool:
    """True when the real ``neuronxcc.nki`` imports (the PyPI placeholder raises ImportError)."""
    if "neuronxcc" in sys.modules and getattr(sys.modules["neuronxcc"], "__nki_ops_simulator__", False):
        return False
    try:
        if importlib.util.find_spec("neuronxcc") is None:
            return False
        import neuronxcc.nki  # noqa: F401
        return True
    except Exception:
        return False


def current_sdk_available() -> bool:
    """True when the real standalone ``nki`` package imports."""
    module = sys.modules.get("nki")
    if module is not None:
        return not getattr(module, "__nki_ops_simulator__", False)
    try:
        if importlib.util.find_spec("nki") is None:
            return False
        import nki  # noqa: F401
        return not getattr(nki, "__nki_ops_simulator__", False)
    except Exception:
        return False


class install:
    """Route ``neuronxcc.nki`` imports to the simulator unless the real SDK is importable.

    Use as a context manager (``with install(): ...``), which restores ``sys.modules`` on exit,
    or as a plain call ``install()`` that leaves the simulator installed. ``force=True`` installs
    it even when the SDK is present. ``active`` says whether the simulator was installed for
    ``neuronxcc.nki``, ``current_active`` whether for ``nki``.
    """

    def __init__(self, force: bool = False):
        self._saved: dict[str, types.ModuleType | None] = {}
        _INSTALLED.append(self)
        self.current_active = force or not current_sdk_available()
        if self.current_active:
            for name, module in {"nki": sim_current, **sim_current.MODULES}.items():
                self._saved[name] = sys.modules.get(name)
                sys.modules[name] = module
        if "neuron_dtypes" not in sys.modules and importlib.util.find_spec("neuron_dtypes") is None:
            # The SDK's host dtype package (static_cast, packed MX types) that kernel tests import.
            self._saved["neuron_dtypes"] = None
            sys.modules["neuron_dtypes"] = neuron_dtypes
        self.active = force or not sdk_available()
        if not self.active:
            return
        package = types.ModuleType("neuronxcc", "nki-ops simulator stand-in for the Neuron compiler package")
        package.__path__ = []
        package.__nki_ops_simulator__ = True
        package.nki = sim_nki
        for name, module in {"neuronxcc": package, **_MODULES}.items():
            self._saved[name] = sys.modules.get(name)
            sys.modules[name] = module

    def uninstall(self) -> None:
        """Restore what this install replaced. Uninstalled out of order, what it saved passes to the
        later install that replaced the same module, so the last one out restores the originals."""
        if self not in _INSTALLED:
            return
        at = _INSTALLED.index(self)
        del _INSTALLED[at]
        later = _INSTALLED[at:]
        for name, module in self._saved.items():
            heir = next((other for other in later if name in other._saved), None)
            if heir is not None:
                heir._saved[name] = module
            elif module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        self._saved.clear()

    def __enter__(self) -> "install":
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()
