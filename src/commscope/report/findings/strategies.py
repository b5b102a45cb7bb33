"""What the strategies put on the network and how: bytes, ops and burstiness in the comparison
group, placement inside vs across nodes, growth with the node count, and the synchronization
and temporal structure (bursty vs streaming, the critical path, the pipeline bubble)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.metrics.study import baseline_rows, ratio_ci
from commscope.report.findings._base import (
    RUN,
    STRATEGIES,
    SYNC,
    TEMPORAL,
    Finding,
    Spread,
    comparison_cells,
    comparison_group,
    kept,
    left_out,
    lost_in,
    named,
    ordering,
    setup_words,
    without_replays,
)
from commscope.report.results import StudyResults
from commscope.units import fmt_bytes, fmt_count, fmt_ms

# The timescale the on/off finding speaks at: 1 ms resolves a frame at every cap of 12 Mbit/s
# and above and holds a 10-100 ms step's phases apart (docs/analysis.md).
ONOFF_FINDING_MS = 1.0


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
    """Most/least bytes across nodes and messages per step in the comparison group (counts: the
    same every run, so no interval), and the payload's burstiness over timescales."""
    summary, dropped = kept(results, "summary")
    group = comparison_group(named(summary), results.reference)
    if group.empty:
        return []
    first = group.iloc[0]
    setup = setup_words(first)
    # The cells this comparison lost (its setup's host-limited cells on the reference link).
    dropped = lost_in(results, True, **{c: first[c] for c in ("model", "nodes", "ranks_per_node")})
    note = left_out(dropped)
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
                f"({setup}, {_on(results)}; counted, the same every run){note}.",
                STRATEGIES,
                question="volume",
            )
        )
    ext = _extremes(group, "messages_per_step")
    if ext:
        hi, lo = ext
        out.append(
            Finding(
                f"{hi['strategy']} issues the most communication ops: "
                f"{fmt_count(hi['messages_per_step'])} per step over all ranks, against "
                f"{fmt_count(lo['messages_per_step'])} for {lo['strategy']} ({setup}){note}.",
                STRATEGIES,
                question="volume",
            )
        )
    out += _burstiness(results, summary, dropped)
    return out


def _per_cell_tx(results: StudyResults, summary: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The temporal_bursts rows of the comparison group's cells (transmit side, resolved,
    replays named), each cell's burstiest node per width, and the setup in words."""
    bursts, _ = kept(results, "temporal_bursts")
    cells = comparison_cells(named(summary), results.reference)
    if bursts.empty or cells.empty or "cell" not in bursts:
        return pd.DataFrame(), ""
    tx = named(bursts[bursts["cell"].isin(set(cells["cell"])) & (bursts["direction"] == "tx")])
    tx = tx[tx["resolved"].astype(bool)]
    if tx.empty:
        return tx, ""
    # A cell's burstiest node at each width (its nodes send alike or the burstiest sets the pace).
    worst = tx.sort_values("peak_to_mean", ascending=False, na_position="last")
    return worst.groupby(["cell", "bin_ms"], as_index=False).first(), setup_words(cells.iloc[0])


def _width(ms: float) -> str:
    return f"{ms * 1000:g} µs" if ms < 1 else f"{ms:g} ms"


def _burstiness(results: StudyResults, summary: pd.DataFrame, dropped: int) -> list[Finding]:
    """Peak/mean of the transmitted payload at each timescale (docs/analysis.md), which
    strategy is the burstiest at each, and whether that holds over the timescales and runs."""
    tx, setup = _per_cell_tx(results, summary)
    if tx.empty or tx["strategy"].nunique() < 2:
        return []
    widths = sorted(set(tx["bin_ms"]))
    parts, leaders, unsettled = [], [], []
    for width in widths:
        at = tx[tx["bin_ms"] == width]
        spreads = {s: Spread.of(g["peak_to_mean"]) for s, g in at.groupby("strategy")}
        spreads = {s: v for s, v in spreads.items() if v.n}
        if len(spreads) < 2:
            continue
        ranked = sorted(spreads, key=lambda s: (-spreads[s].mean, s))
        parts.append(
            f"{_width(width)}: " + ", ".join(f"{s} {spreads[s].mean:.1f}x" for s in ranked)
        )
        leaders.append((width, ranked[0]))
        if ordering(spreads[ranked[0]], spreads[ranked[1]]):
            unsettled.append(width)
    if not parts:
        return []
    names = {name for _, name in leaders}
    if len(names) == 1:
        verdict = f"{leaders[0][1]} is the burstiest at every timescale"
    else:
        verdict = (
            "the burstiest strategy changes with the timescale ("
            + ", ".join(f"{name} at {_width(w)}" for w, name in leaders)
            + ")"
        )
    runs = max(Spread.of(g["peak_to_mean"]).n for _, g in tx.groupby(["strategy", "bin_ms"]))
    if unsettled:
        verdict += (
            f"; at {', '.join(_width(w) for w in unsettled)} the lead is not established "
            f"({'one run each' if runs == 1 else 'the 95 % intervals over runs overlap'})"
        )
    return [
        Finding(
            "Burstiness over timescales (peak/mean of a node's transmitted payload per bin, "
            f"the burstier node; {setup}, {_on(results)}): "
            + "; ".join(parts)
            + f". {verdict[0].upper()}{verdict[1:]}"
            + left_out(dropped)
            + ".",
            TEMPORAL,
            question="temporal structure",
        )
    ]


