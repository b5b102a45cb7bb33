"""The report's findings: short sentences, each computed from this study's tables and linked
to the section that holds the numbers behind it. None is written by hand; a finding whose data
the study lacks (no unshaped baseline, one strategy only, a stage turned off) is left out.

What is compared with what:

- *volume, messages, burstiness*: the strategies of the comparison group, the (model, nodes,
  ranks per node) setup with the most strategies among unshaped cells (no cap, delay or loss),
  so every strategy trains the same model on the same cluster;
- *sensitivity*: per strategy, the slowdown (step time over the same setup unshaped, the
  aggregate's ``slowdown`` table) at the tightest cap, the largest delay and the largest loss
  of the study, compared at the same setting;
- *placement*: a strategy ``X`` and ``X-across`` run in the same setup (the same degrees, the
  tensor-parallel groups inside vs across nodes);
- *congestion control*: cells that differ in nothing else;
- *mapping*: predicted jobs (the scenario table) that differ only in their rank mapping;
- *scale*: a strategy's unshaped step on 2 vs 4 (or more) nodes;
- *replays*: a replay cell against its program and, on its source's own link, its source's
  step; a replayed trace's slowdown next to the training strategies' at the same setting;
- *checks*: the wire against the recorded ops, the prediction against the trace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from commscope.config import REPLAY_STRATEGY, cell_axes
from commscope.metrics.study import strategy_label, unshaped_rows
from commscope.units import fmt_bytes, fmt_count, fmt_ms

# Section anchors of the report (report.html.j2); tables added by title get anchor(title).
STRATEGIES = "strategies"
SENSITIVITY = "sensitivity"
RUN = "run"


def anchor(title: str) -> str:
    """A section title as a URL fragment: ``"Wire vs ops"`` -> ``"wire-vs-ops"``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


CROSSCHECK = anchor("Wire vs recorded ops, per strategy")
SYNC = anchor("Synchronization structure per cell")
TEMPORAL = anchor("Temporal structure on the wire")
COMPARE = anchor("Predicted vs measured traffic")
TIMING = anchor("Predicted vs measured step time")
PREDICTIONS = anchor("Beyond the cluster: predicted traffic of large GPT jobs")
REPLAY = anchor("Replays: traces re-issued on the cluster")


@dataclass(frozen=True)
class Finding:
    """One sentence of the findings list and the report section (anchor) behind it."""

    text: str
    anchor: str


