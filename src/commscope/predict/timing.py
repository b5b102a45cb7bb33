"""Step time from predicted ops: an alpha-beta model per op, computation from FLOPs, and the
pipeline bubble, after seed 002 §5 (Eq. 1-9) generalised to any plan.

Per op, on its rank: ``time = steps * alpha + wire_bytes / beta``. ``wire_bytes`` and ``steps``
are those of the algorithm the cell's backend runs, from :mod:`commscope.collectives.ring` (the
same traffic model as :func:`commscope.collectives.traffic.op_destinations`): the
bandwidth-optimal rings NCCL uses for large messages, and for gloo what gloo really runs
(reduce_scatter as a full all-reduce, broadcast as a binomial tree):

============== ===================== ========= ===========================
op             wire bytes per rank   steps     gloo
============== ===================== ========= ===========================
allreduce      2(n-1)/n S            2(n-1)
reduce_scatter (n-1)/n S (S = input) n-1       2(n-1)/n S, 2(n-1) steps
allgather      (n-1) S (S = shard)   n-1
alltoall       (n-1)/n S             n-1
broadcast      S                     n-1       ceil(log2 n) S and steps
send, recv     S                     1
============== ===================== ========= ===========================

``beta`` is the inter-node bandwidth when the group (or the P2P pair) spans nodes, else the
intra-node one; ``beta_by_traffic`` overrides it per traffic type, as seed 002's C_TP, C_PP and
C_DP (effective bandwidths measured per traffic type). As in Eq. 3, a rank's P2P time counts
both its sends and its receives.

Step time per rank, without overlap of communication and computation (DeepSpeed's PTD-P does not
overlap the DP all-reduce, §5.1; commscope's DDP does, so this is an upper bound there):

* no pipeline: ``T = T_comp + sum of all op times``;
* pipeline (Eq. 5-6): per micro-batch ``T_mb = (T_comp + T_TP + T_PP + T_EP) / m`` for all the
  rank's stages; ``T_bubble = (p-1)/v * T_mb`` (v = stages per rank, 1 for GPipe and 1F1B);
  ``T = m T_mb + T_bubble + T_DP + T_emb``.

The step takes as long as the slowest rank (the DP all-reduce and the pipeline synchronise
them); ratios are reported for that rank.

For a cell measured on a shared host (:func:`commscope.predict.cell.predict_timing`), options
add what the host does: a compute rate per rank, a fixed cost per collective
(``op_overhead_s``), DDP's buckets under the backward (``ddp_overlap``,
:func:`ddp_exposed_s`) and each P2P message once (``p2p_once``); their defaults keep the
equations above (docs/microbench.md, "Predicted step time").

Per-op parameters: ``ab_internode`` / ``ab_intranode`` map an op to ``(alpha_step_s, beta_Bps)``
as fitted by the microbenchmark (:func:`commscope.bench.analysis.link_alpha_beta`: alpha per
ring step, beta against the ring wire bytes above); ops they do not name use the scalar
``alpha_s`` and betas. Precedence for beta: ``beta_by_traffic``, then the op's fit, then the
scalar of its locality.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from commscope.collectives.ring import RING_STEPS, latency_steps, wire_bytes
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import P2P_OPS, parse_ranks

__all__ = [
    "RING_STEPS",
    "bubble_fraction",
    "effective_bandwidth",
    "op_times",
    "predict_step_time",
    "wire_bytes",
]


def _crosses_nodes(group_ranks: str, rank: int, peer: int, rpn: int) -> bool:
    members = [peer] if peer >= 0 else parse_ranks(group_ranks)
    return any(m // rpn != rank // rpn for m in members)


def _backend(pred: pd.DataFrame, backend: str | None) -> str:
    """The backend whose algorithms time the ops: the argument, else the prediction's own."""
    return str(backend or pred.attrs.get("predict", {}).get("backend") or DEFAULT_BACKEND)


AlphaBetaByOp = dict[str, tuple[float, float]]
# Ops the microbenchmark does not run, timed with the parameters of one it does.
_FIT_OF = {"barrier": "allreduce", "reduce": "reduce_scatter", "gather": "allgather"}