def _onoff(results: StudyResults, summary: pd.DataFrame, dropped: int) -> list[Finding]:
    """On/off periods and the payload share in bursts at :data:`ONOFF_FINDING_MS`, per strategy
    in the comparison group (docs/analysis.md)."""
    tx, setup = _per_cell_tx(results, summary)
    if tx.empty:
        return []
    at = tx[tx["bin_ms"] == ONOFF_FINDING_MS]
    if at["strategy"].nunique() < 2:
        return []
    cols = ["on_fraction", "on_ms_median", "on_ms_p90", "off_ms_median", "off_ms_p90"]
    mean = at.groupby("strategy")[[*cols, "burst_byte_share"]].mean()
    runs = at.groupby("strategy").size()
    parts = []
    for name, r in mean.sort_values("on_fraction", ascending=False).iterrows():
        off = (
            f", off {r['off_ms_median']:.3g} ms (p90 {r['off_ms_p90']:.3g})"
            if pd.notna(r["off_ms_median"])
            else ", never off between on periods"
        )
        parts.append(
            f"{name} on {100 * r['on_fraction']:.0f} % of bins in periods of "
            f"{r['on_ms_median']:.3g} ms (p90 {r['on_ms_p90']:.3g}){off}, "
            f"{100 * r['burst_byte_share']:.0f} % of its payload in bursts"
        )
    n = int(runs.max())
    return [
        Finding(
            f"On/off at {_width(ONOFF_FINDING_MS)} (a bin is on when it carries a full frame's "
            f"payload, pure ACKs never; a burst bin also carries over twice the mean; {setup}, "
            f"{_on(results)}, node transmit medians and 90th percentiles): "
            + "; ".join(parts)
            + f" ({'one run each' if n == 1 else f'mean of up to {n} runs'}){left_out(dropped)}.",
            TEMPORAL,
            question="temporal structure",
        )
    ]


def placement_findings(results: StudyResults) -> list[Finding]:
    """What placing a strategy's groups across nodes (``X-across``) changes against ``X``, in
    one setup and link, with the step's interval over runs."""
    summary, dropped = kept(results, "summary")
    summary = named(summary)
    out: list[Finding] = []
    if summary.empty or "strategy" not in summary:
        return out
    keys = ["model", "nodes", "ranks_per_node", "bw", "delay", "loss", "cc"]
    keys = [k for k in keys if k in summary]
    for name in sorted(set(summary["strategy"])):
        across = f"{name}-across"
        if across not in set(summary["strategy"]):
            continue
        a = summary[summary["strategy"] == name].groupby(keys)
        b = summary[summary["strategy"] == across].groupby(keys)
        common = sorted(set(a.groups) & set(b.groups), key=str)
        if not common:
            continue
        key = common[0]
        ga, gb = a.get_group(key), b.get_group(key)
        sa, sb = Spread.of(ga["step_time_mean_s"]), Spread.of(gb["step_time_mean_s"])
        inter_in = ga["internode_bytes_per_step"].mean()
        inter_x = gb["internode_bytes_per_step"].mean()
        row = dict(zip(keys, key, strict=True))
        out.append(
            Finding(
                f"Placement ({setup_words(row)}, {_link(row)}): {across} (the same degrees as "
                f"{name}, its inner group across nodes) sends {fmt_bytes(inter_x)} across "
                f"nodes per step against {fmt_bytes(inter_in)} (counted), and its step takes "
                f"{fmt_ms(sb.mean)} ({sb.interval_in(fmt_ms)}) against {fmt_ms(sa.mean)} "
                f"({sa.interval_in(fmt_ms)}), "
                f"{sb.mean / sa.mean:.2f}x{ordering(sb, sa)}"
                f"{left_out(lost_in(results, **row, strategy={name, across}))}.",
                STRATEGIES,
                question="placement and scale",
            )
        )
    return out


