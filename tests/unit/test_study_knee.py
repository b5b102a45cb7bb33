"""The knee read from the measured slowdown curve, and the intervals over repeats
(commscope.metrics.study; definitions in docs/analysis.md)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from commscope.metrics.study import (
    KNEE_COLUMNS,
    SETUP_AXES,
    knee_table,
    mean_ci,
    runs_to_separate,
    step_time_over_repeats,
)

SETUP = {"model": "tiny", "nodes": 2, "ranks_per_node": 1, "cc": "cubic", "steps": 4}


def _slowdown(strategy: str, curve: dict[float, float]) -> pd.DataFrame:
    rows = [{**SETUP, "strategy": strategy, "varied": "baseline", "bw_bps": math.nan}]
    rows[0]["slowdown_mean"] = 1.0
    for cap, value in curve.items():
        rows.append({**SETUP, "strategy": strategy, "varied": "bw", "bw_bps": cap})
        rows[-1]["slowdown_mean"] = value
    return pd.DataFrame(rows)


def test_the_knee_is_interpolated_in_one_over_the_cap_between_the_bracketing_caps() -> None:
    curve = {200e6: 1.0, 100e6: 1.05, 50e6: 1.3, 20e6: 2.0}
    t = knee_table(_slowdown("ddp", curve))
    assert list(t.columns) == KNEE_COLUMNS and len(t) == 1
    r = t.iloc[0]
    # 1/knee = 1/100M + (1.1 - 1.05) / (1.3 - 1.05) x (1/50M - 1/100M) = 1.2e-8 s/bit.
    assert r["knee_bps"] == pytest.approx(1 / 1.2e-8)
    assert (r["cap_high_bps"], r["cap_low_bps"]) == (100e6, 50e6)
    assert (r["slowdown_high"], r["slowdown_low"]) == (1.05, 1.3)
    assert r["caps"] == 4 and math.isnan(r["knee_above_bps"]) and math.isnan(r["knee_below_bps"])


def test_caps_that_do_not_bracket_the_knee_give_nan_and_say_which_side() -> None:
    both = pd.concat([_slowdown("ddp", {20e6: 5.33}), _slowdown("pp", {100e6: 1.02, 20e6: 0.98})])
    t = knee_table(both).set_index("strategy")
    assert math.isnan(t.loc["ddp", "knee_bps"]) and t.loc["ddp", "knee_above_bps"] == 20e6
    assert t.loc["ddp", "slowdown_low"] == 5.33 and t.loc["ddp", "cap_low_bps"] == 20e6
    assert math.isnan(t.loc["pp", "knee_bps"]) and t.loc["pp", "knee_below_bps"] == 20e6
    assert t.loc["pp", "slowdown_high"] == 0.98
    assert set(SETUP_AXES) <= set(t.reset_index().columns)


def test_mean_ci_and_the_runs_that_would_separate_two_means() -> None:
    low, high = mean_ci(10.0, 2.0, 4)  # t(3) = 3.1824 x 2 / 2
    assert (low, high) == pytest.approx((10 - 3.182446, 10 + 3.182446), abs=1e-5)
    assert all(math.isnan(v) for v in mean_ci(10.0, math.nan, 1))
    # t(n-1) x (1 + 1) / sqrt(n) < 2 first at n = 7 (t(6) = 2.447 < sqrt(7) = 2.646).
    assert runs_to_separate(10.0, 1.0, 12.0, 1.0) == 7
    assert runs_to_separate(10.0, 1.0, 10.0, 1.0) is None


def test_step_time_over_repeats_carries_its_interval() -> None:
    summary = pd.DataFrame(
        {
            "model": "tiny",
            "strategy": ["ddp"] * 4 + ["pp"],
            "bw": "none",
            "bw_bps": math.nan,
            "delay_ms": 0.0,
            "jitter_ms": 0.0,
            "loss_pct": 0.0,
            "step_time_mean_s": [8.0, 10.0, 10.0, 12.0, 5.0],
        }
    )
    t = step_time_over_repeats(summary).set_index("strategy")
    sd = (8 / 3) ** 0.5  # sample sd of 8, 10, 10, 12
    assert t.loc["ddp", "ci_low"] == pytest.approx(10 - 3.182446 * sd / 2, abs=1e-5)
    assert t.loc["ddp", "ci_high"] == pytest.approx(10 + 3.182446 * sd / 2, abs=1e-5)
    assert math.isnan(t.loc["pp", "ci_low"]) and t.loc["pp", "repeats"] == 1


def _with_intervals(strategy: str, curve: dict[float, tuple[float, float, float]]) -> pd.DataFrame:
    """A slowdown table against a 1 Gbit/s reference cap: ``curve`` maps a cap to its slowdown
    and interval; the reference's own row carries an interval the knee must not use."""
    rows = [{**SETUP, "strategy": strategy, "varied": "baseline", "bw_bps": 1e9}]
    rows[0] |= {"slowdown_mean": 1.0, "slowdown_ci_low": 0.8, "slowdown_ci_high": 1.25}
    for cap, (mean, low, high) in curve.items():
        rows.append({**SETUP, "strategy": strategy, "varied": "bw", "bw_bps": cap})
        rows[-1] |= {"slowdown_mean": mean, "slowdown_ci_low": low, "slowdown_ci_high": high}
    return pd.DataFrame(rows)


def test_the_knee_carries_the_interval_of_the_curves_through_the_slowdowns_intervals() -> None:
    t = knee_table(_with_intervals("ddp", {200e6: (1.5, 1.2, 1.9), 100e6: (2.5, 2.0, 3.1)}))
    r = t.iloc[0]
    # Each curve from the reference cap (1 exactly) to 200 Mbit/s, linear in 1 / cap:
    # 1/knee = 1/1G + (1.1 - 1) / (s - 1) x (1/200M - 1/1G), s = 1.5, 1.2 and 1.9.
    knee = {s: 1 / (1e-9 + 0.1 / (s - 1) * 4e-9) for s in (1.5, 1.2, 1.9)}
    assert r["knee_bps"] == pytest.approx(knee[1.5])  # 556 Mbit/s
    assert r["knee_ci_low_bps"] == pytest.approx(knee[1.2])  # 333 Mbit/s
    assert r["knee_ci_high_bps"] == pytest.approx(knee[1.9])  # 692 Mbit/s
    # A lower end the caps do not bracket is open (0); a cap run once gives no interval.
    open_low = knee_table(_with_intervals("pp", {200e6: (1.3, 1.05, 1.6)})).iloc[0]
    assert open_low["knee_ci_low_bps"] == 0.0 and open_low["knee_ci_high_bps"] > 0
    once = knee_table(_with_intervals("tp", {200e6: (1.5, math.nan, math.nan)})).iloc[0]
    assert math.isnan(once["knee_ci_low_bps"]) and math.isnan(once["knee_ci_high_bps"])
    assert once["knee_bps"] == pytest.approx(knee[1.5])