def op_times(
    pred: pd.DataFrame,
    alpha_s: float,
    beta_Bps_internode: float,
    beta_Bps_intranode: float,
    beta_by_traffic: dict[str, float] | None = None,
    ab_internode: AlphaBetaByOp | None = None,
    ab_intranode: AlphaBetaByOp | None = None,
    backend: str | None = None,
    op_overhead_s: float = 0.0,
) -> pd.Series:
    """Seconds each predicted op takes on its rank under the alpha-beta model of ``backend``'s
    algorithms (per-op ``ab_*`` fits where given, see the module docstring). ``backend``
    defaults to ``pred.attrs["predict"]["backend"]``, else NCCL's rings.

    ``op_overhead_s`` is a fixed cost added to every collective (not to send and recv): what a
    collective costs on a busy host beyond its wire time (the peer's threads being scheduled,
    the framework's per-call work), which a microbenchmark on an idle host does not see; 0 keeps
    the pure alpha-beta model."""
    rpn = int(pred.attrs["predict"]["ranks_per_node"])
    backend = _backend(pred, backend)
    keys = ["op", "bytes", "group_ranks", "group_size", "rank", "peer", "traffic"]
    uniq = pred[keys].drop_duplicates()
    times = {}
    for key in uniq.itertuples(index=False, name=None):
        op, nbytes, group, n, rank, peer, traffic = key
        cross = _crosses_nodes(group, rank, peer, rpn)
        alpha, beta = alpha_s, beta_Bps_internode if cross else beta_Bps_intranode
        fits = ab_internode if cross else ab_intranode
        fit = (fits or {}).get(op) or (fits or {}).get(_FIT_OF.get(op, ""))
        if fit is not None:
            alpha, beta = fit
        if beta_by_traffic and traffic in beta_by_traffic:
            beta = beta_by_traffic[traffic]
        steps = latency_steps(op, int(n), backend)
        fixed = 0.0 if op in P2P_OPS else op_overhead_s
        times[key] = steps * alpha + wire_bytes(op, nbytes, int(n), backend) / beta + fixed
    return pd.Series(
        [times[k] for k in pred[keys].itertuples(index=False, name=None)], index=pred.index
    )


