"""The NeuronCore cost model: an estimate of device time from the instruction record.

Each recorded instruction is charged to its engine with the documented cost formula for the target
(cycles at the engine's clock; a DMA as its bytes over the engines its partitions reach, a per-packet
overhead, the documented minimum time a transfer holds an engine, and a fixed latency). Instructions
are then list-scheduled in program order: each compute engine runs its stream in order, and an
instruction starts once its engine is free and the instructions it depends on (read-after-write,
write-after-read, write-after-write on overlapping regions) have finished; a DMA takes the first gap
on its queues after its data is ready.
The estimate is the makespan. Legacy SPMD instances run one after another.

Every figure is an estimate for the named target, never a measured device time. Constants live in
:data:`TARGETS` with their sources (``nki-language.md`` section 3 summarises them):
[ARCH1] trainium_inferentia2_arch.rst, [ARCH2] trainium2_arch.rst, [ARCH3] trainium3_arch.rst
(SDK architecture guides), [DMA] nki-dma-bandwidth-guide.rst, [DMAO] the DMA overview
(get-started/about/nki-dma-overview.rst: its throughput figure and trn2 profiles), [PERF] the NKI
performance guide (deep-dives/nki_perf_guide.rst), [ISA] the nki.isa API pages' cost notes
(nki-language.md 3.3), [PROF] neuron-profile's metric definitions
(tools/neuron-explorer/profile-schema-reference.rst: MBU is HBM bytes / total_time / "the maximum HBM
bandwidth of a HBM stack").
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import math
from dataclasses import dataclass, field

from ..core.trace import BARRIER, Instr, Recorder, Region

TENSOR, VECTOR, SCALAR, GPSIMD, DMA = "Tensor", "Vector", "Scalar", "GpSimd", "DMA"
_ENGINE_NUMBERS = {1: TENSOR, 2: SCALAR, 3: GPSIMD, 4: DMA, 5: VECTOR}


@dataclass(frozen=True)
class Target:
    """The constants of one NeuronCore generation; ``source`` cites each."""

    name: str
    clock_ghz: dict  # engine -> GHz
    vector_perf_mode: bool  # bf16/fp16 2x/4x Vector modes (NeuronCore-v3+)
    scalar_bf16_double: bool  # 256 elem/cycle Scalar for bf16/fp16/fp8 (NeuronCore-v4)
    dma_engines: int
    dma_bytes_per_ns: float  # practical per-engine bandwidth
    hbm_bytes_per_ns: float  # one HBM stack: the denominator of neuron-profile's MBU
    bf16_tflops: float
    min_ii: int = 64
    static_overhead: int = 100
    dependent_overhead: int = 100
    shared_ports: bool = False  # NeuronCore-v2: Vector/GpSimd share SBUF access, Vector/Scalar PSUM access
    mm_init: int = 64
    dma_fixed_ns: float = 1300.0
    dma_knee_bytes: float = 2415.0
    dma_descriptor_ns: float = 7.0
    dma_partitions_per_engine: int = 8
    dma_transpose_efficiency: float = 0.9
    dma_sbuf_transpose_efficiency: float = 0.5
    source: dict = field(default_factory=dict)


_COMMON_SOURCES = {
    "min_ii": "[ISA] MIN_II ~64 cycles, the minimum initiation interval of Vector/Scalar/GpSimd instructions",
    "static_overhead": "[ARCH1] Vector Engine cost model: add ~100 cycles of static instruction overhead for "
                       "back-to-back instructions with N << 128 (N < 128 here, on Vector/Scalar/GpSimd)",
    "dependent_overhead": "[ARCH1] ~100 cycles more when an instruction depends on the previous one of its "
                          "engine; [PERF] Opt #5a measures dependent one-element ScalarE instructions at 264 "
                          "cycles (189 ns) apart on NC-v2 = MIN_II 64 + static 100 + dependent 100",
    "mm_init": "[ARCH1] Tensor Engine cost model: MM initiation interval max(N, MM_INIT_LATENCY = 64 cycles); "
               "FP32 inputs ~4x",
    "dma_fixed_ns": "[DMA] ~1300 ns descriptor setup, synchronization and semaphore-to-start latency per "
                    "transfer; [DMAO] a 2 KiB-per-engine transfer's trigger to completion takes ~1330 ns in the "
                    "overview's trn2 profile: latency added to the data phase, overlapped with other transfers",
    "dma_knee_bytes": "[DMAO] throughput figure (p_dim=128): throughput grows in proportion to the bytes per "
                      "partition up to 1 KiB (42.4% of the 32 KiB point) and saturates from 4 KiB: a transfer "
                      "holds each engine at least as long as 8 partitions x 2415 B would take (fits the "
                      "figure's 11 points within 4% of peak); [DMA] >= 2 KiB per partition approaches peak",
    "dma_descriptor_ns": "[PERF] per DMA packet (contiguous run, one DMA buffer): the performance guide's "
                         "profile of tiny transfers (Opt #9, fig. 29) shows a 4 B packet taking 7 ns on a DMA "
                         "engine; [ARCH1] overhead at both DMA buffer and transfer levels",
    "dma_engines": "[DMA] 16 DMA engines per NeuronCore on every generation",
    "dma_partitions_per_engine": "[DMA] a transfer is split over the 16 DMA engines, 8 partitions each",
    "dma_transpose_efficiency": "[ARCH2] HBM -> SBUF DMA transpose reaches <= 90% of copy throughput",
    "dma_sbuf_transpose_efficiency": "[ARCH2] SBUF -> SBUF DMA transpose reaches <= 50% of copy throughput",
}

TARGETS = {
    "trn1": Target(
        "trn1", {TENSOR: 2.8, VECTOR: 1.12, SCALAR: 1.4, GPSIMD: 1.4}, False, False, 16, 17.0, 410.0, 91.75,
        shared_ports=True,
        source=_COMMON_SOURCES | {
            "shared_ports": "[ARCH1] NeuronCore-v2: Vector and GpSimd cannot access SBUF in parallel, Vector and "
                            "Scalar cannot access PSUM in parallel; the compiler serializes them",
            "clock_ghz": "[ARCH1] engine table: Tensor 2.8, Vector 1.12, Scalar 1.4, GpSimd 1.4 GHz",
            "vector_perf_mode": "[ARCH2] the bf16/fp16 Vector perf modes are new in NeuronCore-v3: off",
            "scalar_bf16_double": "[ARCH3] the 256 elem/cycle Scalar mode is new in NeuronCore-v4: off",
            "dma_bytes_per_ns": "[DMA] TRN1 17 B/ns per engine, 16 engines per NeuronCore",
            "hbm_bytes_per_ns": "[ARCH1] 2 HBM stacks, 820 GB/s per device: 410 GB/s per stack [PROF]",
            "bf16_tflops": "[ARCH1] 128x128 PE x 2 flop x 2.8 GHz (documented 92 TFLOPS)",
        }),
    "trn2": Target(
        "trn2", {TENSOR: 2.4, VECTOR: 0.96, SCALAR: 1.2, GPSIMD: 1.2}, True, False, 16, 23.0, 750.0, 78.64,
        source=_COMMON_SOURCES | {
            "clock_ghz": "[ARCH2] Tensor 2.4, Vector 0.96, Scalar 1.2, GpSimd 1.2 GHz",
            "scalar_bf16_double": "[ARCH3] the 256 elem/cycle Scalar mode is new in NeuronCore-v4: off",
            "shared_ports": "[ARCH1] the SBUF/PSUM access restrictions are documented for NeuronCore-v2 only: off",
            "vector_perf_mode": "[ARCH2] Vector 4x for tensor_copy/tensor_scalar bf16/fp16 SBUF unit stride, "
                                "2x other bf16/fp16",
            "dma_bytes_per_ns": "[DMA] TRN2 23 B/ns per engine, 16 engines per NeuronCore",
            "hbm_bytes_per_ns": "[ARCH2] 4 HBM stacks, 3 TB/s per device: 750 GB/s per stack [PROF]",
            "bf16_tflops": "[ARCH2] 79 BF16 TFLOPS per NeuronCore",
        }),
    "trn3": Target(
        "trn3", {TENSOR: 2.4, VECTOR: 1.2, SCALAR: 1.2, GPSIMD: 1.2}, True, True, 16, 33.0, 1175.0, 78.64,
        source=_COMMON_SOURCES | {
            "clock_ghz": "[ARCH3] Tensor 2.4, Vector 1.2, Scalar 1.2, GpSimd 1.2 GHz",
            "vector_perf_mode": "[ARCH2] Vector 4x/2x bf16/fp16 modes from NeuronCore-v3 on",
            "shared_ports": "[ARCH1] the SBUF/PSUM access restrictions are documented for NeuronCore-v2 only: off",
            "scalar_bf16_double": "[ARCH3] Scalar 256 elem/cycle for BF16/FP16/FP8",
            "dma_bytes_per_ns": "[DMA] TRN3 33 B/ns per engine, 16 engines per NeuronCore",
            "hbm_bytes_per_ns": "[ARCH3] 4 HBM stacks, 4.7 TB/s per device: 1175 GB/s per stack [PROF]",
            "bf16_tflops": "[ARCH3] 79 BF16 TFLOPS per NeuronCore",
        }),
}
TARGETS["inf2"] = TARGETS["trn1"]  # same NeuronCore-v2 [ARCH1]

# Engines by instruction name (after the "nl."/"nisa." prefix), where no engine hint was recorded.
_DMA_NAMES = {"load", "store", "dma_copy", "dma_transpose", "load_transpose2d", "sendrecv", "dma_compute",
              "register_store"}
_SCALAR_NAMES = {"activation", "activation_reduce", "exp", "log", "tanh", "sigmoid", "relu", "gelu",
                 "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_dx", "silu", "silu_dx", "softplus", "mish", "erf",
                 "erf_dx", "sin", "cos", "arctan", "sqrt", "rsqrt", "reciprocal", "square", "sign", "softmax",
                 "rms_norm", "layer_norm"}
_GPSIMD_NAMES = {"iota", "affine_select", "tensor_partition_reduce", "local_gather", "rand", "random_seed",
                 "dropout", "range_select"}
_TENSOR_NAMES = {"matmul", "nc_matmul"}
_TRANSPOSES = {"transpose", "nc_transpose"}


def _partition_broadcast(instr: Instr, name: str) -> bool:
    return name == "broadcast_to" and bool(instr.srcs) and instr.srcs[0].partitions == 1 < instr.dst.partitions


def engine_of(instr: Instr) -> str:
    if instr.engine in _ENGINE_NUMBERS:
        return _ENGINE_NUMBERS[instr.engine]
    name = instr.api.rsplit(".", 1)[-1]
    if _partition_broadcast(instr, name):
        return TENSOR  # [ARCH1] broadcast_to across partitions is a matmul with a ones vector
    if name in _DMA_NAMES:
        return DMA
    if name in _TENSOR_NAMES:
        return TENSOR
    if name in _SCALAR_NAMES:
        return SCALAR
    if name in _GPSIMD_NAMES:
        return GPSIMD
    return VECTOR


def _half(dtype: str) -> bool:
    return dtype in ("bfloat16", "float16")


def compute_cycles(instr: Instr, engine: str, target: Target) -> float:
    """Engine cycles of a compute instruction by the documented formulas (before the static overhead)."""
    name = instr.api.rsplit(".", 1)[-1]
    dst, srcs = instr.dst, instr.srcs
    tiles = [r for r in srcs if r.space != "hbm" and r.elements > 1]
    n = max([dst.elements] + [r.elements for r in tiles])
    if engine == TENSOR:
        if name in _TRANSPOSES:
            data = srcs[0] if srcs else dst
            return max(data.partitions, min(target.mm_init, data.elements))  # [ISA] nc_transpose on Tensor
        if _partition_broadcast(instr, name):  # the one-partition source is the moving operand [ARCH1]
            return max(target.mm_init, srcs[0].elements) * (4 if srcs[0].dtype == "float32" else 1)
        if len(srcs) < 2:
            return max(target.mm_init, n)
        stationary, moving = srcs[0], srcs[1]
        cycles = max(target.mm_init, moving.elements)  # [ARCH1] MM initiation interval
        if stationary.dtype == "float32" or moving.dtype == "float32":
            cycles *= 4  # [ARCH1] FP32 inputs ~4x
        if (instr.detail or {}).get("double_row"):
            cycles /= 2  # [ARCH2] FP8 double-row perf mode
        return cycles
    all_half = all(_half(r.dtype) for r in tiles + [dst])
    in_sbuf = all(r.space == "sbuf" for r in tiles + [dst])
    if engine == SCALAR:
        cycles = n / 2 if target.scalar_bf16_double and all_half else n
        if name == "activation_reduce" or (instr.detail or {}).get("reduce"):
            cycles += target.min_ii  # [ISA] activation_reduce: max(MIN_II, N) + MIN_II
        return max(target.min_ii, cycles)
    if engine == GPSIMD:
        if name in ("iota", "affine_select", "local_gather"):
            return 150 + n  # [ISA] ~150 + N GpSimd cycles
        return max(target.min_ii, n * (2 if len(tiles) >= 2 else 1))
    # Vector engine [ARCH1]: ~N cycles for one input, ~2N for two, with the [ISA] exceptions.
    if name == "bn_aggr":
        return max(target.min_ii, 13 * n / 3)
    if name == "reciprocal" and instr.api.startswith("nisa"):
        return max(target.min_ii, 8 * n)  # [ISA] Vector reciprocal
    if name in ("tensor_tensor_scan", "scan"):
        return max(target.min_ii, 2 * n)
    two_inputs = len(tiles) >= 2 and name not in ("bn_stats", "tensor_reduce") and not name.startswith("reduce")
    if two_inputs:
        one_psum = any(r.space == "psum" for r in tiles)
        cycles = n if one_psum else 2 * n  # [ISA] tensor_tensor
        if target.vector_perf_mode and all_half and in_sbuf:
            cycles = n  # [ARCH2] 2x for bf16/fp16 tensor_tensor with both inputs in SBUF
        return max(target.min_ii, cycles)
    cycles = n
    if name in ("tensor_reduce", "sum", "max", "min", "mean", "prod") and all_half:
        cycles = n / 2  # [ISA] tensor_reduce bf16 in and out
    if target.vector_perf_mode and all_half:
        copy_like = name in ("tensor_copy", "copy", "tensor_scalar", "multiply", "add", "subtract")
        cycles = n / 4 if copy_like and in_sbuf else n / 2  # [ARCH2] Vector perf modes
    return max(target.min_ii, cycles)


def dma_engines_of(instr: Instr, target: Target) -> int:
    """The DMA engines a transfer is spread over: 8 partitions each [DMA], every engine for HBM to HBM."""
    dst = instr.dst
    on_chip = dst if dst.space != "hbm" else next((r for r in instr.srcs if r.space != "hbm"), dst)
    if on_chip.space == "hbm":
        return target.dma_engines
    return min(target.dma_engines, max(1, math.ceil(on_chip.partitions / target.dma_partitions_per_engine)))


def dma_ns(instr: Instr, target: Target) -> tuple[float, float]:
    """(engine occupancy, data phase) of a DMA on each engine it uses: its contiguous runs (DMA buffers)
    spread over the engines, each run its bytes at the per-engine bandwidth plus a per-buffer overhead;
    the engine stays held at least as long as the documented throughput curve's knee would take."""
    dst = instr.dst
    src = next((r for r in instr.srcs if r.space != dst.space or r.key != dst.key), instr.srcs[0] if instr.srcs
               else dst)
    total = max(dst.bytes, 1)
    chunk = max(min(src.chunk, dst.chunk), 1)
    chunks = math.ceil(total / chunk)
    per_engine = math.ceil(chunks / dma_engines_of(instr, target))
    data = per_engine * (target.dma_descriptor_ns + chunk / target.dma_bytes_per_ns)
    if instr.api.endswith(("dma_transpose", "load_transpose2d")):
        data /= target.dma_transpose_efficiency if src.space == "hbm" else target.dma_sbuf_transpose_efficiency
    floor = target.dma_partitions_per_engine * target.dma_knee_bytes / target.dma_bytes_per_ns
    return max(floor, data), data