def _on(results: StudyResults) -> str:
    """Where the comparison's cells ran, in words: ``unshaped``, or ``on the reference link
    (1 Gbit/s)`` when the study has one (their baseline link either way)."""
    reference = results.reference
    return "unshaped" if reference is None else f"on {reference.words}"


def _link(row: dict[str, Any]) -> str:
    return "unshaped" if str(row.get("bw", "none")) == "none" else f"cap {row['bw']}"


def scale_findings(results: StudyResults) -> list[Finding]:
    """How each strategy's step on the reference link (unshaped without one) grows from the
    smallest node count to each larger one (same model and ranks per node): one sentence per
    (model, ranks per node, larger count), every strategy that ran both, largest growth first,
    with the growth's interval over runs."""
    summary, dropped = kept(results, "summary")
    summary = named(summary)
    if summary.empty or "bw_bps" not in summary:
        return []
    base = baseline_rows(summary, results.reference)
    if base.empty:
        return []
    grow: dict[tuple[Any, int, int, int], list[tuple[float, str, float, float]]] = {}
    for (strategy, model, rpn), g in base.groupby(["strategy", "model", "ranks_per_node"]):
        steps = {n: h["step_time_mean_s"].to_numpy("float64") for n, h in g.groupby("nodes")}
        counts = sorted(steps)
        n0 = counts[0]
        if steps[n0].mean() <= 0:
            continue
        for n1 in counts[1:]:
            low, high = ratio_ci(steps[n1], steps[n0])
            ratio = steps[n1].mean() / steps[n0].mean()
            key = (model, int(rpn), int(n0), int(n1))
            grow.setdefault(key, []).append((ratio, strategy, low, high))
    out = []
    for (model, rpn, n0, n1), rows in sorted(grow.items(), key=lambda kv: kv[0][1:]):
        rows.sort(key=lambda r: (-r[0], r[1]))
        listed = ", ".join(
            f"{strategy} {x:.2f}x" + (f" (95 % CI {lo:.2f}-{hi:.2f}x)" if pd.notna(lo) else "")
            for x, strategy, lo, hi in rows
        )
        verdict = ""
        if len(rows) >= 2:
            (_, _, lo0, _), (_, _, _, hi1) = rows[0], rows[1]
            if not (pd.notna(lo0) and pd.notna(hi1) and lo0 > hi1):
                why = (
                    "no interval: fewer than 2 runs on a side"
                    if pd.isna(lo0) or pd.isna(hi1)
                    else "their 95 % intervals overlap"
                )
                verdict = f"; the order of the first two is not established ({why})"
        rpn_words = f"{rpn} rank{'' if rpn == 1 else 's'} per node"
        lost = lost_in(results, True, model=model, ranks_per_node=rpn, nodes={n0, n1})
        out.append(
            Finding(
                f"From {n0} to {n1} nodes ({model}, {rpn_words}, {_on(results)}), the step "
                "grows by: "
                f"{listed}{verdict}"
                f"{left_out(lost)}.",
                RUN,
                question="placement and scale",
            )
        )
    return out


