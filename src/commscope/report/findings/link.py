"""How sensitive the strategies are to the link: the slowdown at the study's tightest cap,
largest delay and largest loss (each in one setup), the knee read off the measured slowdown
curve and the crossovers over the cap, and the congestion control; every comparison with its
interval over runs, stated as an ordering only where the intervals separate."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.study import knee_table
from commscope.report.findings._base import (
    SENSITIVITY,
    Finding,
    Spread,
    comparison_group,
    kept,
    left_out,
    lost_in,
    named,
    ordering,
    setup_words,
)
from commscope.report.results import StudyResults
from commscope.report.sections._base import link_words, than_baseline
from commscope.spec.link import SHAPING, impaired
from commscope.units import fmt_ms


def _sensitivity_at(
    slowdown: pd.DataFrame, varied: str, column: str, pick: str, results: StudyResults
) -> list[Finding]:
    rows = slowdown[(slowdown["varied"] == varied) & slowdown["slowdown_mean"].notna()]
    # Replayed traces are compared with the strategies in replay_findings, at equal settings.
    rows = rows[~is_replay(rows)]
    if rows.empty:
        return []
    value = rows[column].min() if pick == "min" else rows[column].max()
    at = rows[rows[column] == value]
    # One setup: the one with the most strategies at this setting (ties: the smallest cluster),
    # never an average over unlike setups.
    setup_keys = [k for k in (*SETUP, "cc") if k in at]
    best: tuple[Any, ...] = ()
    if setup_keys:
        counts = at.groupby(setup_keys, dropna=False)["strategy"].nunique()
        most = counts[counts == counts.max()].index
        # Ties: the smallest cluster (nodes, then ranks per node), then by name.
        best = sorted((k if isinstance(k, tuple) else (k,) for k in most), key=_cluster)[0]
        at = at[(at[setup_keys] == pd.Series(best, index=setup_keys)).all(axis=1)]
    if at["strategy"].nunique() < 2:
        return []
    at = at.groupby("strategy", as_index=False).agg(
        slowdown_mean=("slowdown_mean", "mean"),
        low=("slowdown_ci_low", "first"),
        high=("slowdown_ci_high", "first"),
        repeats=("repeats", "first") if "repeats" in at else ("slowdown_mean", "size"),
    )
    at = at.sort_values(["slowdown_mean", "strategy"], ascending=[False, True])
    hi, lo = at.iloc[0], at.iloc[-1]
    setting = {
        "bw": f"a cap of {value / 1e6:g} Mbit/s",
        "delay": f"a one-way delay of {value:g} ms (round trip +{2 * value:g} ms)",
        "loss": f"{value:g} % random loss",
    }[varied]
    noun = {"bw": "bandwidth", "delay": "latency", "loss": "loss"}[varied]
    keys = dict(zip(setup_keys, best, strict=True))
    setup = f" ({setup_words(keys)})" if {"model", "nodes", "ranks_per_node"} <= set(keys) else ""
    # Stated as an ordering only where the two intervals separate.
    if pd.notna(hi["low"]) and pd.notna(lo["high"]) and hi["low"] > lo["high"]:
        caveat = ""
    elif pd.notna(hi["low"]) and pd.notna(lo["high"]):
        caveat = "; their 95 % intervals overlap, so this order is not established"
    else:
        runs = sorted({int(hi["repeats"]), int(lo["repeats"])})
        caveat = (
            "; not established: "
            + ("one run each" if runs == [1] else f"{' and '.join(map(str, runs))} runs")
            + ", no interval (at least 2 runs of each setting and of its baseline are needed)"
        )
    # The leader named as the most sensitive only over a second whose interval it clears: with
    # the order established end to end, a tie at the top is still said.
    lead = ""
    if not caveat and len(at) > 2:
        second = at.iloc[1]
        why = (
            "its slowdown has no interval"
            if pd.isna(second["high"])
            else "their 95 % intervals overlap"
            if hi["low"] <= second["high"]
            else ""
        )
        if why:
            lead = (
                f", though its lead over {second['strategy']} ({_times(second)}) is not "
                f"established ({why})"
            )
    return [
        Finding(
            f"Most sensitive to {noun}{setup}: {hi['strategy']}, whose step takes "
            f"{_times(hi)} as long under {setting} as {than_baseline(results)}{lead}; "
            f"{lo['strategy']} {_times(lo)}, the least of {len(at)} strategies{caveat}"
            f"{left_out(lost_in(results, **keys))}.",
            SENSITIVITY,
            question="sensitivity",
        )
    ]


# A setup (setup_words' keys first: model, nodes, ranks per node).
SETUP = ("model", "nodes", "ranks_per_node", "steps")


def _cluster(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """Sort key of a setup tuple (:data:`SETUP` order): nodes, ranks per node, then the rest."""
    return (*key[1:3], str(key))


def _times(row: Any) -> str:
    """``2.31x`` and, where the slowdown has an interval (repeats on both sides), its 95 %
    bounds: ``2.31x (95 % CI 2.10-2.55x)``."""
    text = f"{row['slowdown_mean']:.2f}x"
    if pd.notna(row.get("low")) and pd.notna(row.get("high")):
        text += f" (95 % CI {row['low']:.2f}-{row['high']:.2f}x)"
    return text


def sensitivity_findings(results: StudyResults) -> list[Finding]:
    """The strategy that slows down most (and least) at the tightest cap, the largest delay and
    the largest loss of the study, in one setup (the one with the most strategies there)."""
    slowdown, _ = kept(results, "slowdown")
    if slowdown.empty:
        return []
    return [
        *_sensitivity_at(slowdown, "bw", SHAPING["bw"], "min", results),
        *_sensitivity_at(slowdown, "delay", SHAPING["delay"], "max", results),
        *_sensitivity_at(slowdown, "loss", SHAPING["loss"], "max", results),
    ]


def _knee_ci_words(row: Any) -> str:
    """The knee's interval (``knee_ci_low_bps``/``knee_ci_high_bps``), '' without one."""
    low, high = row.get("knee_ci_low_bps", math.nan), row.get("knee_ci_high_bps", math.nan)
    if pd.isna(low) or pd.isna(high):
        return ""
    if low <= 0 and math.isinf(high):
        return ", 95 % CI any cap"
    if low <= 0:
        return f", 95 % CI up to {high / 1e6:,.0f} Mbit/s"
    if math.isinf(high):
        return f", 95 % CI from {low / 1e6:,.0f} Mbit/s up"
    return f", 95 % CI {low / 1e6:,.0f}-{high / 1e6:,.0f} Mbit/s"


