"""``nki.collectives``: collective communication between ranks (logical NeuronCores), run as several
ranks with ``nki.simulate_ranks``. The signatures are the API reference's (NKI 0.6 / Neuron 2.29+);
the rendezvous, the checks and what each collective computes are the core's (``core.collectives``).
"""

from __future__ import annotations

from ...core import collectives as core
from ...core.collectives import ReplicaGroup
from ...core.errors import refuse_unknown
from .isa.registers import VirtualRegister, register_value

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all", "all_to_all_v",
           "collective_permute",
           "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id", "rank_id"]


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """Every member's dsts[i] = op over the members' srcs[i]."""
    core.all_reduce("nki.collectives.all_reduce", srcs, dsts, replica_group, op, priority)


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Every member's dsts[i] = the members' srcs[i] concatenated along ``collective_dim`` in rank-list order."""
    core.all_gather("nki.collectives.all_gather", srcs, dsts, replica_group, collective_dim, priority)


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """Member j's dsts[i] = op over the members' srcs[i], chunk j of ``collective_dim`` (split evenly)."""
    core.reduce_scatter("nki.collectives.reduce_scatter", srcs, dsts, replica_group, collective_dim, op, priority)


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Member j's dsts[i] = chunk j of every member's srcs[i] (split along ``collective_dim``),
    concatenated in rank-list order."""
    core.all_to_all("nki.collectives.all_to_all", srcs, dsts, replica_group, collective_dim, priority)


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None):
    """Each member sends ``src[send_displs[r] : + send_counts[r]]`` (flat elements) to rank-list position
    r; the chunk from position s lands at ``recv_displs[s]`` (row 3), else at ``dst.size / n * s``."""
    core.all_to_all_v("nki.collectives.all_to_all_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known,
                      has_rdispls, priority)


def all_gather_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None):
    """Each member broadcasts ``src[send_displ : + send_count]`` (row 0/1, first column; flat elements);
    the chunk from rank-list position s lands at ``dst.size / n * s``."""
    core.all_gather_v("nki.collectives.all_gather_v", srcs, dsts, replica_group, metadata_tensor, recv_counts_known,
                      has_rdispls, priority)


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """For each (source, target) pair, the source rank's src lands in the target rank's dst."""
    core.collective_permute("nki.collectives.collective_permute", srcs, dsts, source_target_pairs, priority)


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None,
                                name=None):
    """Each member sends its sources to the next in its rank-list (a ring) and receives the previous one's."""
    core.collective_permute_implicit("nki.collectives.collective_permute_implicit", srcs_by_channel, dsts_by_channel,
                                     replica_group, channel_ids, priority)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op,
                                       channel_ids=(0,), priority=None, name=None):
    """Each member sends op(srcs0, srcs1) to the next in its rank-list and receives the previous one's."""
    core.collective_permute_implicit_reduce("nki.collectives.collective_permute_implicit_reduce", srcs0_by_channel,
                                            srcs1_by_channel, dsts_by_channel, replica_group, op, channel_ids, priority)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0, name=None):
    """The rank whose data a ring step ``iteration_id`` holds: this rank at 0, then its predecessors."""
    api = "nki.collectives.collective_permute_implicit_current_processing_rank_id"
    return VirtualRegister(core.processing_rank(api, iteration_id, replica_group, channel_id, register_value))


def rank_id(name=None):
    """This rank's id in the launch, in a register."""
    return VirtualRegister(core.this_rank("nki.collectives.rank_id"))


__getattr__ = refuse_unknown("nki.collectives")