def structure_findings(results: StudyResults) -> list[Finding]:
    """On/off periods per strategy, where the critical path is most communication, how much of
    its communication each strategy's compute hid (the measured overlap), and the measured
    pipeline bubble vs (p-1)/(p-1+m), in the comparison group's setup. The critical path, the
    overlap and the bubble compare strategies: replays are in the temporal list only (they
    have findings of their own)."""
    summary, _ = kept(results, "summary")
    cells = comparison_cells(named(summary), results.reference)
    dropped = 0
    if not cells.empty:
        first = cells.iloc[0]
        dropped = lost_in(
            results, True, **{c: first[c] for c in ("model", "nodes", "ranks_per_node")}
        )
    out = _onoff(results, summary, dropped)
    sync, _ = kept(results, "sync_summary")
    sync = named(without_replays(sync))
    pp_cells = sync[sync["bubble_measured_fwd_bwd"].notna()] if "cell" in sync else sync.iloc[:0]
    dropped_sync = lost_in(results, True, strategy=set(pp_cells.get("strategy", [])))
    if sync.empty or cells.empty:
        return out
    setup = setup_words(cells.iloc[0])
    note = left_out(dropped)
    mine = sync[sync["cell"].isin(set(cells["cell"]))] if "cell" in sync else sync.iloc[:0]
    if "critical_comm_share" in mine:
        spreads = _by_strategy(mine, "critical_comm_share")
        if len(spreads) >= 2:
            hi, lo = spreads[0], spreads[-1]
            # A cell recorded before the capture kept waits walks every op: an upper bound.
            exact = "exposed_source" not in mine or set(
                mine[mine["strategy"].isin([hi[0], lo[0]])]["exposed_source"].astype(str)
            ) <= {"waits"}
            out.append(
                Finding(
                    f"Communication is {100 * hi[1].mean:.0f} % of {hi[0]}'s critical path "
                    f"({_pct_interval(hi[1])}) and {100 * lo[1].mean:.0f} % of {lo[0]}'s "
                    f"({_pct_interval(lo[1])}; steady step, {setup}, {_on(results)}"
                    f"{'' if exact else '; upper bound: traces without waits'})"
                    f"{ordering(hi[1], lo[1])}{note}.",
                    SYNC,
                    question="synchronisation",
                )
            )
    if "comm_overlap" in mine:
        spreads = _by_strategy(mine, "comm_overlap")
        if len(spreads) >= 2:
            listed = ", ".join(
                f"{name} {100 * v.mean:.0f} % ({_pct_interval(v)})" for name, v in spreads
            )
            out.append(
                Finding(
                    "Overlap measured (the share of the time a strategy's communication was in "
                    "flight that its ranks computed instead of waiting, 1 - blocked / in "
                    f"flight; {setup}, {_on(results)}): {listed}"
                    f"{ordering(spreads[0][1], spreads[-1][1])}{note}.",
                    SYNC,
                    question="synchronisation",
                )
            )
    pp = sync[sync["bubble_measured_fwd_bwd"].notna() & sync["bubble_analytic"].notna()]
    pp = baseline_rows(pp, results.reference)
    if not pp.empty:
        # One entry per setup: repeats (and congestion controls) averaged.
        keys = [c for c in ("strategy", "model", "nodes", "ranks_per_node") if c in pp]
        pp = pp.groupby(keys, as_index=False)[["bubble_measured_fwd_bwd", "bubble_analytic"]].mean()
        parts = [
            f"{r['strategy']}{_where(r)} {100 * r['bubble_measured_fwd_bwd']:.0f} % "
            f"(analytic {100 * r['bubble_analytic']:.0f} %)"
            for r in pp.sort_values([c for c in ("strategy", "nodes") if c in pp]).to_dict(
                "records"
            )
        ]
        out.append(
            Finding(
                "Measured pipeline bubble (idle share of the forward/backward phase, "
                f"{_on(results)}): " + ", ".join(parts) + f"{left_out(dropped_sync)}.",
                SYNC,
                question="synchronisation",
            )
        )
    return out


def _by_strategy(table: pd.DataFrame, column: str) -> list[tuple[str, Spread]]:
    """Each strategy's :class:`Spread` of ``column`` over its cells, highest mean first."""
    spreads = [(name, Spread.of(g[column])) for name, g in table.groupby("strategy")]
    spreads = [(name, v) for name, v in spreads if v.n]
    return sorted(spreads, key=lambda kv: (-kv[1].mean, kv[0]))


def _pct_interval(v: Spread) -> str:
    """A share's interval over runs in percent, within 0-100 %: the t interval of a mean of
    shares can reach past them (fsdp's overlap, 0 % in three runs, read '-0-0 %')."""
    if pd.isna(v.low):
        return "one run" if v.n == 1 else f"{v.n} runs"
    low, high = 100 * max(v.low, 0.0), 100 * min(v.high, 1.0)
    return f"95 % CI {low:.0f}-{high:.0f} %, {v.n} runs"


def _where(row: dict[str, Any]) -> str:
    """`` (model) on N x R`` (nodes x ranks per node) when the row says, else ''."""
    if "nodes" not in row or "ranks_per_node" not in row:
        return ""
    model = f" ({row['model']})" if "model" in row else ""
    return f"{model} on {int(row['nodes'])}x{int(row['ranks_per_node'])}"
