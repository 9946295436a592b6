"""Profiles from the cost model: a text report, a Chrome/Perfetto trace and a timeline PNG.

``nki_ops.sim.profile(kernel)(*args)`` runs the kernel in the simulator while the cost model listens
and returns a :class:`Profile`. Every figure is an estimate for the named target, not a measurement.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict

from ..core import trace
from ..core.config import configure
from .cost import (
    _TRANSPOSES,
    DMA,
    SPILL_RELOAD,
    SPILL_SAVE,
    TENSOR,
    Estimate,
    Schedule,
    _partition_broadcast,
    estimate,
)

ENGINE_ORDER = ("Tensor", "Vector", "Scalar", "GpSimd", "DMA")


class Profile:
    """The estimate of one or more kernel launches (``launches``: one :class:`Estimate` each)."""

    def __init__(self, launches: list[tuple[str, Estimate]], outputs=None):
        self.launches, self.outputs = launches, outputs

    @property
    def estimate(self) -> Estimate:
        return self.launches[-1][1]

    @property
    def seconds(self) -> float:
        return sum(e.seconds for _, e in self.launches)

    def report(self) -> str:
        return "\n\n".join(report(name, e) for name, e in self.launches)

    def write_trace(self, path: str) -> None:
        with open(path, "w") as handle:
            json.dump(chrome_trace(self.launches), handle)

    def write_png(self, path: str) -> None:
        timeline_png(self.launches, path)


def profile(kernel, *, target: str | None = None, timing_only: bool | None = None):
    """``profile(kernel)(*args, **kwargs)``: run ``kernel`` (a simulated kernel of either front end) and
    return its :class:`Profile`; outputs are in ``profile.outputs``."""
    def call(*args, **kwargs):
        changes = {}
        if target is not None:
            changes["target"] = target
        if timing_only is not None:
            changes["timing_only"] = timing_only
        with configure(**changes), listen(target) as launches:
            outputs = kernel(*args, **kwargs)
        return Profile(launches(), outputs)
    return call


@contextlib.contextmanager
def listen(target: str | None = None):
    """Record every kernel launched inside the block; yields a function giving (name, Estimate) per
    launch (the cores of an LNC2 launch together), for ``target``, default each launch's own target.
    A current-API kernel with no target of its own runs as ``target`` (see ``target_of``)."""
    with trace.listen(target) as recorders:
        yield lambda: _launches(recorders, target)


def _launches(recorders, target: str | None) -> list[tuple[str, Estimate]]:
    launches: list[list] = []
    for recorder in recorders:
        if not recorder.instrs:
            continue
        if recorder.launch is not None and launches and launches[-1][0].launch is recorder.launch:
            launches[-1].append(recorder)  # another core of the same LNC2 launch
        else:
            launches.append([recorder])
    return [(_kernel_name(group[0]), estimate(group, target)) for group in launches]


def _kernel_name(recorder) -> str:
    first = next((i for i in recorder.instrs if i is not None), None)
    return first.site[2] if first is not None else "<kernel>"


# ---------------------------------------------------------------------------------------- report

def engine_busy(schedule: Schedule) -> dict[str, float]:
    return schedule.busy_ns()


# Transcendental functions as XLA's HloCostAnalysis counts them (one per output element: exp, log,
# logistic, power, sqrt, rsqrt, tanh, sin, cos, tan, atan2, erf), which JAX Pallas' CostEstimate
# mirrors; activation functions built on them (gelu, silu, softplus, mish) count once, as XLA counts
# logistic once. relu, square, abs, sign, reciprocal and copies are ordinary flops.
TRANSCENDENTAL = {"exp", "log", "sigmoid", "power", "sqrt", "rsqrt", "tanh", "sin", "cos", "tan", "arctan", "erf",
                  "erf_dx", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx",
                  "silu", "silu_dx", "softplus", "mish", "softmax", "exponential"}
# Data movement, no arithmetic (XLA counts copies, transposes, broadcasts and gathers as 0 flops).
_MOVES = {"tensor_copy", "copy", "transpose", "nc_transpose", "broadcast_to", "tensor_copy_predicated", "shuffle",
          "nc_stream_shuffle", "local_gather", "identity", "bypass"}
# The NKI performance guide (nki/deep-dives/nki_perf_guide.rst): "compute-bound means at least one of
# the compute engines is active close to 100% of the kernel execution time (90%+ is considered good in
# practice), while memory-bound typically means the achieved device memory bandwidth utilization (MBU)
# is close to 100% (60%+ is considered good in practice)".
COMPUTE_BOUND_ACTIVE = 90.0
MEMORY_BOUND_MBU = 60.0


def _function(instr) -> str:
    """The element-wise function an instruction computes: its activation function, else its name."""
    return (instr.detail or {}).get("function") or instr.api.rsplit(".", 1)[-1]


def _tensor_flops(instr) -> tuple[str, float]:
    """("model" | "transpose" | "broadcast", FLOPs) of a Tensor-engine instruction, counted as
    neuron-profile counts hardware FLOPs: 2 x active rows x active columns x moving elements."""
    name = instr.api.rsplit(".", 1)[-1]
    srcs = instr.srcs or [instr.dst]
    if name in _TRANSPOSES or (instr.detail or {}).get("transpose"):  # the data (stationary) x a P x P identity
        data = srcs[0]
        return "transpose", 2.0 * data.partitions * data.elements * data.partitions
    if _partition_broadcast(instr, name):  # a ones vector stationary, the one-partition source moving
        return "broadcast", 2.0 * instr.dst.partitions * srcs[0].elements
    stationary, moving = (srcs[0], srcs[1]) if len(srcs) >= 2 else (srcs[0], srcs[0])
    return "model", 2.0 * stationary.partitions * stationary.elements * moving.elements


def _elements(instr) -> int:
    """Elements of an instruction's largest operand (a reduction's input, an element-wise result)."""
    return max(r.partitions * r.elements for r in (instr.dst, *instr.srcs))


def _active_ns(items) -> float:
    """Time at least one of ``items`` runs (their intervals merged)."""
    total, until = 0.0, -math.inf
    for start, end in sorted((i.start, i.end) for i in items if i.end > i.start):
        if end > until:
            total += end - max(start, until)
            until = end
    return total


def metrics(est: Estimate) -> dict:
    """The figures neuron-profile's Summary reports, under its names, for the estimated run, plus JAX
    Pallas' CostEstimate triple (flops, transcendentals, bytes_accessed) and the NKI performance
    guide's bound. An LNC2 launch sums its cores' work; times are the launch's (the slower core)."""
    total_ns = max(est.seconds * 1e9, 1e-9)
    tgt = est.schedules[0].target
    cores = len(est.schedules)
    tensor = {"model": 0.0, "transpose": 0.0, "broadcast": 0.0}
    hbm_read = hbm_write = elementwise = transcendentals = 0
    spill: dict[str, int] = defaultdict(int)
    busy: dict[str, float] = defaultdict(float)
    active: dict[str, float] = defaultdict(float)
    for sched in est.schedules:
        for engine, ns in sched.busy_ns().items():
            busy[engine] += ns
        by_engine = defaultdict(list)
        for item in sched.items:
            by_engine[item.engine].append(item)
            instr = item.instr
            if item.engine == DMA:
                reads = instr.srcs[:1] if instr.api == SPILL_RELOAD else instr.srcs  # the rest only orders it
                hbm_read += sum(r.bytes for r in reads if r.space == "hbm")
                hbm_write += instr.dst.bytes if instr.dst.space == "hbm" else 0
                spill[instr.api] += instr.dst.bytes
            elif item.engine == TENSOR:
                kind, flops = _tensor_flops(instr)
                tensor[kind] += flops
            elif instr.srcs:  # an instruction reading no tile (memset, iota) computes nothing
                function = _function(instr)
                if function in TRANSCENDENTAL:
                    transcendentals += _elements(instr)
                elif function not in _MOVES:
                    elementwise += _elements(instr)
        for engine, items in by_engine.items():
            active[engine] += _active_ns(items)
    peak = tgt.bf16_tflops * 1e3 * cores  # flops per ns: 2 x 128 x 128 PEs x Tensor clock, per core
    hardware = sum(tensor.values())
    hbm = hbm_read + hbm_write
    m = {
        "target": est.target, "label": est.label, "total_time": est.seconds, "cores": cores,
        "instructions": sum(len(s.items) for s in est.schedules),
        "hoisted": sum(item.hoisted for s in est.schedules for item in s.items),
        "busy_ns": dict(busy),
    }
    for engine in ENGINE_ORDER:  # neuron-profile: time at least one instruction (DMA: packet) is running
        key = "dma_active_time_percent" if engine == DMA else f"{engine.lower()}_engine_active_time_percent"
        m[key] = 100.0 * active.get(engine, 0.0) / cores / total_ns
    m.update({
        "model_flops": tensor["model"], "transpose_flops": tensor["transpose"], "hardware_flops": hardware,
        "mfu_estimated_percent": 100.0 * tensor["model"] / (peak * total_ns),
        "hfu_estimated_percent": 100.0 * hardware / (peak * total_ns),
        "hbm_read_bytes": hbm_read, "hbm_write_bytes": hbm_write,
        "spill_save_bytes": spill[SPILL_SAVE], "spill_reload_bytes": spill[SPILL_RELOAD],
        "mbu_estimated_percent": 100.0 * hbm / total_ns / tgt.hbm_bytes_per_ns,
        "mm_arithmetic_intensity": (hardware - tensor["transpose"]) / max(hbm, 1),
        "peak_flops_bandwidth_ratio": peak / tgt.hbm_bytes_per_ns,
        "flops": tensor["model"] + elementwise, "transcendentals": transcendentals, "bytes_accessed": hbm,
    })
    m["bound"] = bound(m)
    return m


