"""Costs of the collectives a training step runs, on the links each group really crosses.

AMPeD (Moolchandani et al., ISPASS 2023, Sec. III-C) splits every parallel group of degree
``n = n_intra * n_inter`` into the part inside a node (fast NVLink) and the part across nodes
(the per-GPU NIC). A ring collective over such a group is costed hierarchically: reduce-scatter
inside the node, the inter-node ring on the ``1/n_intra`` shard each GPU owns, all-gather inside
the node. Each function is plain arithmetic so it works on numbers, arrays and
:class:`~planner.model.algebra.Sig` symbols (see :mod:`planner.model.algebra`).
"""

from __future__ import annotations

from planner.model.algebra import gt1, remote_nodes, ring_share, steps


def allreduce(size, n_intra, n_inter, bw_intra, bw_inter, lat_intra, lat_inter):
    """Seconds for a hierarchical ring all-reduce of ``size`` bytes per GPU.

    Bandwidth term: ``2 (1 - 1/n_i) S / bw_i + 2 (1/n_i - 1/n) S / bw_o`` (the inter-node ring
    moves ``S / n_i`` per GPU, ``2 (n_o - 1) / n_o`` times); latency term:
    ``2 (n - n_o) lat_i + 2 (n_o - 1) lat_o``, the ``2 (n - 1)`` steps of NCCL's ring over all
    ``n = n_i n_o`` ranks, of which ``2 (n_o - 1)`` leave a node (NCCL's own latency model,
    src/graph/tuning.cc since 2.7.3: ``(nsteps - nInterSteps) intraLat + nInterSteps
    interLat``; its rings run through every GPU, so a group spread over many nodes pays an
    intra-node hop per GPU, not per node). A group of one costs nothing.
    Reduce-scatter plus all-gather (sequence parallelism, the distributed optimizer) move the
    same bytes in the same steps, so they share this formula.

    >>> round(allreduce(1e9, 8, 1, 300e9, 25e9, 0, 0), 6)   # 2 * 7/8 * 1 GB / 300 GB/s
    0.005833
    """
    # (1/n_i - 1/n) = (1/n_i) (n_o - 1)/n_o; every factor is kept non-negative
    return (2 * ring_share(n_intra) * size / bw_intra
            + 2 * (size / n_intra) * ring_share(n_inter) / bw_inter
            + ring_latency(n_intra, n_inter, lat_intra, lat_inter))


def ring_latency(n_intra, n_inter, lat_intra, lat_inter):
    """The latency of a ring all-reduce over ``n = n_i n_o`` ranks: ``2 (n - n_o) lat_i + 2 (n_o
    - 1) lat_o``. Written, where ``lat_o >= lat_i`` (every catalog GPU), as ``2 (n - 1) lat_i
    + 2 (n_o - 1) (lat_o - lat_i)``: the same number, as two terms of one degree product each,
    which the solvers' tables take more cheaply than the product ``(n_i - 1) n_o`` (measured:
    benchmarks/README.md, "Ring latency over every GPU")."""
    if lat_inter >= lat_intra:
        return (2 * steps(n_intra * n_inter) * lat_intra
                + 2 * steps(n_inter) * (lat_inter - lat_intra))
    return 2 * steps(n_intra) * n_inter * lat_intra + 2 * steps(n_inter) * lat_inter


def ring_step(size, n_inter, bw_intra, bw_inter, lat_intra, lat_inter):
    """Seconds for one point-to-point step of ``size`` bytes in a ring or a pipeline whose
    ``n_inter`` factor says whether it crosses nodes: a ring moves at the pace of its slowest
    hop, so any inter-node hop makes every step an inter-node step."""
    crosses = gt1(n_inter)
    return (size / bw_intra + lat_intra
            + crosses * (size / bw_inter + lat_inter - size / bw_intra - lat_intra))


def all_to_all(size, n_intra, n_inter, bw_intra, bw_inter, lat_intra, lat_inter):
    """Seconds for an all-to-all in which each GPU spreads ``size`` bytes evenly over the
    ``n = n_i * n_o`` ranks of its group (MoE token dispatch or combine): ``(n_i - 1) / n`` of
    it crosses NVLink and ``(n - n_i) / n = 1 - 1/n_o`` the NIC, one message per peer link.

    >>> round(all_to_all(8e9, 8, 1, 400e9, 50e9, 0, 0), 6)   # 7/8 of 8 GB over NVLink
    0.0175
    """
    return (size * steps(n_intra) / (n_intra * n_inter) / bw_intra
            + size * ring_share(n_inter) / bw_inter
            + steps(n_intra) * lat_intra + steps(n_inter) * lat_inter)


def dedup_all_to_all(size, experts, top_k, n_intra, n_inter, bw_intra, bw_inter, lat_intra,
                     lat_inter):
    """Seconds for the MoE dispatch (or combine) of a deduplicating dispatcher, DeepEP or
    HybridEP (Megatron-Core's flex dispatcher: "removes redundant tokens during cross-node
    communication", megatron/core/transformer/moe/README.md): ``size`` is the bytes of a GPU's
    ``top_k`` token copies, as :func:`all_to_all` takes them. Across nodes a token goes once to
    each remote node one of its experts sits on (to the GPU of the same local index there,
    :func:`~planner.model.algebra.remote_nodes` of them on average), then over NVLink to the
    experts' GPUs of that node, beside the copies for the sender's own node. The two parts are
    added (DeepEP runs them in one kernel: an upper bound).

    >>> round(dedup_all_to_all(8e9, 128, 8, 8, 1, 400e9, 50e9, 0, 0), 6)   # one node: all_to_all
    0.0175
    """
    return (size * steps(n_intra) / (n_intra * n_inter) / bw_intra
            + size * ring_share(n_inter) * ring_share(n_intra) / bw_intra
            + (size / top_k) * remote_nodes(n_inter, experts, top_k) / bw_inter
            + steps(n_intra) * lat_intra + steps(n_inter) * lat_inter)
