"""The report's lead: the abstract, the implications (a winner only where the repeats'
intervals separate; host-limited cells and replays never ranked) and the limitations (which
cells are host-limited, by what, how far over the bound)."""

from __future__ import annotations

import pandas as pd

from commscope.report.results import StudyResults
from commscope.report.sections import implications, limitations
from commscope.report.sections.abstract import abstract_sentences


def _cell(strategy: str, bw: float | None, step: float, repeat: int = 0, **extra) -> dict:
    return {
        "strategy": strategy, "model": "gpt-tiny", "nodes": 2, "ranks_per_node": 1,
        "cc": "cubic", "steps": 6, "repeat": repeat, "world_size": 2, "measured_steps": 4,
        "bw": "none" if bw is None else f"{bw:g}mbit", "delay": "0ms", "jitter": "0ms",
        "loss": "0pct", "bw_bps": None if bw is None else bw * 1e6, "delay_ms": 0.0,
        "jitter_ms": 0.0, "loss_pct": 0.0, "step_time_mean_s": step,
        "monitored": True, "host_limited": False, "limited_by": "", "ranks_wait_share": 0.02,
        "delayer_wait_share": 0.0, "steal_share": 0.0, "runnable_rank_threads": 1.5,
        "host_cpus": 2.0, "oversubscribed": False, **extra,
    }  # fmt: skip