def _knee_ties(order: pd.DataFrame) -> list[str]:
    """Neighbours in the knee order whose lead is not established: the higher knee's interval
    does not lie wholly above the lower one's (or either has none)."""
    ties = []
    rows = list(order.itertuples(index=False))
    for upper, lower in itertools.pairwise(rows):
        if pd.isna(upper.knee_bps) or pd.isna(lower.knee_bps):
            continue  # a knee off the caps is ordered by the side it lies on
        if not (upper.knee_ci_low_bps > lower.knee_ci_high_bps):  # NaN: no interval
            ties.append(f"{upper.strategy} and {lower.strategy}")
    return ties


def _knee_words(row: Any) -> str:
    """One strategy's knee: its value, interval and bracket, or the side of the caps it lies
    on."""
    if pd.notna(row["knee_bps"]):
        return (
            f"{row['strategy']} {row['knee_bps'] / 1e6:,.0f} Mbit/s{_knee_ci_words(row)} "
            f"(between {row['cap_low_bps'] / 1e6:g} Mbit/s, {row['slowdown_low']:.2f}x, and "
            f"{row['cap_high_bps'] / 1e6:g} Mbit/s, {row['slowdown_high']:.2f}x)"
        )
    if pd.notna(row["knee_above_bps"]):
        cap, there, which = row["knee_above_bps"], row["slowdown_low"], "highest"
        side = "above"
    else:
        cap, there, which = row["knee_below_bps"], row["slowdown_high"], "lowest"
        side = "below"
    return (
        f"{row['strategy']} {side} {cap / 1e6:g} Mbit/s ({there:.2f}x there, the {which} cap "
        "run: the caps do not bracket it)"
    )


