"""``nki-ops bench sim_overhead``: the simulator's cost per instruction against a NumPy floor, at small sizes."""

from __future__ import annotations

import csv
import re

import pytest

from benchmarks import sim_overhead
from benchmarks.plot import plot_csv
from nki_ops import bench, nki_api

pytestmark = pytest.mark.simulation

ADD_ROWS, CHAIN_ROWS, MATMUL_SIZE = 64, 256, 256
KERNELS = ("vector add 1x1", "element-wise chain", "matmul, PSUM-accumulated", "GIoU", "RMSNorm",
           "attention, causal")
PHASES = (sim_overhead.FIRST, sim_overhead.FOLLOWING, sim_overhead.FULL)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    csv_path = tmp_path_factory.mktemp("sim_overhead") / "sim_overhead.csv"
    rows = sim_overhead.run(2, add_rows=ADD_ROWS, chain_rows=CHAIN_ROWS, matmul_size=MATMUL_SIZE,
                            giou_boxes=(16, 64), rms_shape=(256, 512), attention_shape=(1, 1, 256, 64),
                            max_seconds=1.0, csv_path=csv_path)
    return rows, csv_path


def _generations(kernel):
    if kernel == "attention, causal":  # there is no legacy attention kernel
        return ("current",) if nki_api.SIMULATED else ()
    if kernel in ("GIoU", "RMSNorm") and not nki_api.SIMULATED:  # the project's current kernels run on the SDK
        return ("legacy",)
    return ("legacy", "current")


def _instructions(rows):
    """(kernel, generation) -> the instruction count each of its rows reports."""
    counts = {}
    for row in rows:
        match = re.search(r", (\d+) instructions", row.note)
        if match:
            kernel, generation, _ = row.backend.rsplit(", ", 2)
            counts.setdefault((kernel, generation), set()).add(int(match.group(1)))
    return counts


def test_every_kernel_and_generation_has_a_floor_a_first_and_a_repeated_row(measured):
    rows, _ = measured
    expected = set()
    for kernel in KERNELS:
        if _generations(kernel):
            expected.add(f"{kernel}, {sim_overhead.FLOOR}")
        expected.update(f"{kernel}, {generation}, {phase}" for generation in _generations(kernel) for phase in PHASES)
    assert [r.backend for r in rows if r.backend in expected] == [r.backend for r in rows]
    assert {r.backend for r in rows} == expected and len(rows) == len(expected)
    floors = {r.backend.removesuffix(f", {sim_overhead.FLOOR}"): r for r in rows if r.backend.endswith("floor")}
    for row in rows:
        assert row.op == "sim_overhead" and row.median_ms > 0 and row.dtype == "float32"
        if row.backend.endswith("floor"):
            assert row.speedup_vs_torch == 1.0
            continue
        floor = floors[row.backend.rsplit(", ", 2)[0]]
        # The NumPy floor is the reference: speedup_vs_torch holds floor / simulator.
        assert row.speedup_vs_torch == pytest.approx(floor.median_ms / row.median_ms, rel=1e-2, abs=2e-3)
        assert "µs/instruction" in row.note and "the NumPy floor" in row.note
        if row.backend.endswith(sim_overhead.FIRST):
            assert row.p20_ms == row.median_ms == row.p80_ms  # one call
            assert "the following calls" in row.note


def test_instruction_counts_are_positive_and_equal_where_the_kernels_are_the_same_computation(measured):
    counts = _instructions(measured[0])
    assert set(counts) == {(k, g) for k in KERNELS for g in _generations(k)}
    for (kernel, generation), seen in counts.items():
        assert len(seen) == 1, f"{kernel}, {generation}: first and repeated rows disagree: {seen}"
    count = {key: next(iter(seen)) for key, seen in counts.items()}
    assert all(n > 0 for n in count.values())
    # Load, load, add, store per row in each API.
    assert count["vector add 1x1", "legacy"] == count["vector add 1x1", "current"] == 4 * ADD_ROWS
    # Load, 7 element-wise instructions, store per 128-row tile.
    assert count["element-wise chain", "legacy"] == count["element-wise chain", "current"] == 9 * CHAIN_ROWS // 128
    # Per 128-row output tile: 2 loads and a matmul per K tile, a PSUM -> SBUF copy and a store. The legacy
    # ``psum += nisa.nc_matmul(...)`` is one instruction (the matmul accumulating in PSUM) and its
    # ``nl.zeros`` PSUM tile is filled at allocation, not by a recorded instruction, so the counts agree.
    tiles = MATMUL_SIZE // 128
    assert count["matmul, PSUM-accumulated", "legacy"] == count["matmul, PSUM-accumulated", "current"] == \
        tiles * (3 * tiles + 2)
    # The project's GIoU and RMSNorm kernels are written differently in the two generations (the
    # current ones, e.g., broadcast the RMSNorm weight on the Tensor engine): their counts need not agree.


def test_the_csv_and_the_plot_are_written(measured):
    rows, csv_path = measured
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert [r["backend"] for r in table] == [r.backend for r in rows]
    assert len({r["timestamp"] for r in table}) == 1  # one run
    png = plot_csv(csv_path)
    assert png == csv_path.with_suffix(".png") and png.read_bytes().startswith(b"\x89PNG")


def test_nki_ops_bench_knows_it():
    assert bench.BENCHMARKS["sim_overhead"] == "benchmarks.sim_overhead"
    assert bench.import_benchmark("benchmarks.sim_overhead").run is sim_overhead.run
