"""Random-number instructions of the current API: ``nisa.rng``, ``rand2``, ``dropout``, ``set_rng_seed``,
``rand_set_state``, ``rand_get_state``; their rules and semantics are ``core/isa_random.py``'s (the
generators: ``core/random.py``)."""

from __future__ import annotations

from ....core import isa_random
from ....core.outputs import Dst
from .constants import engine as _engine
from .instruction import instruction

dropped, seed_vector_engine = isa_random.dropped, isa_random.seed_vector_engine  # nl.dropout's, nl.random_seed's


@instruction
def rng(dst, engine=_engine.vector, name=None):
    """32 random bits per element, truncated to ``dst``'s integer dtype (least significant bits)."""
    isa_random.rng(Dst(dst, "nisa.rng"), engine)


@instruction
def rand2(dst, min, max, name=None):  # noqa: A002  (the documented keyword names)
    """Uniform fp32 values in [min, max) (scalars or (P, 1) per-partition), cast to ``dst``'s dtype."""
    isa_random.rand2(Dst(dst, "nisa.rand2"), min, max)


@instruction
def dropout(dst, data, prob, name=None):
    """Zero each element of ``data`` with probability ``prob`` (scalar or (P, 1)); kept values are not
    scaled. ``dst.dtype`` must equal ``data.dtype``."""
    isa_random.dropout(Dst(dst, "nisa.dropout"), data, prob)


@instruction
def set_rng_seed(src_seeds, name=None):
    """Seed the Vector engine's generators from one 32-bit value in a [1, 1] SBUF/PSUM tensor."""
    isa_random.seed_vector_engine(src_seeds, "nisa.set_rng_seed")


@instruction
def rand_set_state(src_seeds, engine=_engine.gpsimd, name=None):
    """Lane p's generator states become row p of ``src_seeds`` (uint32, SBUF)."""
    isa_random.rand_set_state("nisa.rand_set_state", src_seeds, engine)


@instruction
def rand_get_state(dst, engine=_engine.gpsimd, name=None):
    """Row p of ``dst`` (uint32) receives lane p's generator states."""
    isa_random.rand_get_state(Dst(dst, "nisa.rand_get_state"), engine)
