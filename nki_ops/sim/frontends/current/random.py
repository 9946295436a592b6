"""Random-number wrappers of ``nki.language``: ``nl.rand``, ``nl.random_seed``, ``nl.dropout``. They lower
to the Vector engine's generators as ``nisa.rand2``/``set_rng_seed``/``dropout`` do (see
``isa/random.py`` and ``core/random.py``)."""

from __future__ import annotations

from ...core import memory
from ...core import random as prng
from ...core.run import current_run
from .isa.random import dropped, seed_vector_engine
from .language import _buffer, _new_tile, sbuf
from .tensor import allocate


def rand(shape, dtype, buffer=sbuf, name=""):
    """A new tensor of uniform values in [0, 1), cast to ``dtype``."""
    api = "nl.rand"
    out = allocate(shape, dtype, _buffer(buffer), name, api, fill=None)
    memory.write(out, prng.uniform(current_run(api), "vector", tuple(out.shape)), api)
    return out


def random_seed(seed):
    """Seed ``rand``/``dropout`` from a [1, 1] SBUF/PSUM tensor holding a 32-bit value."""
    seed_vector_engine(seed, "nl.random_seed")


def dropout(x, rate, dtype=None):
    """A new SBUF tensor: ``x`` with each element zeroed with probability ``rate`` (kept values unscaled)."""
    api = "nl.dropout"
    return _new_tile(dropped(x, rate, api), dtype or x.dtype, api)