@dataclass
class Scheduled:
    """One instruction placed on the timeline (times in ns from the kernel's start)."""

    instr: Instr
    engine: str
    start: float
    end: float  # the engine is busy until here
    ready: float  # results visible to dependants (DMA: + fixed latency)
    cycles: float  # engine cycles (DMA: 0)
    after: int  # index of the predecessor that decided the start (-1: none)
    queues: int = 1  # DMA queues the transfer occupies at once, from ``first_queue`` on
    first_queue: int = 0
    hoisted: bool = False  # loop-invariant: charged with the execution ``after`` names


@dataclass
class Schedule:
    target: Target
    items: list[Scheduled]
    makespan_ns: float

    def busy_ns(self) -> dict[str, float]:
        busy: dict[str, float] = {}
        for item in self.items:
            share = item.queues / self.target.dma_engines if item.engine == DMA else 1.0
            busy[item.engine] = busy.get(item.engine, 0.0) + (item.end - item.start) * share
        return busy

    def critical_path(self) -> list[Scheduled]:
        if not self.items:
            return []
        index = max(range(len(self.items)), key=lambda i: self.items[i].ready)
        path = []
        while index >= 0:
            path.append(self.items[index])
            index = self.items[index].after
        return path[::-1]


def _overlaps(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


def _covers(a, b) -> bool:
    return a[1] <= b[1] and b[2] <= a[2] and a[3] <= b[3] and b[4] <= a[4]


class _Regions:
    """The regions of one storage last written (or read since), each with the instruction that did.

    A grid bucket holds the regions touching it, the cell size taken from the first region seen (a
    kernel's accesses to one tensor are mostly alike): finding the regions a new one overlaps or
    covers costs time in the regions near it, not in all earlier ones, so scheduling stays linear in
    the kernel's length. A region spanning more than ``_CELLS`` cells is kept apart and always checked;
    a query that large checks every region."""

    __slots__ = ("live", "cells", "wide", "size", "next_id")

    def __init__(self):
        self.live: dict[int, tuple] = {}  # id -> (region, instruction index)
        self.cells: dict[tuple[int, int], list[int]] = {}
        self.wide: list[int] = []
        self.size: tuple[int, int] | None = None
        self.next_id = 0

    def _cells(self, region):
        """The grid cells ``region`` touches, or None when they are more than ``_CELLS``."""
        rows, cols = self.size
        r0, c0 = region[1] // rows, region[3] // cols
        r1 = (region[2] - 1) // rows if region[2] > region[1] else r0
        c1 = (region[4] - 1) // cols if region[4] > region[3] else c0
        if r0 == r1 and c0 == c1:  # the common case: a region within one cell
            return ((r0, c0),)
        if (r1 - r0 + 1) * (c1 - c0 + 1) > _CELLS:
            return None
        return [(r, c) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)]

    def add(self, region, index: int) -> None:
        if self.size is None:
            self.size = (_pow2(region[2] - region[1]), _pow2(region[4] - region[3]))
        key = self.next_id
        self.next_id += 1
        self.live[key] = (region, index)
        cells = self._cells(region)
        if cells is None:
            self.wide.append(key)
        else:
            for cell in cells:
                self.cells.setdefault(cell, []).append(key)

    def near(self, region):
        """The ids of live regions that may overlap ``region`` (a superset), each once."""
        if self.size is None:
            return ()
        cells = self._cells(region)
        if cells is None:
            return list(self.live)
        live = self.live
        alone = len(cells) == 1 and not self.wide  # one cell's ids are each there once: no set to build
        found = {}
        for cell in cells:
            ids = self.cells.get(cell)
            if ids:
                kept = [i for i in ids if i in live]  # drop the ids of regions since replaced
                self.cells[cell] = kept
                if alone:
                    return kept
                found.update(dict.fromkeys(kept))
        if self.wide:
            self.wide = [i for i in self.wide if i in live]
            found.update(dict.fromkeys(self.wide))
        return found

    def overlapping(self, region):
        """The instruction indices of the live regions overlapping ``region``."""
        live = self.live
        return [live[i][1] for i in self.near(region) if _overlaps(live[i][0], region)]

    def drop_covered(self, region) -> None:
        """Forget the regions ``region`` covers (a write replaces them)."""
        live = self.live
        for i in [i for i in self.near(region) if _covers(region, live[i][0])]:
            del live[i]