def _summary() -> pd.DataFrame:
    rows = [
        # Unshaped: ddp clearly faster than pp over three repeats each.
        *(_cell("ddp", None, s, i) for i, s in enumerate([0.100, 0.101, 0.099])),
        *(_cell("pp", None, s, i) for i, s in enumerate([0.150, 0.152, 0.149])),
        # At 20 Mbit/s: overlapping repeats, no winner.
        *(_cell("ddp", 20, s, i) for i, s in enumerate([0.30, 0.50])),
        *(_cell("pp", 20, s, i) for i, s in enumerate([0.35, 0.45])),
        # At 50 Mbit/s pp would win, but its cell is host-limited: not ranked.
        _cell("ddp", 50, 0.2),
        _cell(
            "pp", 50, 0.1, host_limited=True, limited_by="ranks", ranks_wait_share=0.23,
            runnable_rank_threads=3.1, oversubscribed=True,
        ),
        # A replay is never ranked with training.
        {**_cell("replay", None, 0.01), "model": "ddp-replayed"},
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_a_winner_only_where_the_intervals_separate() -> None:
    table = implications.winners(_summary())
    unshaped = table[table["bw_bps"].isna()].iloc[0]
    assert unshaped["fastest"] == "ddp" and bool(unshaped["established"])
    assert round(unshaped["margin"], 2) == 1.5
    capped = table[table["bw_bps"] == 20e6].iloc[0]
    assert not capped["established"]
    # 50 Mbit/s: pp's only cell is host-limited, so one strategy is left: nothing to rank.
    assert (table["bw_bps"] == 50e6).sum() == 0
    assert "replay" not in set(table["fastest"]) | set(table["next"])
    text = " ".join(implications.implication_sentences(StudyResults.of(summary=_summary())))
    assert "fastest is ddp on the unshaped link (1.50× faster than pp)" in text
    assert "not established" in text


def test_limitations_name_the_host_limited_cells() -> None:
    results = StudyResults.of(summary=_summary())
    table = limitations.limited_cells(results)
    assert len(table) == 1
    row = table.iloc[0]
    assert row["cell"].startswith("pp, gpt-tiny, 2×1, cap 50 Mbit/s")
    assert "23 %" in row["limited by"] and "bound 10 %" in row["limited by"]
    text = " ".join(limitations.limitation_sentences(results, {"cluster": {"backend": "netns"}}))
    assert "watched 13 of 13 cells; 1 was host-limited" in text
    assert "1 had more runnable rank threads than the host has CPUs" in text
    assert "on a GPU" in text and "one software switch" in text


def test_a_study_without_host_limited_cells_says_none() -> None:
    """With every cell green, the abstract and the limitations say "none", not "of 0"."""
    green = _summary().assign(host_limited=False, limited_by="", oversubscribed=False)
    results = StudyResults(
        tables={"summary": green},
        config={"models": {"gpt-tiny": {"layers": 4, "hidden": 128}}, "run": {"warmup_steps": 2}},
    )
    text = " ".join(abstract_sentences(results))
    assert "watched 13 of 13 cells and found none whose step time the host, not the " in text
    assert "step time of 0" not in text
    text = " ".join(limitations.limitation_sentences(StudyResults.of(summary=green)))
    assert "watched 13 of 13 cells; none was host-limited (none where rank threads waited " in text
    assert "0 were" not in text and "listed below" not in text


def test_limitations_without_the_monitor_say_so() -> None:
    old = _summary().drop(columns=["monitored", "host_limited", "limited_by"])
    text = " ".join(limitations.limitation_sentences(StudyResults.of(summary=old)))
    assert "predate the monitor" in text


def test_abstract_from_the_cells_and_config() -> None:
    results = StudyResults(
        tables={"summary": _summary()},
        config={"models": {"gpt-tiny": {"layers": 4, "hidden": 128}}, "run": {"warmup_steps": 2}},
    )
    text = " ".join(abstract_sentences(results))
    assert "2 CPUs" in text and "network namespace" in text
    assert "gpt-tiny (a 4-layer transformer, hidden 128)" in text
    assert "strategies: ddp and pp" in text
    assert "13 cells ran on 2 nodes with 1 rank each" in text
    assert "bandwidth caps of 20, 50 Mbit/s" in text
    assert "measured 4 steps after 2 warm-up steps" in text
    assert "1 cell replayed recorded traces" in text
    # The monitor's verdict, counted (one cell of _summary is host-limited).
    limited = int(_summary()["host_limited"].sum())
    assert "watched 13 of 13 cells and found the host, not the network, set the step " in text
    assert f"step time of {limited} (listed under Limitations)" in text
    assert "Slowdowns are against" not in text  # no reference link configured


def test_abstract_names_the_reference_link() -> None:
    results = StudyResults(
        tables={"summary": _summary()},
        config={
            "models": {"gpt-tiny": {"layers": 4, "hidden": 128}},
            "run": {"warmup_steps": 2},
            "reference_link": {"name": "1 Gbit/s", "bw": "1gbit"},
        },
    )
    text = " ".join(abstract_sentences(results))
    assert "Slowdowns are against the reference link (1 Gbit/s), a cap this host" in text


def test_a_late_delayer_is_named_and_its_lateness_kept_apart() -> None:
    """A cell host-limited by its delayer's lateness: the table says how far over the bound;
    the lateness sentence gives the worst p99 of the cells the findings use and of all."""
    delayed = {"link_engine": "nfqueue", "delay": "5ms", "delay_ms": 5.0}
    rows = [
        _cell("tp", 1000, 0.2, **delayed, delay_late_us_p99=300.0, delay_late_share=0.06),
        _cell(
            "ddp", 1000, 0.3, **delayed, delay_late_us_p99=5080.0, delay_late_share=1.016,
            host_limited=True, limited_by="delay",
        ),
    ]  # fmt: skip
    results = StudyResults.of(summary=pd.DataFrame(rows))
    (row,) = limitations.limited_cells(results).to_dict("records")
    assert row["cell"].startswith("ddp, gpt-tiny, 2×1, cap 1000 Mbit/s + delay 5 ms")
    assert row["limited by"] == (
        "the packet delayer released its latest packets (99th percentile) 102 % of the delay "
        "late (bound 10 %)"
    )
    text = " ".join(limitations.limitation_sentences(results))
    assert "up to 300 µs late (99th percentile) in the cells the findings use, up to 5.08 ms" in (
        text
    )
    assert "later than 10 % of its delay is host-limited" in text
