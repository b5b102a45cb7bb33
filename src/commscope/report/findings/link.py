"""How sensitive the strategies are to the link: the slowdown at the study's tightest cap,
largest delay and largest loss, the knee and crossovers over the cap, and the congestion
control."""

from __future__ import annotations

from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.report.findings._base import (
    SENSITIVITY,
    Finding,
    comparison_group,
    named,
    setup_words,
)
from commscope.report.results import StudyResults
from commscope.report.sections._base import link_words
from commscope.spec.link import SHAPING, impaired
from commscope.units import fmt_ms


def _sensitivity_at(slowdown: pd.DataFrame, varied: str, column: str, pick: str) -> list[Finding]:
    rows = slowdown[(slowdown["varied"] == varied) & slowdown["slowdown_mean"].notna()]
    # Replayed traces are compared with the strategies in replay_findings, at equal settings.
    rows = rows[~is_replay(rows)]
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


def sensitivity_findings(results: StudyResults) -> list[Finding]:
    """The strategy that slows down most (and least) at the tightest cap, the largest delay and
    the largest loss of the study."""
    slowdown = results.slowdown
    if slowdown.empty:
        return []
    return [
        *_sensitivity_at(slowdown, "bw", SHAPING["bw"], "min"),
        *_sensitivity_at(slowdown, "delay", SHAPING["delay"], "max"),
        *_sensitivity_at(slowdown, "loss", SHAPING["loss"], "max"),
    ]


def link_findings(results: StudyResults) -> list[Finding]:
    """Knees and crossovers over the rate cap, in the comparison group's setup.

    Knee: the cap at which a strategy's node (on average) needs its whole unshaped step to send one
    step's bytes, ``8 x wire tx per step and node / unshaped step time``. Below it the step
    grows like bytes / bandwidth (communication no longer fits in the time compute takes).
    Crossover: which strategy has the shortest step at each cap, where that changes."""
    summary = named(results.summary)
    group = comparison_group(summary)
    if group.empty or "wire_tx_bytes_per_step_per_node" not in summary:
        return []
    first = group.iloc[0]
    setup = (summary["model"] == first["model"]) & (summary["nodes"] == first["nodes"])
    setup &= summary["ranks_per_node"] == first["ranks_per_node"]
    setup &= ~impaired(summary)
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
                + f" ({setup_words(first)}).",
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
                f"({len(group)} strategies, {setup_words(first)})."
            )
        out.append(Finding(text, SENSITIVITY))
    return out


def _cap_words(cap: float) -> str:
    return "unshaped" if cap == float("inf") else f"at {cap / 1e6:g} Mbit/s"


def congestion_findings(results: StudyResults) -> list[Finding]:
    """Cells that differ only in TCP congestion control: each one's step against the same
    setting under the other control(s), mean over repeats."""
    summary = named(results.summary)
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
        link = link_words(row)
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