_CELLS = 64


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class _Queue:
    """The busy intervals of one DMA queue, sorted and disjoint. A transfer whose data is ready early
    may fill a gap before one queued earlier in program order that still waits for its data: a DMA is
    triggered by its producer, so an untriggered one holds no engine."""

    __slots__ = ("starts", "ends", "proven")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []
        # duration -> the time ranges where no free window of that duration starts. Busy intervals only
        # grow, so these stay true: a transfer does not walk again past gaps too small for its size.
        self.proven: dict[float, _Ranges] = {}

    def first_fit(self, start: float, ns: float) -> float:
        """The earliest start at or after ``start`` when this queue is free for ``ns``."""
        proven = self.proven.get(ns)
        if proven is None:
            if len(self.proven) > 256:  # many transfer sizes: keep the memory bounded
                self.proven.clear()
            proven = self.proven[ns] = _Ranges()
        first = start
        while True:
            start = proven.end_of(start)
            busy_until = self.conflict_end(start, start + ns)
            if busy_until is None:
                break
            start = busy_until
        proven.add(first, start)
        return start

    def conflict_end(self, start: float, end: float) -> float | None:
        """The end of a busy interval overlapping [start, end), or None when it is free."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0 and self.ends[i] > start:
            return self.ends[i]
        if i + 1 < len(self.starts) and self.starts[i + 1] < end:
            return self.ends[i + 1]
        return None

    def occupy(self, start: float, end: float) -> None:
        i = bisect.bisect_right(self.starts, start)
        if i > 0 and self.ends[i - 1] == start:  # extend a back-to-back stream instead of growing the list
            self.ends[i - 1] = end
        else:
            self.starts.insert(i, start)
            self.ends.insert(i, end)


class _Ranges:
    """Disjoint half-open time ranges, sorted, merged as they are added."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def end_of(self, t: float) -> float:
        """The end of the range holding ``t``, or ``t`` when none does."""
        i = bisect.bisect_right(self.starts, t) - 1
        return self.ends[i] if i >= 0 and self.ends[i] > t else t

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self.ends, start)  # the first range ending at or after start
        j = bisect.bisect_right(self.starts, end)  # ranges from i to j touch [start, end)
        if i < j:
            start, end = min(start, self.starts[i]), max(end, self.ends[j - 1])
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]