def comparison_group(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per strategy (mean over repeats and congestion controls) of the unshaped setup
    (model, nodes, ranks per node) that ran the most strategies; empty when none ran two."""
    if summary.empty or "bw_bps" not in summary:
        return pd.DataFrame()
    base = unshaped_rows(summary)
    setup = ["model", "nodes", "ranks_per_node"]
    if base.empty:
        return base
    counts = base.groupby(setup)["strategy"].nunique()
    if counts.max() < 2:
        return base.iloc[:0]
    # Ties: the smallest cluster (the default study's main comparison), then by name.
    best = counts[counts == counts.max()].sort_index(level=["nodes", "ranks_per_node"]).index[0]
    group = base[(base[setup] == pd.Series(best, index=setup)).all(axis=1)]
    return (
        group.groupby("strategy", as_index=False)
        .mean(numeric_only=True)
        .assign(model=best[0], nodes=best[1], ranks_per_node=best[2])
    )


def _setup_words(row: Any) -> str:
    rpn = int(row["ranks_per_node"])
    return f"{row['model']} on {int(row['nodes'])} nodes, {rpn} rank{'' if rpn == 1 else 's'} each"


def _extremes(group: pd.DataFrame, column: str) -> tuple[Any, Any] | None:
    """The rows of ``group`` with the highest and the lowest ``column`` (None under 2 values)."""
    valid = group[group[column].notna()]
    if len(valid) < 2:
        return None
    ordered = valid.sort_values([column, "strategy"], ascending=[False, True])
    return ordered.iloc[0], ordered.iloc[-1]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "infinitely more than"


def volume_findings(summary: pd.DataFrame) -> list[Finding]:
    """Most/least bytes across nodes, messages per step and burstiness in the comparison group."""
    group = comparison_group(summary)
    if group.empty:
        return []
    setup = _setup_words(group.iloc[0])
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


def _sensitivity_at(slowdown: pd.DataFrame, varied: str, column: str, pick: str) -> list[Finding]:
    rows = slowdown[(slowdown["varied"] == varied) & slowdown["slowdown_mean"].notna()]
    # Replayed traces are compared with the strategies in replay_findings, at equal settings.
    rows = rows[rows["strategy"] != REPLAY_STRATEGY]
    if rows.empty:
        return []
    value = rows[column].min() if pick == "min" else rows[column].max()
    at = rows[rows[column] == value]
    at = at.groupby("strategy", as_index=False).agg(
        slowdown_mean=("slowdown_mean", "mean"),
        low=("slowdown_ci_low", "first"),
        high=("slowdown_ci_high", "first"),
        setups=("slowdown_mean", "size"),
    )
    if len(at) < 2:
        return []
    at = at.sort_values(["slowdown_mean", "strategy"], ascending=[False, True])
    hi, lo = at.iloc[0], at.iloc[-1]
    setting = {
        "bw": f"a cap of {value / 1e6:g} Mbit/s",
        "delay": f"a one-way delay of {value:g} ms (round trip +{2 * value:g} ms)",
        "loss": f"{value:g} % random loss",
    }[varied]
    noun = {"bw": "bandwidth", "delay": "latency", "loss": "loss"}[varied]
    # With intervals on both ends, say when they overlap: the order is then not established.
    overlap = (
        pd.notna(hi["low"])
        and pd.notna(lo["high"])
        and hi["setups"] == lo["setups"] == 1
        and hi["low"] <= lo["high"]
    )
    caveat = "; their 95 % intervals overlap, so this order is not established" if overlap else ""
    return [
        Finding(
            f"Most sensitive to {noun}: {hi['strategy']}, whose step takes "
            f"{_times(hi)} as long under {setting} as unshaped; "
            f"{lo['strategy']} {_times(lo)}, the least of {len(at)} strategies{caveat}.",
            SENSITIVITY,
        )
    ]


def _times(row: Any) -> str:
    """``2.31x`` and, where the slowdown has an interval (one setup, repeats on both sides), its
    95 % bounds: ``2.31x (95 % CI 2.10-2.55x)``."""
    text = f"{row['slowdown_mean']:.2f}x"
    if row.get("setups", 1) == 1 and pd.notna(row.get("low")) and pd.notna(row.get("high")):
        text += f" (95 % CI {row['low']:.2f}-{row['high']:.2f}x)"
    return text


def sensitivity_findings(slowdown: pd.DataFrame) -> list[Finding]:
    """The strategy that slows down most (and least) at the tightest cap, the largest delay and
    the largest loss of the study."""
    if slowdown.empty:
        return []
    return [
        *_sensitivity_at(slowdown, "bw", "bw_bps", "min"),
        *_sensitivity_at(slowdown, "delay", "delay_ms", "max"),
        *_sensitivity_at(slowdown, "loss", "loss_pct", "max"),
    ]


def link_findings(summary: pd.DataFrame) -> list[Finding]:
    """Knees and crossovers over the rate cap, in the comparison group's setup.

    Knee: the cap at which a strategy's node (on average) needs its whole unshaped step to send one
    step's bytes, ``8 x wire tx per step and node / unshaped step time``. Below it the step
    grows like bytes / bandwidth (communication no longer fits in the time compute takes).
    Crossover: which strategy has the shortest step at each cap, where that changes."""
    group = comparison_group(summary)
    if group.empty or "wire_tx_bytes_per_step_per_node" not in summary:
        return []
    first = group.iloc[0]
    setup = (summary["model"] == first["model"]) & (summary["nodes"] == first["nodes"])
    setup &= summary["ranks_per_node"] == first["ranks_per_node"]
    for col in ("delay_ms", "jitter_ms", "loss_pct"):
        if col in summary:
            setup &= summary[col].fillna(0) == 0
    if "cc" in summary:  # the setup's usual congestion control, not a one-off comparison
        setup &= summary["cc"] == summary.loc[setup, "cc"].mode().iloc[0]
    rows = summary[setup & summary["strategy"].isin(group["strategy"])]
    out = []
    knees = group["wire_tx_bytes_per_step_per_node"] * 8 / group["step_time_mean_s"]
    knees = pd.Series(knees.to_numpy(), index=group["strategy"]).dropna()
    knees = knees.sort_values(ascending=False)
    if len(knees) >= 2:
        parts = [f"{name} {value / 1e6:,.0f} Mbit/s" for name, value in knees.items()]
        out.append(
            Finding(
                "Knee (the cap below which a step grows like bytes / bandwidth: 8 x the "
                "bytes a node sends per step over the unshaped step): "
                + ", ".join(parts)
                + f" ({_setup_words(first)}).",
                SENSITIVITY,
            )
        )
    caps = rows.assign(cap=rows["bw_bps"].fillna(float("inf")))
    per_cap = caps.groupby(["cap", "strategy"])["step_time_mean_s"].mean().reset_index()
    full = per_cap.groupby("cap")["strategy"].nunique() == len(group)
    per_cap = per_cap[per_cap["cap"].isin(full[full].index)]
    if per_cap["cap"].nunique() >= 2:
        fastest = per_cap.loc[per_cap.groupby("cap")["step_time_mean_s"].idxmin()]
        fastest = fastest.sort_values("cap", ascending=False)
        changes = int(fastest["strategy"].ne(fastest["strategy"].shift()).sum() - 1)
        if changes:
            words = [f"{r['strategy']} {_cap_words(r['cap'])}" for r in fastest.to_dict("records")]
            text = (
                f"Fastest by cap: {'; '.join(words)} (the fastest strategy changes {changes} "
                f"time{'' if changes == 1 else 's'})."
            )
        else:
            text = (
                f"No crossover over the cap: {fastest['strategy'].iloc[0]} has the shortest "
                f"step at every cap, from unshaped down to {fastest['cap'].min() / 1e6:g} Mbit/s "
                f"({len(group)} strategies, {_setup_words(first)})."
            )
        out.append(Finding(text, SENSITIVITY))
    return out


def _cap_words(cap: float) -> str:
    return "unshaped" if cap == float("inf") else f"at {cap / 1e6:g} Mbit/s"


def congestion_findings(summary: pd.DataFrame) -> list[Finding]:
    """Cells that differ only in TCP congestion control: each one's step against the same
    setting under the other control(s), mean over repeats."""
    keys = ["strategy", "model", "nodes", "ranks_per_node", "bw", "delay", "jitter", "loss"]
    if summary.empty or "cc" not in summary or any(k not in summary for k in keys):
        return []
    steps = summary.groupby([*keys, "cc"], dropna=False)["step_time_mean_s"].mean()
    out = []
    for key, by_cc in steps.groupby(level=keys, dropna=False, sort=True):
        if len(by_cc) < 2:
            continue
        by_cc = by_cc.droplevel(keys).sort_values()
        row = dict(zip(keys, key, strict=True))
        link = _link_words(row)
        fast, slow = by_cc.index[0], by_cc.index[-1]
        listed = ", ".join(f"{fmt_ms(t)} with {cc}" for cc, t in by_cc.items())
        out.append(
            Finding(
                f"Congestion control{link}: {row['strategy']}'s step takes {listed} "
                f"({slow}'s {by_cc.iloc[-1] / by_cc.iloc[0]:.2f}x {fast}'s; {row['model']} on "
                f"{int(row['nodes'])}x{int(row['ranks_per_node'])}).",
                SENSITIVITY,
            )
        )
    return out


def _link_words(row: dict[str, Any]) -> str:
    """`` under a cap of 50 Mbit/s, delay 5ms`` from a row's link axes (only those set)."""
    parts = []
    bw = str(row.get("bw", "none"))
    if bw != "none":
        rate = re.fullmatch(r"([0-9.]+)([kmg])bit", bw)
        unit = {"k": "kbit/s", "m": "Mbit/s", "g": "Gbit/s"}
        parts.append(f"a cap of {rate[1]} {unit[rate[2]]}" if rate else f"a cap of {bw}")
    for axis in ("delay", "jitter", "loss"):
        value = str(row.get(axis, "0"))
        if re.sub(r"[a-z]+$", "", value) not in ("0", "0.0", ""):
            parts.append(f"{axis} {value}")
    return f" under {', '.join(parts)}" if parts else " on the unshaped link"


def mapping_findings(predictions: pd.DataFrame) -> list[Finding]:
    """Predicted jobs that differ only in their rank mapping: the bytes each sends across
    nodes per step and which traffic kinds cross (the scenario table's ``all`` row and its
    per-kind rows)."""
    keys = ["model", "pp", "tp", "dp", "ep", "world_size", "gpus_per_node"]
    if predictions.empty or any(k not in predictions for k in [*keys, "mapping", "traffic"]):
        return []
    total = predictions[predictions["traffic"] == "all"]
    kinds = predictions[(predictions["traffic"] != "all") & (predictions["inter_node_bytes"] > 0)]
    out = []
    for key, group in total.groupby(keys, sort=True):
        if group["mapping"].nunique() < 2:
            continue
        group = group.sort_values(["inter_node_bytes", "mapping"])
        row = dict(zip(keys, key, strict=True))
        said = []
        for rec in group.to_dict("records"):
            crossing = sorted(set(kinds[kinds["scenario"] == rec["scenario"]]["traffic"]))
            said.append(
                f"{rec['mapping']} sends {fmt_bytes(rec['inter_node_bytes'])} across nodes "
                f"({', '.join(crossing) or 'nothing'} crossing)"
            )
        low, high = group["inter_node_bytes"].iloc[0], group["inter_node_bytes"].iloc[-1]
        ratio = f"{high / low:.1f}x" if low > 0 else "all of it"
        out.append(
            Finding(
                f"The mapping decides what crosses nodes (predicted, {row['model']} on "
                f"{int(row['world_size'])} GPUs, {int(row['gpus_per_node'])} per node, "
                f"(p, t, d) = ({int(row['pp'])}, {int(row['tp'])}, {int(row['dp'])})): "
                f"{'; '.join(said)} per step; the difference is {ratio}.",
                PREDICTIONS,
            )
        )
    return out


def placement_findings(summary: pd.DataFrame) -> list[Finding]:
    """What placing a strategy's groups across nodes (``X-across``) changes against ``X``."""
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


def scale_findings(summary: pd.DataFrame) -> list[Finding]:
    """How each strategy's unshaped step grows from the smallest node count to each larger one
    (same model and ranks per node): one sentence per larger count, every strategy that ran
    both, largest growth first."""
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


def structure_findings(sync: pd.DataFrame, temporal: pd.DataFrame) -> list[Finding]:
    """Bursty vs streaming per strategy (unshaped cells, node 0's transmit side), where the
    critical path is most communication, and the measured pipeline bubble vs (p-1)/(p-1+m)."""
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


def check_findings(
    crosscheck: pd.DataFrame,
    matrix_check: pd.DataFrame,
    comparison: pd.DataFrame,
    timing: pd.DataFrame,
) -> list[Finding]:
    """How far the measurements check out: wire vs recorded ops, prediction vs trace."""
    out = []
    # Replay cells are checked against their programs (replay_findings), not the model.
    if "strategy" in comparison:
        comparison = comparison[comparison["strategy"] != REPLAY_STRATEGY]
    if "strategy" in timing:
        timing = timing[timing["strategy"] != REPLAY_STRATEGY]
    if not crosscheck.empty and "passed" in crosscheck:
        text = (
            f"The wire carried what the ranks recorded: {int(crosscheck['passed'].sum())} of "
            f"{len(crosscheck)} node directions"
        )
        if not matrix_check.empty and "passed" in matrix_check:
            text += f" and {int(matrix_check['passed'].sum())} of {len(matrix_check)} node pairs"
        out.append(Finding(text + " agree within their stated tolerance.", CROSSCHECK))
    if not comparison.empty and "exact" in comparison:
        cells = comparison.groupby("cell")["exact"].all()
        out.append(
            Finding(
                f"The analytical model predicted every message and byte exactly in "
                f"{int(cells.sum())} of {len(cells)} cells.",
                COMPARE,
            )
        )
    if not timing.empty and "time_error" in timing:
        err = timing["time_error"].abs().dropna()
        if len(err):
            out.append(
                Finding(
                    f"The alpha-beta step time is within {100 * err.median():.0f} % of the "
                    f"measured one for the median cell (worst {100 * err.max():.0f} %, "
                    f"{len(err)} cells).",
                    TIMING,
                )
            )
    return out


def replay_findings(
    comparison: pd.DataFrame, timing: pd.DataFrame, slowdown: pd.DataFrame
) -> list[Finding]:
    """Replays (docs/replay.md): how faithfully the cells re-issued their programs (every
    message and byte; the step time against the source's on the source's own link), and how
    each replayed trace's step slows under the study's tightest cap and largest delay next to
    the training strategies' at the same setting."""
    out = []
    if "strategy" in comparison and "exact" in comparison:
        rep = comparison[comparison["strategy"] == REPLAY_STRATEGY]
        if len(rep):
            cells = rep.groupby("cell")["exact"].all()
            text = (
                f"Replays re-issued their programs message for message and byte for byte in "
                f"{int(cells.sum())} of {len(cells)} replay cells"
            )
            same = (
                timing[(timing.get("strategy") == REPLAY_STRATEGY) & timing["time_error"].notna()]
                if "time_error" in timing
                else pd.DataFrame()
            )
            if len(same):
                # time_error is (source - replay) / replay: say replay / source instead.
                ratio = (1.0 / (1.0 + same["time_error"])).groupby(same["model"]).mean()
                parts = ", ".join(f"{m} {r:.2f}x" for m, r in ratio.sort_index().items())
                text += (
                    f"; on their source's own link a replayed step took {ratio.min():.2f}-"
                    f"{ratio.max():.2f}x the source's ({parts}; one run each, beside the "
                    "study's other jobs)"
                )
            out.append(Finding(text + ".", REPLAY))
    if slowdown.empty or "strategy" not in slowdown:
        return out
    rows = slowdown[slowdown["slowdown_mean"].notna()]
    for varied, column, pick in (("bw", "bw_bps", "min"), ("delay", "delay_ms", "max")):
        at_varied = rows[rows["varied"] == varied]
        replayed = at_varied[at_varied["strategy"] == REPLAY_STRATEGY]
        for name, group in replayed.groupby("model", sort=True):
            value = group[column].min() if pick == "min" else group[column].max()
            mine = group[group[column] == value]["slowdown_mean"].mean()
            others = at_varied[
                (at_varied["strategy"] != REPLAY_STRATEGY) & (at_varied[column] == value)
            ]
            setting = (
                f"a cap of {value / 1e6:g} Mbit/s"
                if varied == "bw"
                else f"a one-way delay of {value:g} ms"
            )
            bare = "compute_source" in timing and (
                timing[(timing.get("model") == name)]["compute_source"]
                .astype(str)
                .str.contains("no compute")
                .any()
            )
            text = (
                f"The replayed trace {name}"
                + (
                    " (its communication back to back: the source records no compute)"
                    if bare
                    else ""
                )
                + f" takes {mine:.2f}x as long under {setting}"
            )
            if len(others):
                per = others.groupby("strategy")["slowdown_mean"].mean().sort_values()
                text += "; our own workloads at the same setting: " + ", ".join(
                    f"{s} {v:.2f}x" for s, v in per.items()
                )
            out.append(Finding(text + ".", SENSITIVITY))
    return out


def _without_replays(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    if frame is None or frame.empty or "strategy" not in frame:
        return frame
    return frame[frame["strategy"] != REPLAY_STRATEGY]


def study_findings(
    summary: pd.DataFrame,
    slowdown: pd.DataFrame,
    crosscheck: pd.DataFrame | None = None,
    matrix_check: pd.DataFrame | None = None,
    comparison: pd.DataFrame | None = None,
    timing: pd.DataFrame | None = None,
    sync: pd.DataFrame | None = None,
    temporal: pd.DataFrame | None = None,
    predictions: pd.DataFrame | None = None,
) -> list[Finding]:
    """Every finding the study's tables support, in the report's order: what the strategies
    put on the network and how (burstiness, synchronization), how sensitive they are,
    placement and scale, then the checks."""
    empty = pd.DataFrame()

    def named(frame: pd.DataFrame | None) -> pd.DataFrame:
        """``frame`` with each replay cell's strategy read as ``replayed NAME``."""
        if frame is None:
            return empty
        if frame.empty or "strategy" not in frame or "model" not in frame:
            return frame
        return frame.assign(strategy=strategy_label(frame))

    return [
        *volume_findings(named(summary)),
        # The critical path and the bubble compare strategies (replays are in the temporal
        # list, and have their own findings).
        *structure_findings(named(_without_replays(sync)), named(temporal)),
        *sensitivity_findings(slowdown),
        *link_findings(named(summary)),
        *congestion_findings(named(summary)),
        *placement_findings(named(summary)),
        *mapping_findings(empty if predictions is None else predictions),
        *scale_findings(named(summary)),
        *replay_findings(
            empty if comparison is None else comparison,
            empty if timing is None else timing,
            slowdown,
        ),
        *check_findings(
            empty if crosscheck is None else crosscheck,
            empty if matrix_check is None else matrix_check,
            empty if comparison is None else comparison,
            empty if timing is None else timing,
        ),
    ]


def failed_cell_words(cell: str) -> str:
    """A failed cell as a reader names it: strategy, model, placement and link."""
    a = cell_axes(cell)
    link = ", ".join(f"{k} {a[k]}" for k in ("bw", "delay", "jitter", "loss") if k in a)
    return (
        f"{a.get('strategy', '?')} ({a.get('model', '?')}, {a.get('nodes', '?')} x "
        f"{a.get('ranks_per_node', '?')}, {link}, repeat {a.get('repeat', '?')})"
    )


def _names(text: str, strategy: str) -> bool:
    return bool(strategy) and bool(re.search(rf"(?<![\w-]){re.escape(strategy)}(?![\w-])", text))


def lost_sides(
    findings: list[Finding], failed: list[dict[str, Any]], strategies: Sequence[str] = ()
) -> list[Finding]:
    """``findings`` with a note on each one a failed cell could have been a side of: the
    finding names the cell's strategy, or the setup (model, nodes, ranks per node) whose
    strategies it compares, or it compares two or more of the study's ``strategies`` without
    naming a setup. Such a finding was computed on the cells that ran; the note says which
    cells it lacks instead of passing that over (erring towards a note too many)."""
    if not failed:
        return findings
    out = []
    for f in findings:
        compares = sum(_names(f.text, name) for name in strategies) >= 2
        names_a_setup = bool(re.search(r" on \d+ nodes?, \d+ ranks? each", f.text))
        lacking = []
        for rec in failed:
            a = cell_axes(rec["cell"])
            strategy = a.get("strategy", "")
            if a.get("model") and a.get("nodes") and a.get("ranks_per_node"):
                setup = _setup_words(a)
            else:
                setup = None
            in_setup = bool(setup) and setup in f.text
            if _names(f.text, strategy) or in_setup or (compares and not names_a_setup):
                lacking.append(failed_cell_words(rec["cell"]))
        if lacking:
            text = (
                f"{f.text} [Computed without {len(lacking)} failed "
                f"cell{'' if len(lacking) == 1 else 's'} it could have included: "
                f"{'; '.join(lacking)}.]"
            )
            f = Finding(text, f.anchor)
        out.append(f)
    return out
