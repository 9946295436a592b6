"""On-chip capacity for the current ``nki`` API, by liveness as in the legacy front end: an
allocation (``nl.ndarray``/``zeros``/... in SBUF or PSUM; its views share it) is live from its
first use to its last use by an instruction. One tensor wider than an SBUF partition is refused
at its allocation; live data above the target's budget is a warning naming the live allocations
(the compiler spills it to the next memory tier)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from nki_ops.sim import CapacityError, SimulatorWarning
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa

pytestmark = pytest.mark.simulation

X = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
COLS = 30_000  # fp32: 120,000 bytes per partition; two of them exceed trn1's 192 KiB, not trn3's 256 KiB


def run(body, target: str, *arrays):
    """Run ``body`` on ``target``; returns (result, capacity warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SimulatorWarning)
        result = nki.jit(body, platform_target=target)(*(arrays or (X,)))
    return result, [str(w.message) for w in caught if issubclass(w.category, SimulatorWarning)]


def two_wide_tiles_live_together(x):
    out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)  # line A
    b = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)  # line B
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=b, value=2.0)
    total = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=out, src=total[:, 0:1])
    return out


def _line(marker: str) -> int:
    source = open(__file__).read().splitlines()
    return next(i for i, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))


def test_one_tensor_wider_than_a_trn1_partition_is_refused_naming_its_site():
    def kernel(x):
        row = nl.ndarray((2, 50_000), nl.float32, buffer=nl.sbuf)  # line WIDE
        nisa.memset(dst=row, value=0.0)
        return x

    with pytest.raises(CapacityError, match=rf"SBUF.*'ndarray@.*' \(allocated at .*test_current_capacity\.py:"
                                            rf"{_line('line WIDE')}\).*200000 bytes.*trn1 SBUF budget of 196608"):
        nki.jit(kernel, platform_target="trn1")(X)
    _, warned = run(kernel, "trn3")  # 200,000 bytes fit trn3's 256 KiB partition
    assert warned == []


def test_live_sbuf_above_the_budget_warns_naming_the_live_allocations():
    out, warned = run(two_wide_tiles_live_together, "trn1")
    np.testing.assert_array_equal(out, np.full((128, 1), 3.0, np.float32))
    assert len(warned) == 1
    assert re.search(r"SBUF capacity exceeded: 360000 bytes per partition .* above the trn1 budget of 196608",
                     warned[0]), warned[0]
    for marker in ("line A", "line B"):
        assert f"test_current_capacity.py:{_line(marker)}" in warned[0]
    assert "spills the excess to HBM" in warned[0]
    assert run(two_wide_tiles_live_together, "trn2")[1] != []  # 360,000 > 224 KiB
    assert run(two_wide_tiles_live_together, "trn3")[1] != []  # 360,000 > 256 KiB


def test_two_wide_tiles_fit_trn3_but_not_trn1():
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        a = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=a, value=1.0)
        b = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=b, src=a)  # a and b live together: 240,000 bytes
        nisa.dma_copy(dst=out, src=b[:, 0:1])
        return out

    assert len(run(kernel, "trn1")[1]) == 1
    out, warned = run(kernel, "trn3")
    assert warned == []
    np.testing.assert_array_equal(out, 1.0)


def test_a_tile_rebound_in_a_loop_is_not_double_counted():
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1), nl.float32, buffer=nl.sbuf)
        for i in range(4):  # four 120,000-byte tiles, one live at a time
            wide = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=wide, value=float(i))
            nisa.tensor_tensor(dst=acc, data1=acc, data2=wide[:, 5:6], op=nl.add)
        nisa.dma_copy(dst=out, src=acc)
        return out

    out, warned = run(kernel, "trn1")
    assert warned == []
    np.testing.assert_array_equal(out, 6.0)


def test_a_view_keeps_its_allocation_live_until_its_last_use():
    # `early` is loaded by DMA through a view and read at the end through another view: it is live
    # across `middle`'s use, so both count.
    def kernel(x):
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        early = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)  # line EARLY
        nisa.dma_copy(dst=early[:, 0:4], src=x)
        middle = nl.ndarray((128, COLS), nl.float32, buffer=nl.sbuf)  # line MIDDLE
        nisa.memset(dst=middle, value=0.0)
        nisa.dma_copy(dst=out, src=middle[:, 0:4])
        nisa.dma_copy(dst=out, src=early.reshape((128, 10, COLS // 10))[:, 0, 0:4])
        return out

    out, warned = run(kernel, "trn1")
    np.testing.assert_array_equal(out, X)
    assert len(warned) == 1 and "240000 bytes per partition" in warned[0]
    assert f":{_line('line EARLY')}" in warned[0] and f":{_line('line MIDDLE')}" in warned[0]


def psum_tiles(count: int):
    def kernel(x):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        ones = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        wide = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=wide, value=1.0)
        banks = []
        for _ in range(count):  # one 2 KiB bank each, all live until the sum below
            bank = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # line BANK
            nisa.nc_matmul(dst=bank, stationary=ones, moving=wide)
            banks.append(bank)
        total = nl.zeros((128, 512), nl.float32, buffer=nl.sbuf)
        for bank in banks:
            nisa.tensor_tensor(dst=total, data1=total, data2=bank, op=nl.add)
        nisa.dma_copy(dst=out, src=total[:, 0:1])
        return out
    return kernel


def test_psum_above_its_eight_banks_warns_and_eight_fit():
    out, warned = run(psum_tiles(8), "trn1")
    assert warned == []
    np.testing.assert_array_equal(out, 8 * 128.0)
    out, warned = run(psum_tiles(9), "trn3")
    np.testing.assert_array_equal(out, 9 * 128.0)
    assert len(warned) == 1
    assert "PSUM capacity exceeded: 18432 bytes per partition" in warned[0]
    assert "above the trn3 budget of 16384" in warned[0] and "spills the excess to SBUF" in warned[0]
    assert f"test_current_capacity.py:{_line('line BANK')}" in warned[0]