def _earliest_gap(queues: list[_Queue], ready: float, ns: float) -> float:
    """The earliest start at or after ``ready`` when every one of ``queues`` is free for ``ns``: the queues in
    turn, until each in a row is free at the same start (a queue that moves it is free at the new start)."""
    start = ready
    free_in_a_row = i = 0
    count = len(queues)
    while free_in_a_row < count:
        fit = queues[i].first_fit(start, ns)
        if fit != start:
            start, free_in_a_row = fit, 1
        else:
            free_in_a_row += 1
        i = i + 1 if i + 1 < count else 0
    return start


_PORTS = {"sbuf": (VECTOR, GPSIMD), "psum": (VECTOR, SCALAR)}


def _ports(instr: Instr, engine: str) -> tuple[str, ...]:
    """The NeuronCore-v2 memory access ports ``instr`` holds: those of the memories it touches that its
    engine shares with another engine [ARCH1]."""
    spaces = {r.space for r in (instr.dst, *instr.srcs)}
    return tuple(port for port, engines in _PORTS.items() if engine in engines and port in spaces)


def _invariant_key(instr: Instr, engine: str, aliases: dict):
    """What must repeat for a later execution to recompute an earlier one's result: the kernel call
    and API arguments (``Instr.context``), the instruction and the exact regions read (a new tile
    holding a hoisted result read as the storage that result is in). None for an instruction the
    compiler does not hoist: a DMA (the matmul tutorial's published times show loop-invariant loads
    are not hoisted: 51.8 ms tiled against 42.96 ms with the loads hoisted by hand) or one whose
    result is not a function of those (engine state, arguments of unknown kind)."""
    if instr.context is None or engine == DMA:
        return None
    srcs = instr.srcs
    srcs = tuple(r if r[0] not in aliases else (aliases[r[0]], *r[1:]) for r in srcs) if aliases else tuple(srcs)
    detail = tuple(sorted(instr.detail.items())) if instr.detail else ()  # flags: hashable values
    return instr.context, instr.api, instr.engine, detail, srcs


