"""Per-lane XORWOW pseudo random generators of the Vector and GpSimd engines (``nisa.rng``,
``rand2``, ``dropout``, ``set_rng_seed``, ``rand_set_state``/``rand_get_state``).

The docs name the algorithm (XORWOW) and its state size: 6 uint32 per generator, one generator per
GpSimd lane and four per Vector lane (24 uint32), 128 lanes. The step below is Marsaglia's xorwow
(five xorshift words + a Weyl counter, output ``v + d``). Not documented, so chosen here: the word
order inside the 6 uint32, how a seed expands into states, and which of a Vector lane's four
generators makes which element (round robin over the free elements). Bits therefore match the
device only if those choices happen to agree; a state read back and restored replays exactly.
"""

from __future__ import annotations

import numpy as np

from . import trace
from .run import Run, unfit

LANES = 128
WORDS = 6  # x, y, z, w, v, d
GENERATORS = {"vector": 4, "gpsimd": 1}
_WEYL = np.uint32(362437)


def _splitmix(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: decorrelates consecutive seeds into well-mixed words."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def seeded_states(seed: int, generators: int) -> np.ndarray:
    """(LANES, generators, WORDS) uint32 states from one 32-bit seed; every lane and generator differs.
    The xorshift words are never all zero (a zero state would emit only the counter)."""
    index = np.arange(LANES * generators * WORDS, dtype=np.uint64) + (np.uint64(seed & 0xFFFFFFFF) << np.uint64(32))
    states = (_splitmix(index) & np.uint64(0xFFFFFFFF)).astype(np.uint32).reshape(LANES, generators, WORDS)
    states[..., 0] |= np.uint32(1)
    return states


def _states(run: Run, engine: str) -> np.ndarray:
    """The engine's states in this launch, seeded from the config's seed until a kernel sets them."""
    unfit("random numbers")
    if trace.listening:
        trace.side_effect()  # every draw and state read goes through here
    prng = run.frontend.setdefault("core.random", {})
    if engine not in prng:
        seed = run.config.seed if run.config.seed is not None else 0
        prng[engine] = seeded_states(seed + (0 if engine == "vector" else 0x5EED), GENERATORS[engine])
    return prng[engine]


def set_seed(run: Run, engine: str, seed: int) -> None:
    if trace.listening:
        trace.side_effect()
    run.frontend.setdefault("core.random", {})[engine] = seeded_states(int(seed), GENERATORS[engine])


def get_state(run: Run, engine: str, partitions: int) -> np.ndarray:
    """(partitions, generators * WORDS) uint32: lane p's generators, each as its 6 words."""
    return _states(run, engine)[:partitions].reshape(partitions, -1).copy()


def set_state(run: Run, engine: str, state: np.ndarray) -> None:
    """Lanes 0..P-1 take the rows of ``state`` (P, generators * WORDS); other lanes keep theirs."""
    states = _states(run, engine)
    states[:state.shape[0]] = np.asarray(state, np.uint32).reshape(state.shape[0], GENERATORS[engine], WORDS)


def bits(run: Run, engine: str, shape: tuple[int, ...]) -> np.ndarray:
    """``shape`` (P, free...) uint32 random words: lane p makes partition p's elements in row-major
    order, element i from the lane's generator ``i % generators``. Advances the states."""
    states = _states(run, engine)
    partitions, count = shape[0], int(np.prod(shape[1:], dtype=np.int64))
    gens = states.shape[1]
    out = np.empty((partitions, count), np.uint32)
    lanes = states[:partitions]
    with np.errstate(over="ignore"):
        for i in range(-(-count // gens)):
            x, y, z, w, v, d = (lanes[..., k].copy() for k in range(WORDS))
            t = x ^ (x >> np.uint32(2))
            v_new = (v ^ (v << np.uint32(4))) ^ (t ^ (t << np.uint32(1)))
            d = d + _WEYL
            lanes[..., 0], lanes[..., 1], lanes[..., 2], lanes[..., 3], lanes[..., 4], lanes[..., 5] = \
                y, z, w, v, v_new, d
            words = v_new + d
            take = min(gens, count - i * gens)
            out[:, i * gens:i * gens + take] = words[:, :take]
    return out.reshape(shape)


def uniform(run: Run, engine: str, shape: tuple[int, ...]) -> np.ndarray:
    """fp32 in [0, 1): the top 24 bits of each word (exactly representable in fp32)."""
    return (bits(run, engine, shape) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)
