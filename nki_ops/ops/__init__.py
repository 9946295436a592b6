"""One subpackage per op: ``reference.py`` (pure torch), the NKI kernel, the C++ binding, and
``__init__.py`` with the public function that validates input and dispatches through the registry.

Every folder here whose name does not start with ``_`` is an op package; ``nki_ops`` imports them
all (``op_packages``) and makes public what each lists in ``__all__``, so a new op needs no line
outside its folder to become ``nki_ops.<op>``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def op_packages() -> list[ModuleType]:
    """The op packages, imported (which runs their ``define_op``), in name order."""
    return [importlib.import_module(f"{__name__}.{info.name}") for info in sorted(pkgutil.iter_modules(__path__),
                                                                                  key=lambda info: info.name)
            if info.ispkg and not info.name.startswith("_")]
