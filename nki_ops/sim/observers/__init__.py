"""Observers of the simulator's instruction record (``core.trace``).

``cost``: the NeuronCore cost model (per-instruction cycles for a target, list scheduling over
engines and DMA queues, the makespan); ``profile``: reports, Chrome/Perfetto traces and timeline
PNGs built on that schedule, and ``nki_ops.sim.profile(kernel)(*args)``. Observers read the record;
the core knows nothing of them.
"""
