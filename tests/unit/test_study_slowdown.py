"""The study's slowdown table: each setting against the same setup on the unshaped link, on a
synthetic summary whose step times are chosen so the answers are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from synthetic import cell_params
from synthetic import only_row as _row
from synthetic import step_summary as _summary

from commscope.metrics.study import SLOWDOWN_COLUMNS, slowdown_table, t_quantile

approx = pytest.approx


def test_each_setting_is_divided_by_its_own_setups_unshaped_run() -> None:
    summary = _summary(
        (cell_params("ddp", bw="none"), 0.100),
        (cell_params("ddp", bw="none", nodes=4), 0.500),  # another setup: not ddp's baseline
        (cell_params("ddp", bw="50mbit"), 0.300),
        (cell_params("ddp", bw="none", delay="5ms"), 0.150),
        (cell_params("ddp", bw="none", loss="1pct"), 0.120),
        (cell_params("ddp", bw="50mbit", delay="5ms"), 0.400),
        (cell_params("tp", bw="none", delay="0us"), 0.200),  # 0 us is no delay: tp's baseline
        (cell_params("tp", bw="none", delay="20ms"), 0.500),
    )
    table = slowdown_table(summary)
    assert list(table.columns) == SLOWDOWN_COLUMNS
    assert len(table) == len(summary)  # one setting per cell: one repeat each
    ddp = table[(table.strategy == "ddp") & (table.nodes == 2)]
    assert ddp["varied"].tolist() == ["baseline", "bw", "delay", "loss", "several"]
    assert ddp["slowdown_mean"].tolist() == approx([1.0, 3.0, 1.5, 1.2, 4.0])
    assert (ddp["baseline_step_time_s"] == 0.1).all() and (ddp["baseline_repeats"] == 1).all()
    assert _row(table, strategy="ddp", nodes=4)["slowdown_mean"] == 1.0
    tp = _row(table, strategy="tp", delay="20ms")
    assert tp["varied"] == "delay" and tp["delay_ms"] == 20.0
    assert tp["slowdown_mean"] == approx(2.5)
    # One repeat: no spread, no interval.
    assert ddp["slowdown_sd"].isna().all() and ddp["slowdown_ci_low"].isna().all()


def test_a_setting_without_an_unshaped_run_is_listed_with_nan() -> None:
    summary = _summary(
        (cell_params("ddp", bw="none"), 0.1),
        (cell_params("ddp", bw="50mbit"), 0.3),
        # BBR is part of the setup: cubic's unshaped run is not its baseline.
        (cell_params("ddp", bw="50mbit", cc="bbr"), 0.25),
        (cell_params("pp", bw="none", loss="0.1pct"), 0.4),
    )
    table = slowdown_table(summary)
    assert len(table) == 4
    orphans = table[table["baseline_repeats"] == 0]
    assert sorted(zip(orphans.strategy, orphans.cc, orphans.varied, strict=True)) == [
        ("ddp", "bbr", "bw"),
        ("pp", "cubic", "loss"),
    ]
    assert orphans["step_time_mean_s"].tolist() == approx([0.25, 0.4])
    for col in ("baseline_step_time_s", "slowdown_mean", "slowdown_sd", "slowdown_ci_high"):
        assert orphans[col].isna().all(), col


def test_repeats_give_mean_sd_and_an_interval_that_counts_both_spreads() -> None:
    base = [0.10, 0.11, 0.12]  # baseline mean 0.11
    slow = [0.22, 0.33, 0.275]  # slowdowns 2, 3, 2.5 against it
    summary = _summary(
        *((cell_params("ddp", bw="none", repeat=r), t) for r, t in enumerate(base)),
        *((cell_params("ddp", bw="10mbit", repeat=r), t) for r, t in enumerate(slow)),
        (cell_params("ddp", bw="1gbit", repeat=0), 0.121),
    )
    table = slowdown_table(summary)
    capped = _row(table, bw="10mbit")
    assert capped["repeats"] == 3 and capped["baseline_repeats"] == 3
    assert capped["baseline_step_time_s"] == approx(0.11)
    assert capped["step_time_mean_s"] == approx(0.275)
    assert capped["slowdown_mean"] == approx(2.5)
    assert capped["slowdown_sd"] == approx(0.5)
    # The interval of 0.275 / 0.11 counts both spreads: relative sd 0.2 (setting) and 1/11
    # (baseline), 3 repeats each: var(log r) = 0.04/3 + (1/11)²/3 = 0.016088; Welch's df
    # 0.016088² / ((0.04/3)²/2 + ((1/11)²/3)²/2) = 2.79 -> 2 (t = 4.303).
    vs, vb = 0.04 / 3, (1 / 11) ** 2 / 3
    assert (vs + vb) ** 2 / (vs**2 / 2 + vb**2 / 2) == approx(2.79, abs=0.01)
    half = 4.302653 * math.sqrt(vs + vb)
    assert capped["slowdown_ci_low"] == approx(2.5 * math.exp(-half), rel=1e-6)
    assert capped["slowdown_ci_high"] == approx(2.5 * math.exp(half), rel=1e-6)
    # The baseline against itself: mean 1, its own spread, on both sides of the ratio
    # (df 4: t = 2.776).
    unshaped = _row(table, bw="none")
    assert unshaped["slowdown_mean"] == approx(1.0)
    assert unshaped["slowdown_sd"] == approx(0.01 / 0.11)
    half = 2.776445 * math.sqrt(2 * (1 / 11) ** 2 / 3)
    assert unshaped["slowdown_ci_high"] == approx(math.exp(half), rel=1e-6)
    # A single repeat beside repeated settings: a value, no interval.
    single = _row(table, bw="1gbit")
    assert single["slowdown_mean"] == approx(1.1) and math.isnan(single["slowdown_ci_low"])
    # Caps order by rate after the baseline (10 Mbit/s, then 1 Gbit/s), not as strings.
    assert table["bw"].tolist() == ["none", "10mbit", "1gbit"]


def test_an_empty_or_paramless_summary_gives_an_empty_table() -> None:
    assert list(slowdown_table(pd.DataFrame()).columns) == SLOWDOWN_COLUMNS
    assert slowdown_table(_summary((cell_params(), 0.1)).iloc[0:0]).empty


def test_t_quantile_matches_the_tables() -> None:
    tables = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 9: 2.2622, 30: 2.0423}
    for df, critical in tables.items():
        assert t_quantile(df) == approx(critical, abs=1e-4), df
    assert t_quantile(5, level=0.99) == approx(4.0321, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile(0)