def link_findings(results: StudyResults) -> list[Finding]:
    """Knees and crossovers over the rate cap, in the comparison group's setup.

    Knee (:func:`~commscope.metrics.study.knee_table`): the cap at which the measured step is
    1.1x the one on the reference link (the unshaped link without one), interpolated in
    1 / cap between the measured caps that bracket it
    (else the side of the caps it lies on). Crossover: which strategy has the shortest step at
    each cap, where that changes, with the step's interval over runs."""
    summary, _ = kept(results, "summary")
    summary = named(summary)
    group = comparison_group(summary, results.reference)
    if group.empty:
        return []
    first = group.iloc[0]
    note = left_out(lost_in(results, **{c: first[c] for c in ("model", "nodes", "ranks_per_node")}))
    setup = (summary["model"] == first["model"]) & (summary["nodes"] == first["nodes"])
    setup &= summary["ranks_per_node"] == first["ranks_per_node"]
    setup &= ~impaired(summary)
    if "cc" in summary:  # the setup's usual congestion control, not a one-off comparison
        setup &= summary["cc"] == summary.loc[setup, "cc"].mode().iloc[0]
    rows = summary[setup & summary["strategy"].isin(group["strategy"])]
    out = []
    slowdown, _ = kept(results, "slowdown")
    # The slowdown table is against the reference link, so the knee is too.
    knees = knee_table(named(slowdown)) if not slowdown.empty else pd.DataFrame()
    if not knees.empty:
        knees = knees[(knees["model"] == first["model"]) & (knees["nodes"] == first["nodes"])]
        knees = knees[knees["ranks_per_node"] == first["ranks_per_node"]]
        if "cc" in rows and len(rows):
            knees = knees[knees["cc"].isin(set(rows["cc"]))]
        knees = knees[knees["strategy"].isin(group["strategy"])]
    if len(knees) >= 2:
        order = knees.assign(
            _key=knees["knee_bps"]
            .fillna(knees["knee_above_bps"] * 10)
            .fillna(knees["knee_below_bps"] / 10)
        ).sort_values(["_key", "strategy"], ascending=[False, True])
        text = (
            "Knee (the cap at which the measured step is 1.1x the "
            + ("unshaped one" if results.reference is None else f"one {than_baseline(results)}")
            + f", read off the slowdown curve; {setup_words(first)}): "
            + "; ".join(_knee_words(r) for _, r in order.iterrows())
        )
        ties = _knee_ties(order)
        if ties:
            text += (
                f". Not established: the order of {', of '.join(ties)} (the 95 % intervals "
                "of their knees overlap)"
            )
        if "wire_tx_bytes_per_step_per_node" in group:
            rate = group["wire_tx_bytes_per_step_per_node"] * 8 / group["step_time_mean_s"]
            rate = pd.Series(rate.to_numpy(), index=group["strategy"]).dropna()
            if len(rate):
                text += (
                    ". For comparison, the rate a node needs to send one step's bytes within "
                    + (
                        "the unshaped step"
                        if results.reference is None
                        else f"the step {than_baseline(results)}"
                    )
                    + " (bytes rate): "
                    + ", ".join(f"{k} {v / 1e6:,.0f} Mbit/s" for k, v in rate.items())
                )
        out.append(Finding(text + note + ".", SENSITIVITY, question="sensitivity"))
    caps = rows.assign(cap=rows["bw_bps"].fillna(float("inf")))
    per_cap = caps.groupby(["cap", "strategy"])["step_time_mean_s"].agg(list).reset_index()
    per_cap["spread"] = per_cap["step_time_mean_s"].map(Spread.of)
    per_cap["mean"] = per_cap["spread"].map(lambda v: v.mean)
    full = per_cap.groupby("cap")["strategy"].nunique() == len(group)
    per_cap = per_cap[per_cap["cap"].isin(full[full].index)]
    if per_cap["cap"].nunique() >= 2:
        unsettled = []
        fastest = []
        for cap, g in per_cap.groupby("cap"):
            g = g.sort_values(["mean", "strategy"])
            fastest.append({"cap": cap, "strategy": g["strategy"].iloc[0]})
            if ordering(g["spread"].iloc[1], g["spread"].iloc[0]):
                unsettled.append(cap)
        fastest = pd.DataFrame(fastest).sort_values("cap", ascending=False)
        changes = int(fastest["strategy"].ne(fastest["strategy"].shift()).sum() - 1)
        runs = max(v.n for v in per_cap["spread"])
        caveat = ""
        if unsettled:
            caveat = (
                "; the fastest is not established "
                + (
                    "at any cap"
                    if len(unsettled) == len(fastest)
                    else "at " + ", ".join(_cap_words(c) for c in sorted(unsettled, reverse=True))
                )
                + (" (one run each)" if runs == 1 else " (the 95 % intervals over runs overlap)")
            )
        if changes:
            words = [f"{r['strategy']} {_cap_words(r['cap'])}" for r in fastest.to_dict("records")]
            text = (
                f"Fastest by cap ({setup_words(first)}): {'; '.join(words)} (the fastest "
                f"strategy changes {changes} time{'' if changes == 1 else 's'}{caveat})"
            )
        else:
            text = (
                f"No crossover over the cap: {fastest['strategy'].iloc[0]} has the shortest "
                f"step at every cap, from unshaped down to {fastest['cap'].min() / 1e6:g} Mbit/s "
                f"({len(group)} strategies, {setup_words(first)}{caveat})"
            )
        out.append(Finding(text + note + ".", SENSITIVITY, question="sensitivity"))
    return out


