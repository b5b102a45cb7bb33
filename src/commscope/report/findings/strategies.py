"""What the strategies put on the network and how: bytes, ops and burstiness in the comparison
group, placement inside vs across nodes, growth with the node count, and the synchronization
and temporal structure (bursty vs streaming, the critical path, the pipeline bubble)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.metrics.study import unshaped_rows
from commscope.report.findings._base import (
    RUN,
    STRATEGIES,
    SYNC,
    TEMPORAL,
    Finding,
    comparison_group,
    named,
    setup_words,
    without_replays,
)
from commscope.report.results import StudyResults
from commscope.units import fmt_bytes, fmt_count, fmt_ms


def _extremes(group: pd.DataFrame, column: str) -> tuple[Any, Any] | None:
    """The rows of ``group`` with the highest and the lowest ``column`` (None under 2 values)."""
    valid = group[group[column].notna()]
    if len(valid) < 2:
        return None
    ordered = valid.sort_values([column, "strategy"], ascending=[False, True])
    return ordered.iloc[0], ordered.iloc[-1]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "infinitely more than"


def volume_findings(results: StudyResults) -> list[Finding]:
    """Most/least bytes across nodes, messages per step and burstiness in the comparison group."""
    group = comparison_group(named(results.summary))
    if group.empty:
        return []
    setup = setup_words(group.iloc[0])
    out = []
    ext = _extremes(group, "internode_bytes_per_step")
    if ext:
        hi, lo = ext
        out.append(
            Finding(
                f"{hi['strategy']} sends the most bytes across nodes per step: "
                f"{fmt_bytes(hi['internode_bytes_per_step'])}, "
                f"{_ratio(hi['internode_bytes_per_step'], lo['internode_bytes_per_step'])} "
                f"{lo['strategy']}'s {fmt_bytes(lo['internode_bytes_per_step'])}, the least "
                f"({setup}, unshaped).",
                STRATEGIES,
            )
        )
    ext = _extremes(group, "messages_per_step")
    if ext:
        hi, lo = ext
        out.append(
            Finding(
                f"{hi['strategy']} issues the most communication ops: "
                f"{fmt_count(hi['messages_per_step'])} per step over all ranks, against "
                f"{fmt_count(lo['messages_per_step'])} for {lo['strategy']} ({setup}).",
                STRATEGIES,
            )
        )
    for col, scale in (("peak_to_mean_1ms", "1 ms"), ("peak_to_mean_10ms", "10 ms")):
        ext = _extremes(group, col) if col in group else None
        if ext:
            hi, lo = ext
            out.append(
                Finding(
                    f"At {scale} bins {hi['strategy']} is the burstiest on the wire (a node's "
                    f"peak rate {hi[col]:.1f}x its mean over the measured steps), "
                    f"{lo['strategy']} the steadiest ({lo[col]:.1f}x).",
                    STRATEGIES,
                )
            )
            break
    return out


def placement_findings(results: StudyResults) -> list[Finding]:
    """What placing a strategy's groups across nodes (``X-across``) changes against ``X``."""
    summary = named(results.summary)
    out: list[Finding] = []
    if summary.empty or "strategy" not in summary:
        return out
    keys = ["model", "nodes", "ranks_per_node", "bw", "delay", "loss", "cc"]
    keys = [k for k in keys if k in summary]
    for name in sorted(set(summary["strategy"])):
        across = f"{name}-across"
        if across not in set(summary["strategy"]):
            continue
        a = summary[summary["strategy"] == name].groupby(keys).mean(numeric_only=True)
        b = summary[summary["strategy"] == across].groupby(keys).mean(numeric_only=True)
        both = a.add_suffix("_in").join(b.add_suffix("_across"), how="inner")
        if both.empty:
            continue
        row = both.iloc[0]
        inter_in, inter_x = (
            row["internode_bytes_per_step_in"],
            row["internode_bytes_per_step_across"],
        )
        out.append(
            Finding(
                f"Placement matters: {across} (the same degrees as {name}, its inner group "
                f"across nodes) sends {fmt_bytes(inter_x)} across nodes per step against "
                f"{fmt_bytes(inter_in)}, and its step takes "
                f"{fmt_ms(row['step_time_mean_s_across'])} against "
                f"{fmt_ms(row['step_time_mean_s_in'])} "
                f"({row['step_time_mean_s_across'] / row['step_time_mean_s_in']:.2f}x).",
                STRATEGIES,
            )
        )
    return out