def bubble_fraction(pp: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """Analytical bubble ratio: b / (m + b) with b = (p-1)/v, i.e. Eq. 7's (p-1)/(m+p-1) for
    GPipe and 1F1B and the interleaved schedule's bubble shrunk v-fold."""
    if pp <= 1:
        return 0.0
    b = (pp - 1) / max(stages_per_rank, 1)
    return b / (microbatches + b)


def predict_step_time(
    pred: pd.DataFrame,
    compute_flops_per_s: float | Mapping[int, float],
    alpha_s: float,
    beta_Bps_internode: float,
    beta_Bps_intranode: float,
    beta_by_traffic: dict[str, float] | None = None,
    ab_internode: AlphaBetaByOp | None = None,
    ab_intranode: AlphaBetaByOp | None = None,
    backend: str | None = None,
    op_overhead_s: float = 0.0,
    p2p_once: bool = False,
    ddp_overlap: bool = False,
    uneven_stages: bool = False,
) -> dict[str, Any]:
    """Step time, communication ratio and bubble ratio of a :func:`predict_ops` result.

    ``ab_internode`` / ``ab_intranode``: per-op (alpha per ring step, beta) fits that take
    precedence over the scalar ``alpha_s`` and betas (see :func:`op_times`); ``backend`` picks
    the algorithms (gloo's differ from NCCL's rings, :mod:`commscope.collectives.ring`);
    ``op_overhead_s`` a fixed cost per collective (:func:`op_times`).

    ``compute_flops_per_s`` is the achieved rate (seed 002: mu x peak, mu = 0.3-0.4), one for
    all ranks or one per rank (a rank missing from the mapping takes the slowest given): ranks
    that synchronise every step run at the pace of the slowest, so a host where one rank
    computes slower than another (a shared core) is timed by that rank's rate, not the mean.

    ``p2p_once``: a P2P message costs its transfer once on the pipeline's path, at the
    receiver (the sender's post returns, or waits for the receiver, whose schedule the bubble
    already counts); False counts both a rank's sends and its receives, as seed 002's Eq. 3.

    ``ddp_overlap``: DDP's bucket all-reduces run under the rest of the backward
    (:func:`ddp_exposed_s`); False adds them whole, as PTD-P (the module docstring).

    ``uneven_stages``: a rank's bubble is the other stages' time, not ``p - 1`` times its own:
    the pipeline fills and drains through every other stage, so with stages of unequal speed
    the slowest waits ``(p * mean - own) / (v m)`` of the in-pipeline times (the mean over all
    ranks standing for the rank's pipeline); equal stages give Eq. 6's ``(p-1)/v * T_mb``.
    Returns ``step_time_s`` (slowest rank), ``critical_rank``, ``compute_s``, ``comm_s`` and
    ``comm_by_traffic_s`` (that rank's op times), ``bubble_s``, ``comm_ratio`` (comm / step),
    ``bubble_ratio`` (bubble / step), ``bubble_ratio_analytical`` (:func:`bubble_fraction`)
    and ``per_rank`` (a DataFrame with every rank's terms).
    """
    meta = pred.attrs["predict"]
    plan = meta["plan"]
    pipelined = plan["pp"] > 1
    m = int(meta["microbatches"])
    v = int(plan["stages_per_rank"]) if pipelined else 1
    df = pred.assign(
        time_s=op_times(
            pred,
            alpha_s,
            beta_Bps_internode,
            beta_Bps_intranode,
            beta_by_traffic,
            ab_internode,
            ab_intranode,
            backend,
            op_overhead_s,
        )
    )
    if p2p_once:
        df = df[df["op"] != "send"]
    comm = df.pivot_table(index="rank", columns="traffic", values="time_s", aggfunc="sum")
    ranks = sorted(meta["flops"])
    comm = comm.reindex(index=ranks, columns=["tp", "pp", "dp", "ep", "emb"], fill_value=0.0)
    comm = comm.fillna(0.0)
    per_rank = comm.add_prefix("t_").reset_index()
    per_rank["t_comp"] = [meta["flops"][r] / rate for r, rate in _rates(compute_flops_per_s, ranks)]
    per_rank["t_comm"] = comm.sum(axis=1).to_numpy()
    if ddp_overlap and not pipelined and plan.get("dp_kind", "ddp") == "ddp":
        buckets = df[(df["traffic"] == "dp") & (df["phase"] == "bwd")]
        per_rank["t_dp"] = [
            ddp_exposed_s(buckets[buckets["rank"] == r], comp)
            if (buckets["rank"] == r).any()
            else dp
            for r, comp, dp in zip(ranks, per_rank["t_comp"], per_rank["t_dp"], strict=True)
        ]
        per_rank["t_comm"] = per_rank[[f"t_{t}" for t in ("tp", "pp", "dp", "ep", "emb")]].sum(
            axis=1
        )
    if pipelined:
        in_pipeline = per_rank["t_comp"] + per_rank["t_tp"] + per_rank["t_pp"] + per_rank["t_ep"]
        if uneven_stages:
            # fill and drain wait for the other stages' micro-batches: p * mean - own
            others = plan["pp"] * in_pipeline.mean() - in_pipeline
            per_rank["t_bubble"] = others.clip(lower=0) / v / m
        else:
            per_rank["t_bubble"] = (plan["pp"] - 1) / v * in_pipeline / m
    else:
        per_rank["t_bubble"] = 0.0
    per_rank["t_step"] = per_rank["t_comp"] + per_rank["t_comm"] + per_rank["t_bubble"]
    crit = per_rank.loc[int(np.argmax(per_rank["t_step"].to_numpy()))]
    step = float(crit["t_step"])
    return {
        "step_time_s": step,
        "critical_rank": int(crit["rank"]),
        "compute_s": float(crit["t_comp"]),
        "comm_s": float(crit["t_comm"]),
        "comm_by_traffic_s": {t: float(crit[f"t_{t}"]) for t in ("tp", "pp", "dp", "ep", "emb")},
        "bubble_s": float(crit["t_bubble"]),
        "comm_ratio": float(crit["t_comm"]) / step if step else 0.0,
        "bubble_ratio": float(crit["t_bubble"]) / step if step else 0.0,
        "bubble_ratio_analytical": bubble_fraction(plan["pp"], m, v) if pipelined else 0.0,
        "per_rank": per_rank,
    }


# Backward FLOPs are twice the forward's: the backward is 2/3 of a step's compute.
BACKWARD_SHARE = 2 / 3


def ddp_exposed_s(buckets: pd.DataFrame, compute_s: float) -> float:
    """Seconds one rank waits for DDP's bucket all-reduces (``buckets``: its dp ops of the
    backward with their ``time_s``, ``bytes`` and ``seq``) when they overlap the backward.

    A bucket is all-reduced as soon as its gradients exist; gradients appear in proportion to
    their bytes over the backward (``BACKWARD_SHARE`` of ``compute_s``), so once the first
    bucket is issued, the rest of the backward (its share 1 - first / all bytes) can hide the
    transfers. The last bucket is issued when the backward ends and is never hidden:
    ``max(t_last, sum(t) - hidden window)``."""
    ordered = buckets.sort_values("seq")
    total = float(ordered["time_s"].sum())
    if ordered.empty or total <= 0:
        return total
    nbytes = ordered["bytes"].astype("float64")
    window = BACKWARD_SHARE * compute_s * (1 - float(nbytes.iloc[0]) / float(nbytes.sum()))
    return max(float(ordered["time_s"].iloc[-1]), total - window)


def _rates(rate: float | Mapping[int, float], ranks: list[int]) -> list[tuple[int, float]]:
    """Each rank's compute rate: the scalar, or the rank's own, else the slowest given."""
    if not isinstance(rate, Mapping):
        return [(r, float(rate)) for r in ranks]
    slowest = min(rate.values()) if rate else float("inf")
    return [(r, float(rate.get(r, slowest))) for r in ranks]


def effective_bandwidth(
    ops: pd.DataFrame,
    ranks_per_node: int,
    min_bytes: int = 1 << 20,
    include_p2p: bool = False,
    backend: str = DEFAULT_BACKEND,
) -> dict[str, float]:
    """Median effective bandwidth (wire bytes / op duration, B/s) of measured ops of at
    least ``min_bytes``, split into ``internode`` and ``intranode`` by whether the op's group
    spans nodes; NaN where no op qualifies. Feeds :func:`predict_step_time` with what the
    cluster actually achieved (seed 002's C values), not the link's nominal rate.

    P2P ops are left out unless ``include_p2p``: a recv's (and gloo's polled send's) duration
    includes waiting for the peer's compute, which seed 002 counts as bubble, not transfer. A
    collective's duration runs from the last member's issue (:func:`last_arrival_ns`): before
    it, the first ranks wait for the others' compute, not for the wire."""
    done = ops[ops["t_end_ns"].notna() & (ops["bytes"] >= min_bytes) & (ops["step"] >= 0)]
    if not include_p2p:
        done = done[~done["op"].isin(P2P_OPS)]
    out = {"internode": float("nan"), "intranode": float("nan")}
    if done.empty:
        return out
    start = last_arrival_ns(done).astype("float64")
    dur = (done["t_end_ns"].astype("float64") - start) / 1e9
    wire = [
        wire_bytes(o, b, int(n), backend)
        for o, b, n in zip(done["op"], done["bytes"], done["group_size"], strict=True)
    ]
    cross = [
        _crosses_nodes(g, int(r), int(p), ranks_per_node)
        for g, r, p in zip(done["group_ranks"], done["rank"], done["peer"], strict=True)
    ]
    bw = pd.DataFrame({"bw": np.asarray(wire) / dur.to_numpy(), "cross": cross})
    bw = bw[np.isfinite(bw["bw"]) & (bw["bw"] > 0)]
    for cross_nodes, key in ((True, "internode"), (False, "intranode")):
        sel = bw.loc[bw["cross"] == cross_nodes, "bw"]
        if len(sel):
            out[key] = float(sel.median())
    return out


def last_arrival_ns(ops: pd.DataFrame) -> pd.Series:
    """Per recorded op, when the last member of its collective issued it (ns): the latest
    ``t_issue_ns`` among the rows of one instance (same ``group_ranks``, ``seq`` and ``step``;
    a collective's ranks number their calls on a group alike), or the op's own issue where the
    table has no ``seq`` or the op is a send or recv (a pair, not a collective)."""
    own = ops["t_issue_ns"]
    if "seq" not in ops.columns or "group_ranks" not in ops.columns:
        return own
    coll = ~ops["op"].isin(P2P_OPS)
    last = ops[coll].groupby(["group_ranks", "seq", "step"])["t_issue_ns"].transform("max")
    return own.where(~coll, last.reindex(ops.index))
