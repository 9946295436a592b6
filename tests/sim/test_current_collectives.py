"""``nki.collectives`` on the simulator: multi-rank launches (``nki.simulate_ranks``) of kernels written
here, checked against NumPy, and the errors for misuse."""

from __future__ import annotations

import time

import numpy as np
import pytest

from nki_ops.sim.core.errors import KernelUsageError, MemorySpaceError, UnsupportedError
from nki_ops.sim.frontends import current as nki

nl = nki.language
nisa = nki.isa
ncc = nki.collectives
ReplicaGroup = ncc.ReplicaGroup

pytestmark = pytest.mark.simulation
RNG = np.random.default_rng(11)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def hbm_copy(x, name):
    """A collective cannot touch the kernel's I/O tensors: stage through an internal HBM tensor."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name=name)
    nisa.dma_copy(dst=t, src=x)
    return t


@nki.jit
def hbm_collective(x, rg, kind: str, ranks: int):
    """One HBM collective of ``kind`` over ``rg``; ``ranks`` is the rank-list size."""
    src = hbm_copy(x, "src")
    rows = {"all_gather": x.shape[0] * ranks, "reduce_scatter": x.shape[0] // ranks}.get(kind, x.shape[0])
    dst = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm, name="dst")
    if kind == "all_reduce":
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.add)
    elif kind == "all_reduce_max":
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.maximum)
    elif kind == "all_gather":
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=rg, collective_dim=0)
    elif kind == "reduce_scatter":
        ncc.reduce_scatter(srcs=[src], dsts=[dst], replica_group=rg, collective_dim=0, op=nl.add)
    elif kind == "all_to_all":
        ncc.all_to_all(srcs=[src], dsts=[dst], replica_group=rg, collective_dim=0)
    out = nl.ndarray(dst.shape, dtype=dst.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def run(kind, xs, groups):
    ranks = len(xs)
    size = len(groups[0])
    return nki.simulate_ranks(hbm_collective, ranks, [{"x": x, "rg": ReplicaGroup(groups), "kind": kind,
                                                       "ranks": size} for x in xs])


def test_all_reduce_sums_each_rank_list_separately():
    xs = [rand(8, 16) for _ in range(4)]
    outs = run("all_reduce", xs, [[0, 1], [2, 3]])
    for r, out in enumerate(outs):
        group = [0, 1] if r < 2 else [2, 3]
        np.testing.assert_array_equal(out, xs[group[0]] + xs[group[1]])


def test_all_reduce_max_in_bfloat16():
    bf16 = nl.bfloat16
    xs = [rand(4, 8).astype(bf16) for _ in range(3)]
    outs = run("all_reduce_max", xs, [[0, 1, 2]])
    for out in outs:
        assert out.dtype == bf16
        np.testing.assert_array_equal(out, np.maximum(np.maximum(xs[0], xs[1]), xs[2]))


def test_all_gather_concatenates_in_rank_list_order():
    xs = [rand(4, 8) for _ in range(4)]
    outs = run("all_gather", xs, [[2, 0], [3, 1]])
    for r, out in enumerate(outs):
        group = [2, 0] if r in (0, 2) else [3, 1]
        np.testing.assert_array_equal(out, np.concatenate([xs[g] for g in group]))


def test_reduce_scatter_gives_each_rank_its_chunk_of_the_sum():
    xs = [rand(8, 4) for _ in range(4)]
    outs = run("reduce_scatter", xs, [[0, 1, 2, 3]])
    total = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, total[2 * r:2 * r + 2])


def test_all_to_all_exchanges_chunks():
    xs = [rand(4, 3) for _ in range(4)]
    outs = run("all_to_all", xs, [[0, 1, 2, 3]])
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.stack([xs[s][r] for s in range(4)]))


def test_one_input_dict_gives_every_rank_its_own_copy():
    x = rand(4, 8)
    before = x.copy()
    outs = nki.simulate_ranks(hbm_collective, 2, {"x": x, "rg": ReplicaGroup([[0, 1]]), "kind": "all_reduce",
                                                  "ranks": 2})
    np.testing.assert_array_equal(outs[1], before + before)
    np.testing.assert_array_equal(x, before)


@nki.jit
def sbuf_gather_tiles(x, rg, ranks: int):
    """The SBUF all-gather along the free dim, with M tiles split between the LNC programs."""
    m, k = x.shape
    out = nl.ndarray((m, k * ranks), dtype=x.dtype, buffer=nl.shared_hbm)
    tiles = m // 128 // nl.num_programs(0)
    for t in nl.affine_range(tiles):
        rows = slice((nl.program_id(0) * tiles + t) * 128, (nl.program_id(0) * tiles + t + 1) * 128)
        src = nl.ndarray((128, k), dtype=x.dtype, buffer=nl.sbuf)
        dst = nl.ndarray((128, k * ranks), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x[rows, :])
        ncc.all_gather(srcs=[src], dsts=[dst], replica_group=rg, collective_dim=1)
        nisa.dma_copy(dst=out[rows, :], src=dst)
    return out


def test_sbuf_all_gather_on_lnc2_programs_meet_their_counterparts():
    xs = [rand(256, 32) for _ in range(4)]
    rg = ReplicaGroup([[0, 1, 2, 3]])
    outs = nki.simulate_ranks(sbuf_gather_tiles[2], 4, [{"x": x, "rg": rg, "ranks": 4} for x in xs])
    for out in outs:
        np.testing.assert_array_equal(out, np.concatenate(xs, axis=1))


@nki.jit
def swap_pairs(x):
    src, dst = hbm_copy(x, "src"), hbm_copy(x, "dst")
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=[(0, 1), (1, 0), (2, 3), (3, 2)])
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_collective_permute_follows_the_pairs():
    xs = [rand(2, 8) for _ in range(4)]
    outs = nki.simulate_ranks(swap_pairs, 4, [{"x": x} for x in xs])
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, xs[r ^ 1])


@nki.jit
def ring_gather(x, rg, ranks: int):
    """All-gather through the ring: pass the chunk on ranks-1 times, placing each where the rank id
    of the data it holds says."""
    rows, cols = x.shape
    out = nl.ndarray((ranks, rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
    bufs = [hbm_copy(x, "ring0"), nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="ring1")]
    for i in range(ranks):
        holder = ncc.collective_permute_implicit_current_processing_rank_id(iteration_id=i, replica_group=rg)
        nisa.dma_copy(dst=out.ap(pattern=[[cols, rows], [1, cols]], scalar_offset=holder, indirect_dim=0),
                      src=bufs[i % 2])
        if i + 1 < ranks:
            ncc.collective_permute_implicit(srcs_by_channel=[[bufs[i % 2]]], dsts_by_channel=[[bufs[(i + 1) % 2]]],
                                            replica_group=rg)
    return out.reshape((ranks * rows, cols))


def test_collective_permute_implicit_is_a_ring_in_rank_list_order():
    xs = [rand(2, 4) for _ in range(4)]
    rg = ReplicaGroup([[3, 1, 0, 2]])
    outs = nki.simulate_ranks(ring_gather, 4, [{"x": x, "rg": rg, "ranks": 4} for x in xs])
    for out in outs:
        np.testing.assert_array_equal(out, np.concatenate(xs))


@nki.jit
def ring_reduce_step(a, b, rg):
    sa, sb = hbm_copy(a, "a"), hbm_copy(b, "b")
    dst = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm, name="dst")
    ncc.collective_permute_implicit_reduce(srcs0_by_channel=[[sa]], srcs1_by_channel=[[sb]], dsts_by_channel=[[dst]],
                                           replica_group=rg, op=nl.add)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_collective_permute_implicit_reduce_sends_the_reduced_sources():
    a, b = [rand(2, 4) for _ in range(3)], [rand(2, 4) for _ in range(3)]
    rg = ReplicaGroup([[0, 1, 2]])
    outs = nki.simulate_ranks(ring_reduce_step, 3, [{"a": a[r], "b": b[r], "rg": rg} for r in range(3)])
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, a[r - 1] + b[r - 1])


@nki.jit
def select_by_rank(table):
    _, rows, cols = table.shape
    out = nl.ndarray((rows, cols), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=table.ap(pattern=[[cols, rows], [1, cols]], scalar_offset=ncc.rank_id(),
                                        indirect_dim=0))
    return out


def test_rank_id_is_the_rank_of_the_launch():
    table = rand(4, 2, 3)
    outs = nki.simulate_ranks(select_by_rank, 4, {"table": table})
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(out, table[r])
    np.testing.assert_array_equal(select_by_rank(table), table[0])  # a plain launch is rank 0


@nki.jit
def variable(x, zeros, meta_in, rg, kind: str):
    """all_to_all_v or all_gather_v of flat buffers into a zeroed dst; returns dst and the metadata."""
    src, dst, meta = hbm_copy(x, "src"), hbm_copy(zeros, "dst"), hbm_copy(meta_in, "meta")
    collective = ncc.all_to_all_v if kind == "a2av" else ncc.all_gather_v
    collective(srcs=[src], dsts=[dst], replica_group=rg, metadata_tensor=meta)
    out, meta_out = (nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm) for t in (dst, meta))
    nisa.dma_copy(dst=out, src=dst)
    nisa.dma_copy(dst=meta_out, src=meta)
    return out, meta_out


def test_all_to_all_v_moves_counted_chunks_to_equal_slots():
    n, size, slot = 3, 12, 4
    xs = [rand(size) for _ in range(n)]
    counts = RNG.integers(0, slot + 1, (n, n))  # counts[s, r]: what s sends to r
    metas = []
    for s in range(n):
        displs = np.concatenate([[0], np.cumsum(counts[s])[:-1]])
        metas.append(np.stack([counts[s], displs, np.zeros(n)]).astype(np.uint32))
    rg = ReplicaGroup([list(range(n))])
    outs = nki.simulate_ranks(variable, n, [{"x": xs[r], "zeros": np.zeros(size, np.float32), "meta_in": metas[r],
                                             "rg": rg, "kind": "a2av"} for r in range(n)])
    for r, (out, meta) in enumerate(outs):
        expected = np.zeros(size, np.float32)
        for s in range(n):
            start = int(metas[s][1, r])
            expected[slot * s:slot * s + counts[s, r]] = xs[s][start:start + counts[s, r]]
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(meta[2], counts[:, r])  # row 2 reports what arrived
        np.testing.assert_array_equal(meta[:2], metas[r][:2])


def test_all_gather_v_broadcasts_one_chunk_per_rank_on_lnc2():
    n, size = 4, 8
    xs = [rand(2, 4) for _ in range(n)]
    metas = [np.array([[c] * n, [d] * n, [0] * n], np.uint32) for c, d in ((2, 0), (0, 3), (1, 7), (2, 5))]
    rg = ReplicaGroup([list(range(n))])
    outs = nki.simulate_ranks(variable[2], n, [{"x": xs[r], "zeros": np.zeros((n, size), np.float32),
                                                "meta_in": metas[r], "rg": rg, "kind": "agv"} for r in range(n)])
    expected = np.zeros((n, size), np.float32)
    for s in range(n):
        count, displ = int(metas[s][0, 0]), int(metas[s][1, 0])
        expected[s, :count] = xs[s].reshape(-1)[displ:displ + count]
    for out, meta in outs:
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(meta[2], [2, 0, 1, 2])


def test_variable_collectives_check_their_documented_limits():
    meta = np.array([[4, 4], [6, 0], [0, 0]], np.uint32)  # rank 0 sends 4 elements from offset 6 of 8
    inputs = {"x": rand(8), "zeros": np.zeros(8, np.float32), "meta_in": meta, "rg": ReplicaGroup([[0, 1]])}
    with pytest.raises(KernelUsageError, match=r"all_to_all_v: sending 4 elements at offset 6 leaves src 'src' "
                                               r"\(8 elements\)"):
        nki.simulate_ranks(variable, 2, {**inputs, "kind": "a2av"})
    with pytest.raises(KernelUsageError, match=r"all_gather_v: only LNC=2 is supported"):
        nki.simulate_ranks(variable, 2, {**inputs, "kind": "agv"})
    with pytest.raises(KernelUsageError, match=r"all_gather_v: each rank-list must have exactly 4 ranks"):
        nki.simulate_ranks(variable[2], 2, {**inputs, "kind": "agv"})


# ------------------------------------------------------------------------------- misuse

def test_ranks_disagreeing_on_shapes_is_an_error():
    with pytest.raises(KernelUsageError, match=r"all_reduce: ranks disagree on collective #0 of rank-list \[0, 1\]: "
                                               r"rank \d called all_reduce\(op=add, srcs=\[\[\d, 8\] float32\]\)"):
        run("all_reduce", [rand(4, 8), rand(2, 8)], [[0, 1]])


def test_rank_in_no_rank_list_is_an_error():
    with pytest.raises(KernelUsageError, match=r"rank 2 is in no rank-list of replica_group \[\[0, 1\]\]"):
        run("all_reduce", [rand(2, 2) for _ in range(3)], [[0, 1]])


def test_group_beyond_the_launch_names_simulate_ranks():
    with pytest.raises(KernelUsageError, match=r"names rank 1, but the launch has 1 rank; run the kernel as several "
                                               r"ranks with nki.simulate_ranks\(kernel, ranks=2"):
        hbm_collective(rand(2, 2), ReplicaGroup([[0, 1]]), "all_reduce", 2)


@nki.jit
def uneven(x, rg):
    src, dst = hbm_copy(x, "src"), hbm_copy(x, "dst")
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.add)
    if ncc.rank_id().value == 0:
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.add)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_rank_that_finished_without_joining_is_reported_at_once():
    start = time.monotonic()
    with pytest.raises(KernelUsageError, match=r"rank\(s\) \[1\] finished without joining collective #1 of "
                                               r"rank-list \[0, 1\]"):
        nki.simulate_ranks(uneven, 2, {"x": rand(2, 2), "rg": ReplicaGroup([[0, 1]])})
    assert time.monotonic() - start < 10


@nki.jit
def crossed(x, first, second):
    src, dst = hbm_copy(x, "src"), hbm_copy(x, "dst")
    a, b = (first, second) if ncc.rank_id().value == 0 else (second, first)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=a, op=nl.add)
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=b, op=nl.add)
    return dst


def test_crossed_collectives_are_a_deadlock_error():
    # the same two ranks as two rank-lists (the order differs), entered in opposite orders
    first, second = ReplicaGroup([[0, 1]]), ReplicaGroup([[1, 0]])
    with pytest.raises(KernelUsageError, match=r"deadlock, every rank waits for another: rank 0 waits in "
                                               r"nki.collectives.all_reduce #0 on rank-list \[0, 1\]; rank 1 waits"):
        nki.simulate_ranks(crossed, 2, {"x": rand(2, 2), "first": first, "second": second})


@nki.jit
def slow_rank(x, rg):
    src, dst = hbm_copy(x, "src"), hbm_copy(x, "dst")
    if ncc.rank_id().value == 1:
        time.sleep(1)  # a rank computing for longer than the collective timeout
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.add)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_a_rank_that_computes_long_is_waited_for(monkeypatch):
    monkeypatch.setenv("NKI_OPS_SIM_COLLECTIVE_TIMEOUT", "0.3")
    xs = [rand(2, 2) for _ in range(2)]
    outs = nki.simulate_ranks(slow_rank, 2, [{"x": x, "rg": ReplicaGroup([[0, 1]])} for x in xs])
    np.testing.assert_array_equal(outs[0], xs[0] + xs[1])


@nki.jit
def barrier_cycle(x, rg):
    """Rank 0's program 0 and rank 1's program 1 enter the collective; their partners wait for them in
    core barriers, so the programs the collective needs never come."""
    src, dst = hbm_copy(x, "src"), hbm_copy(x, "dst")
    if (ncc.rank_id().value, nl.program_id(0)) in ((0, 0), (1, 1)):
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=rg, op=nl.add)
    else:
        nisa.core_barrier()
    return src


def test_a_hang_through_lnc_barriers_times_out(monkeypatch):
    monkeypatch.setenv("NKI_OPS_SIM_COLLECTIVE_TIMEOUT", "0.3")
    start = time.monotonic()
    with pytest.raises(KernelUsageError, match=r"every program has been blocked for 0.3 s \(in collectives or waiting "
                                               r"for its LNC partner in nisa.core_barrier/sendrecv\): .*rank 0 "
                                               r"\(program 1\) waits for its LNC partner"):
        nki.simulate_ranks(barrier_cycle[2], 2, {"x": rand(2, 2), "rg": ReplicaGroup([[0, 1]])})
    assert time.monotonic() - start < 10


@nki.jit
def on_arguments(x, rg):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_reduce(srcs=[x], dsts=[out], replica_group=rg, op=nl.add)
    return out


def test_collective_on_a_kernel_argument_is_an_error():
    with pytest.raises(KernelUsageError, match=r"srcs\[0\] 'x' is a kernel argument; a collective instruction cannot "
                                               r"read or write the kernel's I/O tensors"):
        nki.simulate_ranks(on_arguments, 2, {"x": rand(2, 2), "rg": ReplicaGroup([[0, 1]])})


@nki.jit
def misuse(x, rg, case: str):
    src = hbm_copy(x, "src")
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    if case == "mixed":
        ncc.all_reduce(srcs=[src], dsts=[tile], replica_group=rg, op=nl.add)
    elif case == "op":
        ncc.all_reduce(srcs=[src], dsts=[hbm_copy(x, "dst")], replica_group=rg, op=nl.multiply)
    elif case == "dim":
        ncc.all_gather(srcs=[src], dsts=[hbm_copy(x, "dst")], replica_group=rg, collective_dim=1)
    elif case == "shape":
        ncc.all_gather(srcs=[src], dsts=[hbm_copy(x, "dst")], replica_group=rg, collective_dim=0)
    elif case == "coalesced_sbuf":
        ncc.all_reduce(srcs=[tile, tile], dsts=[tile, tile], replica_group=rg, op=nl.add)
    elif case == "all_to_all_sbuf":
        ncc.all_to_all(srcs=[tile], dsts=[tile], replica_group=rg, collective_dim=0)
    elif case == "group":
        ncc.all_reduce(srcs=[src], dsts=[src], replica_group=[[0, 1]], op=nl.add)
    elif case == "unknown":
        ncc.all_reduce_v(srcs=[src], dsts=[src], replica_group=rg)
    return src


@pytest.mark.parametrize("case, error, message", [
    ("mixed", MemorySpaceError, r"all_reduce: tensors must all be on HBM or all on SBUF, not mixed"),
    ("op", KernelUsageError, r"all_reduce: op must be nl.add, nl.minimum or nl.maximum, got 'multiply'"),
    ("dim", KernelUsageError, r"all_gather: collective_dim must be 0 for HBM tensors, got 1"),
    ("shape", KernelUsageError, r"all_gather: dst 'dst' has shape \[2, 2\]; with 2 ranks and src 'src' of shape "
                                r"\[2, 2\] it must be \[4, 2\]"),
    ("coalesced_sbuf", KernelUsageError, r"several tensors in one collective \(coalesced\) need HBM tensors"),
    ("all_to_all_sbuf", MemorySpaceError, r"all_to_all: tensors must be on HBM"),
    ("group", KernelUsageError, r"replica_group must be a nki.collectives.ReplicaGroup, got list"),
    ("unknown", UnsupportedError, r"not supported by the simulator: nki.collectives.all_reduce_v"),
])
def test_misuse_messages(case, error, message):
    with pytest.raises(error, match=message):
        nki.simulate_ranks(misuse, 2, {"x": rand(2, 2), "rg": ReplicaGroup([[0, 1]]), "case": case})


@nki.jit
def in_place(x, rg):
    buf = hbm_copy(x, "buf")
    ncc.all_reduce(srcs=[buf], dsts=[buf], replica_group=rg, op=nl.add)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=buf)
    return out


def test_in_place_hbm_collective_runs_on_lnc1_and_is_refused_on_lnc2():
    xs = [rand(2, 4) for _ in range(2)]
    inputs = [{"x": x, "rg": ReplicaGroup([[0, 1]])} for x in xs]
    for out in nki.simulate_ranks(in_place, 2, inputs):
        np.testing.assert_array_equal(out, xs[0] + xs[1])
    with pytest.raises(UnsupportedError, match=r"not supported by the simulator: nki.collectives.all_reduce in place "
                                               r"\(dst 'buf' overlaps src 'buf'\) on HBM under LNC2"):
        nki.simulate_ranks(in_place[2], 2, inputs)


def test_replica_group_rank_lists_must_not_overlap():
    with pytest.raises(KernelUsageError, match=r"rank-lists must not overlap"):
        ReplicaGroup([[0, 1], [1, 2]])