def bound(m: dict) -> str:
    """The NKI performance guide's verdict: "compute-bound", "memory-bound", both, or "neither"
    (no engine 90% active, MBU under 60%: latency, overhead or dependencies limit the kernel)."""
    busiest = max(m[f"{e.lower()}_engine_active_time_percent"] for e in ENGINE_ORDER if e != DMA)
    found = [name for name, hit in (("compute-bound", busiest >= COMPUTE_BOUND_ACTIVE),
                                    ("memory-bound", m["mbu_estimated_percent"] >= MEMORY_BOUND_MBU)) if hit]
    return " and ".join(found) or "neither"


def costliest(sched: Schedule, count: int = 10) -> list[tuple[float, int, str, str, str]]:
    """(busy ns, instructions, engine, api, file:line) summed by source line, costliest first."""
    total: dict[tuple, list] = defaultdict(lambda: [0.0, 0])
    for item in sched.items:
        instr = item.instr
        key = (item.engine, instr.api, f"{instr.site[0]}:{instr.site[1]}")
        total[key][0] += item.end - item.start
        total[key][1] += 1
    ranked = sorted(((ns, n, *key) for key, (ns, n) in total.items()), reverse=True)
    return ranked[:count]


def report(name: str, est: Estimate) -> str:
    m = metrics(est)
    sched = max(est.schedules, key=lambda s: s.makespan_ns)
    lines = [f"{name}: {_time(m['total_time'])} estimated device time ({est.label}; a cost-model estimate, not a "
             f"measurement) over {m['instructions']} instructions"
             + (f" ({m['hoisted']} loop-invariant: charged once)" if m["hoisted"] else "")]
    lines.append("  engine    busy        active time (neuron-profile *_active_time_percent)")
    for engine in ENGINE_ORDER:
        if engine in m["busy_ns"]:
            key = "dma_active_time_percent" if engine == DMA else f"{engine.lower()}_engine_active_time_percent"
            lines.append(f"  {engine:<8}  {_time(m['busy_ns'][engine] * 1e-9):<10}  {m[key]:5.1f}%")
    peak = sched.target.bf16_tflops * m["cores"]
    lines.append(f"  MFU {m['mfu_estimated_percent']:.1f}%, HFU {m['hfu_estimated_percent']:.1f}% of {peak:g} BF16 "
                 f"TFLOPS (model_flops {m['model_flops']:.4g}: matmuls; hardware_flops {m['hardware_flops']:.4g}: "
                 f"+ Tensor-engine transposes and partition broadcasts)")
    lines.append(f"  MBU {m['mbu_estimated_percent']:.1f}% of one HBM stack's {sched.target.hbm_bytes_per_ns:g} GB/s "
                 f"(hbm_read_bytes {m['hbm_read_bytes']}, hbm_write_bytes {m['hbm_write_bytes']}; SBUF spills: "
                 f"spill_save_bytes {m['spill_save_bytes']}, spill_reload_bytes {m['spill_reload_bytes']})")
    lines.append(f"  cost estimate (Pallas CostEstimate): flops={m['flops']:.0f}, "
                 f"transcendentals={m['transcendentals']}, bytes_accessed={m['bytes_accessed']}")
    roofline = "compute" if m["mm_arithmetic_intensity"] > m["peak_flops_bandwidth_ratio"] else "memory"
    lines.append(f"  bound (NKI performance guide: an engine >= {COMPUTE_BOUND_ACTIVE:g}% active / MBU >= "
                 f"{MEMORY_BOUND_MBU:g}%): {m['bound']}; roofline: mm_arithmetic_intensity "
                 f"{m['mm_arithmetic_intensity']:.3g} vs peak_flops_bandwidth_ratio "
                 f"{m['peak_flops_bandwidth_ratio']:.3g} flop/B ({roofline} side)")
    path = sched.critical_path()
    if path:
        on: dict[str, float] = defaultdict(float)
        for item in path:
            on[item.engine] += item.ready - item.start
        share = ", ".join(f"{e} {_time(t * 1e-9)}" for e, t in sorted(on.items(), key=lambda kv: -kv[1]))
        lines.append(f"  critical path: {len(path)} instructions ({share})")
        heavy = sorted(path, key=lambda item: item.start - item.ready)[:3]
        for item in heavy:
            lines.append(f"    {item.engine:<7} {item.instr.api:<22} {_time((item.ready - item.start) * 1e-9):<10} "
                         f"at {item.instr.site[0]}:{item.instr.site[1]}")
    lines.append("  costliest instructions (engine time summed per source line):")
    for ns, n, engine, api, site in costliest(sched):
        lines.append(f"    {_time(ns * 1e-9):<10} {n:>7} x {engine:<7} {api:<22} {site}")
    return "\n".join(lines)