@contextlib.contextmanager
def _no_cyclic_gc():
    """The scheduler makes no reference cycles; the collector's passes over the record's many objects
    would only make its time grow faster than the kernel's length."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_no_cyclic_gc()
def schedule(recorder: Recorder, target: str | None = None) -> Schedule:
    """List-schedule one run's instructions over its engines and DMA queues.

    Loop-invariant code motion: an instruction executed again with the same key
    (:func:`_invariant_key`) while nothing has written the regions its earlier execution read or
    wrote costs nothing, its result ready when the earlier one's was, as the compiler computes it
    once before the loop. It must write the earlier result's own region (unchanged) or a new tile
    (which then holds the same result); a matmul into PSUM only a new tile, since one into written
    PSUM accumulates. An instruction that writes a region it reads (``acc += x``) is never invariant."""
    tgt = TARGETS[target or recorder.target]
    free = {TENSOR: 0.0, VECTOR: 0.0, SCALAR: 0.0, GPSIMD: 0.0}
    last_on = {TENSOR: -1, VECTOR: -1, SCALAR: -1, GPSIMD: -1}
    dma_queues = [_Queue() for _ in range(tgt.dma_engines)]
    port_free = {port: (0.0, -1) for port in _PORTS}  # shared access port -> (free from, its last user)
    writers: dict[int, _Regions] = {}
    readers: dict[int, _Regions] = {}
    items: list[Scheduled] = []
    floor, floor_index = 0.0, -1
    previous_stationary = None
    next_queue = 0
    invariant: dict = {}  # invariant key -> (index of the execution charged, the regions it read and wrote)
    watching: dict[int, list] = {}  # storage key -> invariant keys whose regions lie on it
    aliases: dict[int, int] = {}  # storage key of a new tile holding a hoisted result -> the result's storage
    for instr in with_spills(recorder):
        if instr is BARRIER:
            if items:
                floor_index = max(range(len(items)), key=lambda i: items[i].ready)
                floor = items[floor_index].ready
            invariant.clear()  # SPMD instances are separate programs: nothing moves between them
            watching.clear()
            aliases.clear()
            continue
        engine = engine_of(instr)
        dst = instr.dst
        key = _invariant_key(instr, engine, aliases)
        if key is not None and key in invariant:
            first = items[invariant[key][0]]
            same = dst == first.instr.dst
            new_tile = dst[0] not in writers or not writers[dst[0]].live
            matmul = engine == TENSOR and dst.space == "psum" and instr.api.rsplit(".", 1)[-1] in _TENSOR_NAMES
            if new_tile or (same and not matmul):
                index = len(items)
                items.append(Scheduled(instr, engine, first.ready, first.ready, first.ready, 0.0,
                                       invariant[key][0], hoisted=True))
                if not same:
                    writers[dst[0]] = _Regions()
                    writers[dst[0]].add(dst, index)
                    if dst[1:] == first.instr.dst[1:]:  # same shape and place: its readers read the result
                        aliases[dst[0]] = first.instr.dst[0]
                continue
        # Dependencies: the latest-finishing instruction this one must wait for.
        dep_time, dep_index = floor, floor_index
        deps = set()
        for src in instr.srcs:
            if src[0] in writers:
                deps.update(writers[src[0]].overlapping(src))
        for regions in (writers.get(dst[0]), readers.get(dst[0])):
            if regions is not None:
                deps.update(regions.overlapping(dst))
        for i in sorted(deps):
            if items[i].ready > dep_time:
                dep_time, dep_index = items[i].ready, i
        if engine == DMA:
            ns, data = dma_ns(instr, tgt)
            count = dma_engines_of(instr, tgt)
            queues = [(next_queue + q) % tgt.dma_engines for q in range(count)]
            next_queue = (next_queue + count) % tgt.dma_engines
            start = _earliest_gap([dma_queues[q] for q in queues], dep_time, ns)
            after = dep_index if start == dep_time else -1
            end = start + ns
            for q in queues:
                dma_queues[q].occupy(start, end)
            # The fixed latency overlaps the engine's other transfers: the result is visible the latency
            # after the data phase, however long the knee holds the engine.
            ready = max(end, start + data + tgt.dma_fixed_ns)
            item = Scheduled(instr, DMA, start, end, ready, 0.0, after, count, queues[0])
        else:
            cycles = compute_cycles(instr, engine, tgt)
            if engine == TENSOR and len(instr.srcs) >= 2 and instr.api.rsplit(".", 1)[-1] in _TENSOR_NAMES:
                stationary = instr.srcs[0]
                if stationary != previous_stationary:
                    cycles += stationary.elements / 4  # [ARCH1] LoadStationary up to 4x faster than MM
                previous_stationary = stationary
            elif engine != TENSOR:
                if max(r.elements for r in (dst, *instr.srcs) if r.space != "hbm") < 128:
                    cycles += tgt.static_overhead
                if last_on[engine] >= 0 and last_on[engine] in deps:
                    cycles += tgt.dependent_overhead
            start = max(free[engine], dep_time)
            after = dep_index if dep_time >= free[engine] else last_on[engine]
            shared = _ports(instr, engine) if tgt.shared_ports else ()
            for port in shared:
                if port_free[port][0] > start:
                    start, after = port_free[port]
            end = start + cycles / tgt.clock_ghz[engine]
            free[engine] = end
            for port in shared:
                port_free[port] = (end, len(items))
            last_on[engine] = len(items)
            item = Scheduled(instr, engine, start, end, end, cycles, after)
        index = len(items)
        items.append(item)
        # Region bookkeeping: a write replaces what it covers.
        for src in instr.srcs:
            if src[0] not in readers:
                readers[src[0]] = _Regions()
            readers[src[0]].add(src, index)
        if dst[0] in readers:
            readers[dst[0]].drop_covered(dst)
        if dst[0] not in writers:
            writers[dst[0]] = _Regions()
        writers[dst[0]].drop_covered(dst)
        writers[dst[0]].add(dst, index)
        # The write ends the invariance of every earlier execution that read or wrote what it overwrites
        # (and a new tile that held a hoisted result no longer does).
        aliases.pop(dst[0], None)
        watched = watching.get(dst[0])
        if watched:
            for other in watched:
                entry = invariant.get(other)
                if entry is not None and any(r[0] == dst[0] and _overlaps(r, dst) for r in entry[1]):
                    del invariant[other]
            watching[dst[0]] = [k for k in watched if k in invariant]
        if key is not None and not any(r[0] == dst[0] and _overlaps(r, dst) for r in (*instr.srcs, *key[-1])):
            regions = (*key[-1], dst)
            invariant[key] = (index, regions)
            for storage in {r[0] for r in regions}:
                watching.setdefault(storage, []).append(key)
    makespan = max((item.ready for item in items), default=0.0)
    return Schedule(tgt, items, makespan)


# ------------------------------------------------------------------------------------------ spills

SPILL_SAVE, SPILL_RELOAD = "spill_save", "spill_reload"  # neuron-profile's names for the traffic


def with_spills(recorder: Recorder) -> list:
    """The record with the SBUF spill traffic the compiler adds when live tiles exceed the budget.

    "When the cumulative size of live data ... overflows the capacity of any on-chip memory, the Neuron
    compiler inserts the necessary spills or refills between that memory and the next-tier memory"
    (NKI memory hierarchy overview); the docs name no victim rule, so this takes the classical one
    (Belady's): a tile is live from its first use to its last (as ``core/liveness.py`` counts it), and
    when the live tiles of an instruction exceed the budget, the live tiles it does not use are evicted
    farthest next use first. An evicted tile written since it was last saved is saved to HBM (one
    ``spill_save`` DMA of the whole storage), and reloaded (``spill_reload``) just before its next use,
    after the instruction before that use (reloads are issued in program order). Tiles at fixed
    addresses (direct allocation) are never spilled; PSUM is not modelled here."""
    instrs = recorder.instrs
    sizes = recorder.sbuf
    if recorder.direct_sbuf or not sizes or not recorder.sbuf_budget:
        return instrs
    out: list = []
    start = 0
    for end in [i for i, instr in enumerate(instrs) if instr is BARRIER] + [len(instrs)]:
        out.extend(_spill_segment(instrs[start:end], sizes, recorder.sbuf_budget))
        if end < len(instrs):
            out.append(BARRIER)
        start = end + 1
    return out


def _footprint(region: Region) -> int:
    """SBUF bytes per partition a whole storage takes."""
    return region.elements * region.itemsize


def _spill_segment(segment: list, sizes: dict, budget: int) -> list:
    """One SPMD instance's instructions with its spill traffic (see :func:`with_spills`)."""
    uses: dict[int, list[int]] = {}
    for pos, instr in enumerate(segment):
        for key in {r[0] for r in (*instr.srcs, instr.dst)}:
            if key in sizes:
                uses.setdefault(key, []).append(pos)
    events = sorted([(u[0], _footprint(sizes[k])) for k, u in uses.items()]
                    + [(u[-1] + 1, -_footprint(sizes[k])) for k, u in uses.items()], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    if peak <= budget:
        return segment
    out: list = []
    resident: dict[int, bool] = {}  # key -> written since it was last saved
    saved: dict[int, Region] = {}  # key -> its HBM copy
    seen: dict[int, int] = {}  # key -> uses done
    resident_bytes = 0
    for pos, instr in enumerate(segment):
        keys = {r[0] for r in (*instr.srcs, instr.dst) if r[0] in sizes}
        for key in keys:
            if key not in resident:
                if key in saved:  # evicted before: back in just before this use
                    srcs = [saved[key]] + ([segment[pos - 1].dst] if pos else [])
                    out.append(Instr(SPILL_RELOAD, 4, srcs, sizes[key], (), instr.site, None))
                resident[key] = key not in saved
                resident_bytes += _footprint(sizes[key])
        while resident_bytes > budget:
            victims = [k for k in resident if k not in keys]
            if not victims:
                break
            victim = max(victims, key=lambda k: uses[k][seen[k]])  # the farthest next use
            if resident.pop(victim):
                region = sizes[victim]
                saved[victim] = Region((-1 - victim, *region[1:5], "hbm", *region[6:]))  # its own HBM copy
                out.append(Instr(SPILL_SAVE, 4, [region], saved[victim], (), instr.site, None))
            resident_bytes -= _footprint(sizes[victim])
        out.append(instr)
        if instr.dst[0] in resident:
            resident[instr.dst[0]] = True
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] == len(uses[key]) and key in resident:  # its last use: dead
                del resident[key]
                resident_bytes -= _footprint(sizes[key])
    return out


@dataclass
class Estimate:
    """The estimate for one kernel launch: one schedule per NeuronCore run (LNC2 runs two)."""

    target: str
    schedules: list[Schedule]

    @property
    def seconds(self) -> float:
        return max((s.makespan_ns for s in self.schedules), default=0.0) * 1e-9

    @property
    def microseconds(self) -> float:
        return self.seconds * 1e6

    @property
    def label(self) -> str:
        return f"estimate for {self.target}"


def estimate(recorders: list[Recorder], target: str | None = None) -> Estimate:
    if not recorders:
        raise ValueError("no kernel ran while the cost model listened")
    name = target or recorders[0].target
    return Estimate(name, [schedule(r, name) for r in recorders])
