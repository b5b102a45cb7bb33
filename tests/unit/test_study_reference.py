"""The reference link (the config's ``reference_link``): the baseline of every slowdown and knee
when configured, the unshaped link being a setting like any other; and its checks before a
study runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from synthetic import cell_params
from synthetic import only_row as _row
from synthetic import step_summary as _summary

from commscope.metrics.study import knee_table, link_number_columns, slowdown_table, varied_axes
from commscope.spec.link import ReferenceLink
from commscope.study import reference_link_problems

approx = pytest.approx
GBIT = ReferenceLink.from_config({"name": "1 Gbit/s", "bw": "1gbit"})


def test_a_setting_is_divided_by_its_setup_on_the_reference_link() -> None:
    summary = _summary(
        (cell_params("ddp", bw="1gbit"), 0.200),
        (cell_params("ddp", bw="none"), 0.100),  # faster than the reference: slowdown < 1
        (cell_params("ddp", bw="50mbit"), 0.600),
        (cell_params("ddp", bw="1gbit", delay="5ms"), 0.300),  # the reference plus a delay
        (cell_params("ddp", bw="none", delay="5ms"), 0.250),  # off it by the cap and the delay
        (cell_params("ddp", bw="1gbit", nodes=4), 0.400),  # its own setup's baseline
    )
    table = slowdown_table(summary, GBIT)
    ddp = table[table.nodes == 2]
    assert ddp["varied"].tolist() == ["baseline", "bw", "bw", "delay", "several"]
    assert (ddp["baseline_step_time_s"] == 0.2).all()
    assert _row(table, nodes=2, bw="none", delay="0ms")["slowdown_mean"] == approx(0.5)
    assert _row(table, bw="50mbit")["slowdown_mean"] == approx(3.0)
    assert _row(table, bw="1gbit", delay="5ms")["slowdown_mean"] == approx(1.5)
    assert _row(table, nodes=4)["varied"] == "baseline"


def test_without_a_reference_the_unshaped_link_is_the_baseline() -> None:
    summary = _summary(
        (cell_params("ddp", bw="1gbit"), 0.200),
        (cell_params("ddp", bw="none"), 0.100),
    )
    table = slowdown_table(summary)
    assert _row(table, bw="none")["varied"] == "baseline"
    assert _row(table, bw="1gbit")["slowdown_mean"] == approx(2.0)
    # No cell on the reference: every slowdown is NaN, every setting still listed.
    table = slowdown_table(_summary((cell_params("ddp", bw="none"), 0.1)), GBIT)
    assert len(table) == 1 and math.isnan(table["slowdown_mean"].iloc[0])


def test_varied_names_the_axes_that_differ_from_the_reference() -> None:
    numbers = pd.DataFrame(
        {
            "bw_bps": [1e9, math.nan, 1e9, 5e7, 1e9],
            "delay_ms": [0.0, 0.0, 5.0, 5.0, math.nan],  # NaN impairment: none
            "jitter_ms": [0.0] * 5,
            "loss_pct": [0.0] * 5,
        }
    )
    assert varied_axes(numbers, GBIT).tolist() == ["baseline", "bw", "delay", "several", "baseline"]
    assert varied_axes(numbers).tolist() == ["bw", "baseline", "several", "several", "bw"]


def test_the_reference_cap_brackets_the_knee_and_the_unshaped_link_does_not() -> None:
    summary = _summary(
        (cell_params("ddp", bw="1gbit"), 0.100),
        (cell_params("ddp", bw="none"), 0.080),
        (cell_params("ddp", bw="200mbit"), 0.150),
        (cell_params("ddp", bw="50mbit"), 0.300),
    )
    knee = knee_table(slowdown_table(summary, GBIT)).iloc[0]
    assert knee["caps"] == 3  # 1 Gbit/s (the reference, slowdown 1), 200 and 50 Mbit/s
    assert (knee["cap_high_bps"], knee["cap_low_bps"]) == (1e9, 200e6)
    # 1/knee = 1/1G + (1.1 - 1) / (1.5 - 1) x (1/200M - 1/1G).
    assert knee["knee_bps"] == approx(1 / (1e-9 + 0.2 * (5e-9 - 1e-9)))


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"bw": "fast"}, "reference_link: bw='fast'"),
        ({"name": "x"}, "reference_link: needs bw"),
        ({"bw": "1gbit", "cc": "bbr"}, "reference_link.cc"),
        ({"bw": "1gbit", "delai": "1ms"}, "unknown keys ['delai']"),
        ({"bw": "1gbit", "name": " "}, "reference_link.name"),
    ],
)
def test_a_bad_reference_is_refused_naming_the_field(entry: dict, words: str) -> None:
    with pytest.raises(ValueError, match="reference_link") as err:
        ReferenceLink.from_config(entry)
    assert words in str(err.value)


def test_the_reference_is_named_and_labelled() -> None:
    assert GBIT.words == "the reference link (1 Gbit/s)"
    assert GBIT.numbers()["bw_bps"] == 1e9
    assert ReferenceLink.from_config({"bw": "1gbit"}).name == "cap 1000 Mbit/s"
    assert ReferenceLink.from_config(None) is None


def test_the_sweep_must_run_cells_on_the_reference() -> None:
    cells = pd.DataFrame(
        [
            {"bw": "1gbit", "delay": "0us", "jitter": "0ms", "loss": "0pct", "cc": "bbr"},
            {"bw": "none", "delay": "0ms", "jitter": "0ms", "loss": "0pct", "cc": "cubic"},
        ]
    )
    # 0 us is no delay and the cc belongs to the setup: the first cell is on the reference.
    assert reference_link_problems({"bw": "1gbit"}, cells) == []
    assert reference_link_problems(None, cells) == []
    (problem,) = reference_link_problems({"bw": "2gbit", "name": "2G"}, cells)
    assert "no sweep cell runs on" in problem and "remove reference_link" in problem
    assert reference_link_problems({"bw": "nope"}, cells)[0].startswith("reference_link:")


def test_the_report_names_the_reference_where_it_said_unshaped() -> None:
    from commscope.report.findings._base import comparison_group
    from commscope.report.results import StudyResults
    from commscope.report.sections._base import baseline_link
    from commscope.report.sections.sensitivity import sensitivity_intro, sensitivity_table

    summary = _summary(
        (cell_params("ddp", bw="1gbit"), 0.200),
        (cell_params("tp", bw="1gbit"), 0.300),
        (cell_params("ddp", bw="none"), 0.100),
        (cell_params("ddp", bw="50mbit"), 0.600),
    )
    summary = summary.join(link_number_columns(summary))  # the summary's link numbers
    results = StudyResults(
        tables={"summary": summary}, config={"reference_link": {"name": "1 Gbit/s", "bw": "1gbit"}}
    )
    assert baseline_link(results) == "the reference link (1 Gbit/s)"
    assert "the reference link (1 Gbit/s), a link this host" in sensitivity_intro(results)
    table = sensitivity_table(slowdown_table(summary, GBIT), GBIT)
    # The unshaped setting first (no cap), then the caps from the highest.
    assert list(table.columns) == ["strategy", "step on 1 Gbit/s", "unshaped", "cap 50 Mbit/s"]
    assert table.iloc[0]["step on 1 Gbit/s"] == "200.0 ms"
    # The comparison group is the setup on the reference link, where both strategies ran.
    assert sorted(comparison_group(summary, GBIT)["strategy"]) == ["ddp", "tp"]
    assert comparison_group(summary).empty  # only ddp ran unshaped
    no_reference = StudyResults(tables={"summary": summary}, config={})
    assert baseline_link(no_reference) == "the unshaped link"