def _time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


# ----------------------------------------------------------------------------------- timelines

def _tracks(sched: Schedule):
    """(track name, start ns, duration ns, label) for each engine and DMA queue occupation."""
    for item in sched.items:
        label = f"{item.instr.api} {item.instr.site[0].rsplit('/', 1)[-1]}:{item.instr.site[1]}"
        if item.engine == DMA:
            for q in range(item.first_queue, item.first_queue + item.queues):
                yield f"DMA queue {q % sched.target.dma_engines:02d}", item.start, item.end - item.start, label
        else:
            yield item.engine, item.start, item.end - item.start, label


def chrome_trace(launches: list[tuple[str, Estimate]]) -> dict:
    """Chrome trace event format (loads in Perfetto and chrome://tracing): one process per launch
    and NeuronCore, one thread (track) per engine and DMA queue; times in microseconds."""
    events = []
    for pid, (name, est) in enumerate(launches):
        for core, sched in enumerate(est.schedules):
            process = pid * 8 + core
            events.append({"ph": "M", "pid": process, "name": "process_name",
                           "args": {"name": f"{name} core {core} ({est.label})"}})
            tids: dict[str, int] = {}
            for track, start, duration, label in _tracks(sched):
                tid = tids.get(track)
                if tid is None:
                    tid = tids[track] = _track_order(track)
                    events.append({"ph": "M", "pid": process, "tid": tid, "name": "thread_name",
                                   "args": {"name": track}})
                events.append({"ph": "X", "pid": process, "tid": tid, "name": label, "ts": start / 1e3,
                               "dur": duration / 1e3})
    summaries = [{"name": name, **{k: v for k, v in metrics(est).items() if k != "busy_ns"}} for name, est in launches]
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"note": "estimated device timeline from the nki-ops cost model, not a measurement",
                          "launches": summaries}}


def _track_order(track: str) -> int:
    if track in ENGINE_ORDER:
        return ENGINE_ORDER.index(track)
    return 10 + int(track.rsplit(" ", 1)[-1])


def timeline_png(launches: list[tuple[str, Estimate]], path: str) -> None:
    """A Gantt chart of the last launch's busiest core: one row per engine and DMA queue."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, est = launches[-1]
    sched = max(est.schedules, key=lambda s: s.makespan_ns)
    rows: dict[str, list] = defaultdict(list)
    for track, start, duration, _ in _tracks(sched):
        rows[track].append((start / 1e3, max(duration / 1e3, 1e-6)))
    order = sorted(rows, key=_track_order)
    colours = {"Tensor": "tab:red", "Vector": "tab:blue", "Scalar": "tab:green", "GpSimd": "tab:purple"}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.3 * len(order)))
    for y, track in enumerate(order):
        ax.broken_barh(rows[track], (y - 0.4, 0.8), facecolors=colours.get(track, "tab:orange"), linewidth=0)
    ax.set_yticks(range(len(order)), order)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(f"{name}: {_time(est.seconds)} ({est.label}; estimate, not a measurement)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
