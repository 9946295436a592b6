"""Profiles from the cost model: a text report, a Chrome/Perfetto trace and a timeline PNG.

``nki_ops.sim.profile(kernel)(*args)`` runs the kernel in the simulator while the cost model listens
and returns a :class:`Profile`. Every figure is an estimate for the named target, not a measurement.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict

from ..core import trace
from ..core.config import configure
from .cost import DMA, TENSOR, Estimate, Schedule, estimate

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


def metrics(est: Estimate) -> dict:
    """Estimated time, busy time and utilisation per engine, MFU, HBM bandwidth utilisation."""
    sched = max(est.schedules, key=lambda s: s.makespan_ns)
    span = max(sched.makespan_ns, 1e-9)
    busy = sched.busy_ns()
    flops = 0.0
    hbm = 0
    for item in sched.items:
        instr = item.instr
        if item.engine == TENSOR and len(instr.srcs) >= 2 and instr.api.rsplit(".", 1)[-1] in ("matmul", "nc_matmul"):
            stationary, moving = instr.srcs[0], instr.srcs[1]
            flops += 2.0 * stationary.partitions * stationary.elements * moving.elements
        elif item.engine == DMA:
            hbm += sum(r.bytes for r in instr.srcs if r.space == "hbm")
            hbm += instr.dst.bytes if instr.dst.space == "hbm" else 0
    tgt = sched.target
    return {
        "target": est.target, "seconds": est.seconds, "instructions": len(sched.items),
        "hoisted": sum(item.hoisted for item in sched.items),
        "busy_ns": busy, "utilisation": {k: v / span for k, v in busy.items()},
        "mfu": flops / (span * 1e-9) / (tgt.bf16_tflops * 1e12),
        "hbm_utilisation": hbm / span / tgt.hbm_bytes_per_ns, "hbm_bytes": hbm, "flops": flops,
    }


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
    lines = [f"{name}: {_time(m['seconds'])} estimated device time ({est.label}; a cost-model estimate, not a "
             f"measurement) over {m['instructions']} instructions"
             + (f" ({m['hoisted']} loop-invariant: charged once)" if m["hoisted"] else "")]
    lines.append("  engine    busy        utilisation")
    for engine in ENGINE_ORDER:
        if engine in m["busy_ns"]:
            lines.append(f"  {engine:<8}  {_time(m['busy_ns'][engine] * 1e-9):<10}  {m['utilisation'][engine]:6.1%}")
    lines.append(f"  MFU {m['mfu']:.1%} of {sched.target.bf16_tflops:g} BF16 TFLOPS; HBM bandwidth "
                 f"{m['hbm_utilisation']:.1%} of {sched.target.hbm_bytes_per_ns:g} GB/s "
                 f"({m['hbm_bytes'] / 1e6:.2f} MB moved)")
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
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"note": "estimated device timeline from the nki-ops cost model, not a measurement"}}


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