def _cap_words(cap: float) -> str:
    return "unshaped" if cap == float("inf") else f"at {cap / 1e6:g} Mbit/s"


def congestion_findings(results: StudyResults) -> list[Finding]:
    """Cells that differ only in TCP congestion control: each one's step against the same
    setting under the other control(s), mean over repeats."""
    summary, _ = kept(results, "summary")
    summary = named(summary)
    keys = ["strategy", "model", "nodes", "ranks_per_node", "bw", "delay", "jitter", "loss"]
    if summary.empty or "cc" not in summary or any(k not in summary for k in keys):
        return []
    steps = summary.groupby([*keys, "cc"], dropna=False)["step_time_mean_s"].agg(Spread.of)
    out = []
    for key, by_cc in steps.groupby(level=keys, dropna=False, sort=True):
        if len(by_cc) < 2:
            continue
        by_cc = by_cc.droplevel(keys)
        by_cc = by_cc.iloc[sorted(range(len(by_cc)), key=lambda i: by_cc.iloc[i].mean)]
        row = dict(zip(keys, key, strict=True))
        link = link_words(row)
        fast, slow = by_cc.index[0], by_cc.index[-1]
        listed = ", ".join(
            f"{fmt_ms(v.mean)} with {cc} ({v.interval_in(fmt_ms)})" for cc, v in by_cc.items()
        )
        out.append(
            Finding(
                f"Congestion control{link}: {row['strategy']}'s step takes {listed} "
                f"({slow}'s {by_cc.iloc[-1].mean / by_cc.iloc[0].mean:.2f}x {fast}'s; "
                f"{setup_words(row)}){ordering(by_cc.iloc[-1], by_cc.iloc[0])}"
                f"{left_out(lost_in(results, **row))}.",
                SENSITIVITY,
                question="sensitivity",
            )
        )
    return out
