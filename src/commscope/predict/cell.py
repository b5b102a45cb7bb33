"""The predictor in the pipeline: per cell, predict one steady step and compare with the trace
(bytes and messages exactly; step time with the alpha-beta model fed by measured bandwidths)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.bench.analysis import cap_bytes_per_s, delay_scaled, link_alpha_beta
from commscope.cell.timeline import step_blocked_ns
from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import P2P_OPS, SWEEP_AXES
from commscope.metrics import step_times
from commscope.predict.compare import compare_measured
from commscope.predict.ops import predict_ops
from commscope.predict.timing import (
    effective_bandwidth,
    last_arrival_ns,
    op_times,
    predict_step_time,
)
from commscope.spec.link import UNSHAPED
from commscope.spec.settings import CellSettings

TIMING_COLUMNS = [
    "cell", *SWEEP_AXES, "bandwidth_source", "intranode_source", "compute_source",
    "compute_flops_per_s", "op_overhead_s", "critical_rank", "predicted_step_s",
    "predicted_compute_s",
    "predicted_comm_s", "predicted_bubble_s", "predicted_comm_ratio", "predicted_bubble_ratio",
    "bubble_ratio_analytical", "predicted_tp_s", "predicted_pp_s", "predicted_dp_s",
    "predicted_ep_s", "predicted_emb_s", "measured_step_s", "measured_steps",
    "measured_comm_ratio", "time_error",
]  # fmt: skip


def predict_cell(
    *,
    cell_json: Path,
    ops: Path,
    steps: Path,
    model_spec: dict[str, Any],
    plan_spec: dict[str, Any],
    warmup_steps: int,
    out_ops: Path,
    out_compare: Path,
    out_timing: Path,
    fit_paths: Sequence[Path] = (),
) -> pd.DataFrame:
    """Predict the cell's ops per rank for one steady step; compare with the measured ops.

    Reads the parsed cell (``cell_json``, the ``ops`` and ``steps`` tables). Writes ``out_ops``
    (the prediction) and ``out_compare`` (per rank, measured step and traffic type: predicted vs
    measured bytes and messages, ``match``), both carrying the cell's parameters, and
    ``out_timing`` (:func:`predict_timing`, fed by the microbenchmark fits in ``fit_paths`` when
    given); returns the comparison.
    """
    meta = json.loads(Path(cell_json).read_text())
    params = meta["params"]  # as recorded: the tables carry these values unchanged
    cell = CellSettings.from_mapping(params)
    # The backend the cell ran: its algorithms put the predicted ops on the wire and time them.
    backend = meta.get("backend") or DEFAULT_BACKEND
    plan_spec = _as_recorded(plan_spec, meta.get("plan"))
    pred = predict_ops(model_spec, plan_spec, cell.nodes, cell.ranks_per_node, backend=backend)
    measured = pd.read_parquet(ops)
    compare = compare_measured(pred, measured, model_spec, plan_spec, warmup_steps=warmup_steps)
    step_rows = pd.read_parquet(steps)
    fits = pd.concat([pd.read_parquet(p) for p in fit_paths]) if fit_paths else None
    timing = predict_timing(pred, measured, step_rows, cell, warmup_steps, fits, backend=backend)
    write_prediction(meta, pd.DataFrame(pred), compare, timing, out_ops, out_compare, out_timing)
    return compare


def write_prediction(
    meta: dict[str, Any],
    pred: pd.DataFrame,
    compare: pd.DataFrame,
    timing: pd.DataFrame,
    out_ops: Path,
    out_compare: Path,
    out_timing: Path,
) -> None:
    """predict_cell's three tables, each led by the cell (``meta``: its cell.json) and its sweep
    values as recorded, to their files (timing in :data:`TIMING_COLUMNS`' order)."""
    for frame in (pred, compare, timing):
        frame.insert(0, "cell", meta["cell"])
        for axis in SWEEP_AXES:
            frame[axis] = meta["params"][axis]
    for path in (out_ops, out_compare, out_timing):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    pred.to_parquet(out_ops, index=False)
    compare.to_parquet(out_compare, index=False)
    timing[TIMING_COLUMNS].to_parquet(out_timing, index=False)


def _as_recorded(plan_spec: dict[str, Any], recorded: dict[str, Any] | None) -> dict[str, Any]:
    """The strategy with the DDP bucket cap the cell's trainer recorded (``cell.json``'s plan).

    A strategy without ``bucket_cap_mb`` means PyTorch's default buckets, but a cell recorded
    before that rule passed 25 MiB explicitly (every bucket, the first too, at 25 MiB) and is
    not rerun for a code change: the recorded plan says which DDP ran.
    """
    if recorded is None or "bucket_cap_mb" not in recorded:
        return plan_spec
    return {**plan_spec, "bucket_cap_mb": recorded["bucket_cap_mb"]}


def rank_step_split(ops: pd.DataFrame, steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    """Per rank and steady step: the rank's step time (``step_s``), the time it was blocked in
    communication (``comm_s``: the union of its blocked intervals in the step,
    :func:`~commscope.cell.timeline.step_blocked_ns`, the sync tables' ``exposed_comm_s``) and
    the rest, its compute (``compute_s``; the one definition, docs/traces.md).

    Compute that overlapped an asynchronous op (DDP's bucket all-reduces under the backward)
    counts as compute where the trace recorded the waits; without waits every op counts as
    blocking from issue to completion, so ``compute_s`` is a lower bound there."""
    split = step_blocked_ns(ops, steps)
    split = split[split["step"] >= warmup_steps].reset_index(drop=True)
    step_ns = (split["t_end_ns"] - split["t_start_ns"]).to_numpy("int64")
    out = pd.DataFrame(
        {
            "rank": split["rank"].astype("int64"),
            "step": split["step"].astype("int64"),
            "step_s": step_ns / 1e9,
            "comm_s": split["blocked_ns"].to_numpy("int64") / 1e9,
        }
    )
    out["compute_s"] = out["step_s"] - out["comm_s"]
    return out


AlphaBeta = dict[str, tuple[float, float]]  # op -> (alpha per ring step in s, beta in B/s)


@dataclass(frozen=True)
class CellLinks:
    """What the alpha-beta model knows of one cell's links, and where each value came from.

    ``ab_internode``/``ab_intranode`` are the microbenchmark's per-op fits (None without fits;
    empty when no fit matches the link), ``beta_internode``/``beta_intranode`` the scalar
    bandwidths (B/s) for ops the fits do not name.
    """

    bandwidth_source: str
    intranode_source: str
    beta_internode: float
    beta_intranode: float
    ab_internode: AlphaBeta | None = None
    ab_intranode: AlphaBeta | None = None

    def model_terms(
        self,
    ) -> tuple[float, float, None, AlphaBeta | None, AlphaBeta | None]:
        """The link arguments of :func:`~commscope.predict.timing.op_times` and
        :func:`~commscope.predict.timing.predict_step_time` after ``alpha_s``: the scalar
        betas, no per-traffic betas, the per-op fits."""
        return (
            self.beta_internode,
            self.beta_intranode,
            None,
            self.ab_internode,
            self.ab_intranode,
        )


def cell_links(
    ops: pd.DataFrame,
    cell: CellSettings,
    fits: pd.DataFrame | None,
    backend: str = DEFAULT_BACKEND,
) -> CellLinks:
    """The cell's link model (see :func:`predict_timing`): the microbenchmark fits of its link
    setting and of the unshaped one when ``fits`` has rows (for a delay that was not
    benchmarked, the fit at another delay scaled linearly in the delay,
    :func:`~commscope.bench.analysis.delay_scaled`), else the trace's effective bandwidth (wire
    bytes of ``backend``'s algorithms), else the configured cap."""
    link = cell.link
    inter = intra = None
    if fits is not None and not fits.empty:
        inter = link_alpha_beta(fits, link)
        intra = link_alpha_beta(fits, UNSHAPED)
        bw_source = f"microbench {link.id}" if inter else "microbench (no fit for link)"
        if not inter:  # a delay that was not benchmarked: scale the one that was
            inter, ref = delay_scaled(fits, link)
            if inter:
                bw_source = f"microbench {ref}, scaled to delay {link.delay}"
        intra_source = f"microbench {UNSHAPED.id}" if intra else "same as internode"
        intra = intra or inter
    else:
        bw_source, intra_source = "trace effective bandwidth", "trace effective bandwidth"
    eff = effective_bandwidth(ops, cell.ranks_per_node, backend=backend)
    cap = cap_bytes_per_s(link.bw)
    fallback = math.inf if math.isnan(cap) else cap
    beta_inter = eff["internode"] if math.isfinite(eff["internode"]) else fallback
    beta_intra = eff["intranode"] if math.isfinite(eff["intranode"]) else beta_inter
    return CellLinks(bw_source, intra_source, beta_inter, beta_intra, inter, intra)


def predict_timing(
    pred: pd.DataFrame,
    ops: pd.DataFrame,
    steps: pd.DataFrame,
    cell: CellSettings,
    warmup_steps: int,
    fits: pd.DataFrame | None = None,
    backend: str | None = None,
) -> pd.DataFrame:
    """Predicted vs measured step time of one cell (one row, :data:`TIMING_COLUMNS` but
    ``cell`` and the sweep axes, which :func:`predict_cell` adds as the cell recorded them).

    Bandwidth (:func:`cell_links`): with ``fits`` (microbenchmark ``fit.parquet`` rows), per-op
    alpha and beta of the cell's link setting for ops that cross nodes, and of the unshaped
    setting for ops inside a node (ranks of one node talk over loopback, at least as fast as an
    unshaped veth; the cell's own link when no unshaped fit exists). Without fits: the cell's
    own effective bandwidth from its trace (:func:`effective_bandwidth`, alpha 0), else the cap.
    Compute: the achieved FLOP rate of each rank in this run, its predicted FLOPs over its
    measured compute time, step time not blocked in communication (:func:`rank_step_split`;
    medians over steady steps; :func:`rank_compute_rates`), so the time error measures the
    communication and bubble model, not a guessed rate; ranks that synchronise run at the
    slowest one's pace, so a rank slowed by a shared core sets the step (``compute_flops_per_s``
    reports the slowest rate). Per collective, the host's fixed cost the trace shows beyond the
    alpha-beta time (:func:`collective_overhead_s`, column ``op_overhead_s``). A P2P message
    counts once, at its receiver (``p2p_once`` of :func:`predict_step_time`). Measured step:
    median over steady steps of first rank in to last rank out.
    """
    backend = backend or DEFAULT_BACKEND
    links = cell_links(ops, cell, fits, backend)
    split = rank_step_split(ops, steps, warmup_steps)
    per_rank = split.groupby("rank")[["compute_s", "comm_s", "step_s"]].median()
    rates = rank_compute_rates(pred.attrs["predict"]["flops"], per_rank["compute_s"])
    overhead = collective_overhead_s(ops, cell, links, warmup_steps, backend)
    t = predict_step_time(
        pred,
        rates,
        0.0,
        *links.model_terms(),
        backend,
        op_overhead_s=overhead,
        p2p_once=True,
        ddp_overlap=True,
        uneven_stages=True,
    )
    row = dict(
        bandwidth_source=links.bandwidth_source,
        intranode_source=links.intranode_source,
        compute_source="trace: each rank's step time not blocked in communication",
        compute_flops_per_s=min(rates.values()) if rates else math.inf,
        op_overhead_s=overhead,
        critical_rank=t["critical_rank"],
        predicted_step_s=t["step_time_s"],
        predicted_compute_s=t["compute_s"],
        predicted_comm_s=t["comm_s"],
        predicted_bubble_s=t["bubble_s"],
        predicted_comm_ratio=t["comm_ratio"],
        predicted_bubble_ratio=t["bubble_ratio"],
        bubble_ratio_analytical=t["bubble_ratio_analytical"],
        **{f"predicted_{k}_s": v for k, v in t["comm_by_traffic_s"].items()},
        **measured_step(steps, warmup_steps, per_rank, t["step_time_s"]),
    )
    return pd.DataFrame([row])


def rank_compute_rates(flops: dict[int, float], compute_s: pd.Series) -> dict[int, float]:
    """Each rank's achieved FLOP rate: its predicted FLOPs over its measured compute seconds
    (``compute_s`` by rank, :func:`rank_step_split`'s medians). A rank without measured compute
    (none recorded, or none left after its blocked time) takes the rate of all ranks together,
    the predicted FLOPs of all over their compute; infinite when nothing was measured."""
    measured = compute_s.clip(lower=0)
    total = float(measured.sum())
    pooled = sum(flops.values()) / total if total > 0 else math.inf
    out = {}
    for rank, f in flops.items():
        c = float(measured.get(rank, 0.0))
        out[rank] = f / c if c > 0 and f > 0 else pooled
    return out


def collective_overhead_s(
    ops: pd.DataFrame,
    cell: CellSettings,
    links: CellLinks,
    warmup_steps: int,
    backend: str = DEFAULT_BACKEND,
) -> float:
    """The fixed cost per collective on this cell's host beyond its alpha-beta time (s, >= 0).

    For each collective of a steady step that ran alone on its rank (:func:`_concurrent`), the
    duration on the rank that issued it last (from then on no rank waits for another's compute)
    minus the op's alpha-beta time under ``links`` (:func:`~commscope.predict.timing.op_times`);
    the median over them. On a host whose cores the ranks share, the peer's communication thread
    must be scheduled beside the compute of other ranks: milliseconds per op that a
    microbenchmark on an otherwise idle host does not see. Ops in flight together (DDP's bucket
    all-reduces, which gloo's two worker threads run at once, sharing the link, under the
    backward) are left out: their durations include each other's transfer.
    0 without a synchronous collective. Measured from the ops' records, not from the step."""
    steady = ops[(ops["step"] >= warmup_steps) & ops["t_end_ns"].notna()]
    steady = steady[~steady["op"].isin(P2P_OPS)]
    steady = steady[~_concurrent(steady)]
    if steady.empty or "seq" not in steady.columns:
        return 0.0
    last = steady[steady["t_issue_ns"] == last_arrival_ns(steady)]
    last = last.drop_duplicates(["group_ranks", "seq", "step"])
    table = last[["op", "bytes", "group_ranks", "group_size", "rank", "peer"]].assign(traffic="")
    table.attrs["predict"] = {"ranks_per_node": cell.ranks_per_node, "backend": backend}
    ab = op_times(table, 0.0, *links.model_terms(), backend)
    dur = (last["t_end_ns"].astype("float64") - last["t_issue_ns"].astype("float64")) / 1e9
    return max(0.0, float((dur - ab).median()))


def _concurrent(ops: pd.DataFrame) -> pd.Series:
    """Whether each op's span (issue to end) meets another op's span on the same rank."""
    out = pd.Series(False, index=ops.index)
    for _, rank_ops in ops.groupby("rank"):
        order = rank_ops.sort_values("t_issue_ns")
        issue = order["t_issue_ns"].to_numpy("float64")
        end = order["t_end_ns"].astype("float64").to_numpy()
        ended_before = np.maximum.accumulate(np.concatenate([[-np.inf], end[:-1]]))
        next_issue = np.concatenate([issue[1:], [np.inf]])
        out.loc[order.index] = (issue < ended_before) | (end > next_issue)
    return out


def median_step_s(steps: pd.DataFrame, warmup_steps: int) -> float:
    """A cell's step as the timing table measures it: the median over its steady steps of
    first rank in to last rank out (:func:`~commscope.metrics.step_times`); NaN without one."""
    table = step_times(steps, warmup_steps)
    steady = table[~table["warmup"]]
    return float(steady["duration_s"].median()) if len(steady) else math.nan


def measured_step(
    steps: pd.DataFrame, warmup_steps: int, per_rank: pd.DataFrame, predicted_s: float
) -> dict[str, Any]:
    """The measured columns of the timing row: median steady step (first rank in to last rank
    out), how many steps, the slowest rank's communication ratio and the prediction's error."""
    table = step_times(steps, warmup_steps)
    steady = table[~table["warmup"]]
    measured = float(steady["duration_s"].median()) if len(steady) else math.nan
    crit = per_rank["step_s"].idxmax() if len(per_rank) else None
    comm_ratio = (
        float(per_rank.loc[crit, "comm_s"] / per_rank.loc[crit, "step_s"])
        if crit is not None
        else math.nan
    )
    return {
        "measured_step_s": measured,
        "measured_steps": len(steady),
        "measured_comm_ratio": comm_ratio,
        "time_error": (predicted_s - measured) / measured if measured > 0 else math.nan,
    }


def timing_table(timing_paths: Sequence[Path]) -> pd.DataFrame:
    """Every cell's ``timing.parquet`` in one table (one row per cell), for the report."""
    frames = [pd.read_parquet(p) for p in timing_paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=TIMING_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def comparison_table(compare_paths: list[Path]) -> pd.DataFrame:
    """One row per cell and traffic type: bytes and messages per steady step (all ranks),
    predicted vs measured, and whether every rank and step matched exactly."""
    frames = [pd.read_parquet(p) for p in compare_paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    compare = pd.concat(frames, ignore_index=True)
    per_step = compare.groupby(["cell", "strategy", "model", "traffic", "step"], as_index=False)[
        ["predicted_bytes", "measured_bytes", "predicted_msgs", "measured_msgs"]
    ].sum()
    table = per_step.groupby(["cell", "strategy", "model", "traffic"], as_index=False).agg(
        predicted_bytes=("predicted_bytes", "first"),
        measured_bytes=("measured_bytes", "mean"),
        predicted_msgs=("predicted_msgs", "first"),
        measured_msgs=("measured_msgs", "mean"),
    )
    exact = compare.groupby(["cell", "traffic"])["match"].all().rename("exact").reset_index()
    return table.merge(exact, on=["cell", "traffic"])