def scale_findings(results: StudyResults) -> list[Finding]:
    """How each strategy's unshaped step grows from the smallest node count to each larger one
    (same model and ranks per node): one sentence per larger count, every strategy that ran
    both, largest growth first."""
    summary = named(results.summary)
    if summary.empty or "bw_bps" not in summary:
        return []
    base = unshaped_rows(summary)
    if base.empty:
        return []
    grow: dict[tuple[Any, int, int], list[tuple[float, str]]] = {}
    for (strategy, model, _rpn), g in base.groupby(["strategy", "model", "ranks_per_node"]):
        steps = g.groupby("nodes")["step_time_mean_s"].mean()
        n0 = steps.index[0]
        if steps.iloc[0] <= 0:
            continue
        for n1, step in steps.iloc[1:].items():
            grow.setdefault((model, int(n0), int(n1)), []).append((step / steps.iloc[0], strategy))
    out = []
    for (model, n0, n1), rows in sorted(grow.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        rows.sort(key=lambda r: (-r[0], r[1]))
        listed = ", ".join(f"{strategy} {x:.2f}x" for x, strategy in rows)
        out.append(
            Finding(
                f"From {n0} to {n1} nodes ({model}, unshaped), the step grows by: {listed}.",
                RUN,
            )
        )
    return out


def structure_findings(results: StudyResults) -> list[Finding]:
    """Bursty vs streaming per strategy (unshaped cells, node 0's transmit side), where the
    critical path is most communication, and the measured pipeline bubble vs (p-1)/(p-1+m).
    The critical path and the bubble compare strategies: replays are in the temporal list only
    (they have findings of their own)."""
    sync = named(without_replays(results.table("sync_summary")))
    temporal = named(results.table("temporal_onoff"))
    out = []
    if not temporal.empty and "pattern" in temporal:
        tx = temporal[(temporal["direction"] == "tx") & (temporal["node"] == 0)]
        tx = unshaped_rows(tx)
        if not tx.empty:
            classes = tx.groupby("pattern")["strategy"].agg(lambda s: sorted(set(s)))
            parts = [
                f"{pattern}: {', '.join(names)}"
                for pattern, names in classes.items()
                if pattern in ("bursty", "streaming")
            ]
            if parts:
                out.append(
                    Finding(
                        "On the unshaped link, by the stated rule (on at least half the 100 µs "
                        "bins and a 10 ms CoV of at most 0.5 is streaming), "
                        + "; ".join(parts)
                        + ".",
                        TEMPORAL,
                    )
                )
    if not sync.empty and "critical_comm_share" in sync:
        base = unshaped_rows(sync)
        share = base.groupby("strategy")["critical_comm_share"].mean().dropna()
        if len(share) >= 2:
            hi, lo = share.idxmax(), share.idxmin()
            # A cell recorded before the capture kept waits walks every op: an upper bound.
            exact = "exposed_source" not in base or set(
                base[base["strategy"].isin([hi, lo])]["exposed_source"].astype(str)
            ) <= {"waits"}
            out.append(
                Finding(
                    f"Communication is {100 * share[hi]:.0f} % of {hi}'s critical path and "
                    f"{100 * share[lo]:.0f} % of {lo}'s (steady step, unshaped link"
                    f"{'' if exact else '; upper bound: traces without waits'}).",
                    SYNC,
                )
            )
        pp = sync[sync["bubble_measured_fwd_bwd"].notna() & sync["bubble_analytic"].notna()]
        pp = unshaped_rows(pp)
        if not pp.empty:
            # One entry per setup: repeats (and congestion controls) averaged.
            keys = [c for c in ("strategy", "model", "nodes", "ranks_per_node") if c in pp]
            pp = pp.groupby(keys, as_index=False)[
                ["bubble_measured_fwd_bwd", "bubble_analytic"]
            ].mean()
            parts = [
                f"{r['strategy']}{_where(r)} {100 * r['bubble_measured_fwd_bwd']:.0f} % "
                f"(analytic {100 * r['bubble_analytic']:.0f} %)"
                for r in pp.sort_values([c for c in ("strategy", "nodes") if c in pp]).to_dict(
                    "records"
                )
            ]
            out.append(
                Finding(
                    "Measured pipeline bubble (idle share of the forward/backward phase): "
                    + ", ".join(parts)
                    + ".",
                    SYNC,
                )
            )
    return out


def _where(row: dict[str, Any]) -> str:
    """`` on N x R`` (nodes x ranks per node) when the row says, else ''."""
    if "nodes" not in row or "ranks_per_node" not in row:
        return ""
    return f" on {int(row['nodes'])}x{int(row['ranks_per_node'])}"
