"""The simulator's documentation lists exactly what it implements."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

from nki_ops.sim import nisa, nl
from nki_ops.sim.core.memory import TileSize

pytestmark = pytest.mark.simulation

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def documented(module_title: str) -> set[str]:
    coverage = DOC.read_text().split("## Coverage", 1)[1]
    paragraph = coverage.split(f"`{module_title}`:", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"[a-z_][a-z0-9_]*", paragraph.replace("and the dtypes", ",").replace(
        "and the enums", ","))) - {"and", "the", "dtypes", "enums"}


def public(module) -> set[str]:
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType) or name in ("annotations",):
            continue
        shared = isinstance(value, (np.dtype, type(nl.sbuf), TileSize))
        if getattr(value, "__module__", None) == module.__name__ or shared:
            names.add(name)
    return names


@pytest.mark.parametrize("module, title", [(nl, "nki.language"), (nisa, "nki.isa")])
def test_coverage_list_matches_the_implementation(module, title):
    aliases = {"unknown_engine", "tensor_engine", "scalar_engine", "gpsimd_engine", "vector_engine"}
    assert documented(title) == public(module) - aliases
