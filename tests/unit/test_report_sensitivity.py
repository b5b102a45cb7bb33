"""The report's "Sensitivity to the link": the slowdown figure, the strategy x setting table,
the link engine per cell and the sentences computed from a synthetic study's summary."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from synthetic import cell_id, cell_params

from commscope.metrics.study import (
    derive_study_tables,
    slowdown_table,
    step_time_over_repeats,
)
from commscope.plots.study import _wrap_title, cap_series, plot_slowdown, slowdown_figure
from commscope.report import StudyResults, render_report
from commscope.report.render import _figure_entries
from commscope.report.sections._base import baseline_link
from commscope.report.sections.overview import cells_rows, link_engine_text
from commscope.report.sections.sensitivity import sensitivity_sentences, sensitivity_table
from commscope.spec.link import axes_shape
from commscope.units import fmt_slowdown

REPORT_DIR = Path(__file__).resolve().parents[2] / "report"
TEMPLATE = REPORT_DIR / "templates" / "report.html.j2"
CAPTIONS = REPORT_DIR / "captions.yaml"
NAN = float("nan")

# Unshaped step time per strategy and the factor each setting multiplies it by (two repeats,
# the second 2 % slower: every setting then has an interval).
BASE_S = {"ddp": 0.100, "pp": 0.200, "tp": 0.150}
FACTORS = {
    ("none", "0ms", "0pct"): {"ddp": 1.0, "pp": 1.0, "tp": 1.0},
    ("50mbit", "0ms", "0pct"): {"ddp": 3.0, "pp": 2.0, "tp": 12.0},
    ("none", "5ms", "0pct"): {"ddp": 1.3, "pp": 1.4, "tp": 1.9},
    ("none", "20ms", "0pct"): {"ddp": 2.2, "pp": 2.3, "tp": 3.3},
    ("none", "0ms", "1pct"): {"ddp": 1.8, "pp": 1.9, "tp": 1.7},
}
# What the engine measured in each impaired cell (both repeats alike).
LATE_US = {"5ms": (48.0, 900.0), "20ms": (52.0, 1_400.0)}
LOSS_SEEN, LOSS_DROPPED = 20_000, 203


def _link_columns(bw: str, delay: str, loss: str) -> dict[str, object]:
    numbers = axes_shape({"bw": bw, "delay": delay, "loss": loss}).numbers()
    impaired = delay != "0ms" or loss != "0pct"
    late = LATE_US.get(delay, (NAN, NAN))
    return {
        "bw_bps": numbers["bw_bps"],
        "delay_ms": numbers["delay_ms"],
        "jitter_ms": 0.0,
        "loss_pct": numbers["loss_pct"],
        "link_engine": "nfqueue" if impaired else "",
        "delay_late_us_mean": late[0],
        "delay_late_us_p99": late[1],
        "delay_undelayed_share": 0.0 if delay in LATE_US else NAN,
        "loss_packets_seen": float(LOSS_SEEN) if loss != "0pct" else NAN,
        "loss_measured_pct": 100 * LOSS_DROPPED / LOSS_SEEN if loss != "0pct" else NAN,
    }


@pytest.fixture(scope="module")
def summary() -> pd.DataFrame:
    rows = []
    for (bw, delay, loss), factors in FACTORS.items():
        for strategy, factor in factors.items():
            for repeat in (0, 1):
                params = cell_params(strategy, bw=bw, delay=delay, loss=loss, repeat=repeat)
                rows.append(
                    {
                        "cell": cell_id(params),
                        **params,
                        "world_size": 2,
                        "measured_steps": 4,
                        "step_time_mean_s": BASE_S[strategy] * factor * (1 + 0.02 * repeat),
                        **_link_columns(bw, delay, loss),
                    }
                )
    # DDP under BBR at the cap, without an unshaped BBR run: no slowdown, but listed.
    params = cell_params("ddp", bw="50mbit", cc="bbr")
    rows.append({"cell": cell_id(params), **params, "step_time_mean_s": 0.25})
    rows[-1].update(_link_columns("50mbit", "0ms", "0pct"))
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def slowdown(summary: pd.DataFrame) -> pd.DataFrame:
    return slowdown_table(summary)


def _expected(strategy: str, setting: tuple[str, str, str]) -> tuple[float, float, float]:
    """Slowdown and interval by hand. The setting's two repeats are f x the baseline's two (1 and
    1.02 x a step): the ratio of means is f; both sides have the same relative sd c, so
    var(log r) = c²/2 + c²/2 with Welch's 2 degrees of freedom (t = 4.303): f x exp(∓4.303 c)."""
    f = FACTORS[setting][strategy]
    c = np.std([1.0, 1.02], ddof=1) / 1.01
    half = 4.30265273 * c
    return f, f * np.exp(-half), f * np.exp(half)


def test_slowdown_figure_draws_each_axis_with_its_baseline(slowdown: pd.DataFrame) -> None:
    fig = slowdown_figure(slowdown)
    bw, delay, loss = fig.axes[:3]
    assert [ax.get_title() for ax in (bw, delay, loss)] == [
        "slowdown vs bandwidth cap",
        "slowdown vs one-way delay",
        "slowdown vs loss",
    ]
    # What all panels hold fixed, once, above them; one legend entry per strategy.
    assert fig.get_suptitle() == "2 nodes × 1 rank, gpt-tiny, cubic, unshaped otherwise"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ddp", "pp", "tp"]
    assert [t.get_text() for t in bw.get_xticklabels()] == ["50", "no cap"]
    assert [t.get_text() for t in delay.get_xticklabels()] == ["5", "20", "0"]
    assert [t.get_text() for t in loss.get_xticklabels()] == ["1", "0"]
    # Each strategy's line: the baseline and the settings of that axis, in x order.
    for ax, settings in (
        (delay, [("none", "0ms", "0pct"), ("none", "5ms", "0pct"), ("none", "20ms", "0pct")]),
        (loss, [("none", "0ms", "0pct"), ("none", "0ms", "1pct")]),
    ):
        bars = {bar.get_label(): bar.lines[0] for bar in ax.containers}
        assert sorted(bars) == ["ddp", "pp", "tp"]
        for strategy, line in bars.items():
            want = [_expected(strategy, s)[0] for s in settings]
            assert list(line.get_ydata()) == pytest.approx(want)
    # TP spans 12x at the cap: that panel is logarithmic, the others linear.
    assert bw.get_yscale() == "log" and delay.get_yscale() == "linear"


def test_a_panel_title_wraps_between_words_never_inside_a_quantity() -> None:
    # At 1280 px the one-line subtitle of the delay panel ran into the loss panel's.
    held = "2 nodes × 1 rank, gpt-tiny, cubic, cap 1000 Mbit/s otherwise"
    lines = _wrap_title(held).split("\n")
    assert lines == ["2 nodes × 1 rank, gpt-tiny, cubic,", "cap\u00a01000\u00a0Mbit/s otherwise"]
    assert " ".join(lines).replace("\u00a0", " ") == held
    assert _wrap_title("cubic, cap 200 Mbit/s + delay 5 ms otherwise", 20).split("\n") == [
        "cubic,", "cap\u00a0200\u00a0Mbit/s +", "delay 5\u00a0ms otherwise",
    ]  # fmt: skip


def test_slowdown_figure_says_which_panel_has_no_data(
    slowdown: pd.DataFrame, tmp_path: Path
) -> None:
    no_loss = slowdown[slowdown["varied"] != "loss"]
    fig = slowdown_figure(no_loss)
    texts = [t.get_text() for t in fig.axes[2].texts]
    assert texts == ["no cells that vary the loss alone"]
    empty = slowdown_figure(slowdown.iloc[0:0])
    assert [t.get_text() for ax in empty.axes[:3] for t in ax.texts] == [
        "no cells that vary the cap alone",
        "no cells that vary the delay alone",
        "no cells that vary the loss alone",
    ]
    png = plot_slowdown(slowdown, tmp_path / "slowdown.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_time_vs_bw_leaves_single_cap_impairments_to_the_slowdown_figure(
    summary: pd.DataFrame,
) -> None:
    # A bandwidth sweep under 5 ms delay beside the study's delay and loss cells at no cap.
    params = cell_params("ddp", bw="50mbit", delay="5ms")
    swept = {"cell": cell_id(params), **params, "step_time_mean_s": 0.5}
    swept.update(_link_columns("50mbit", "5ms", "0pct"))
    table = step_time_over_repeats(pd.concat([summary, pd.DataFrame([swept])]))
    drawn = cap_series(table)
    assert sorted(drawn["label"].unique()) == [
        "ddp (delay=0ms, cc=bbr)",
        "ddp (delay=0ms, cc=cubic)",
        "ddp (delay=5ms, cc=cubic)",  # swept over two caps: a line about the cap
        "pp (delay=0ms, cc=cubic)",
        "tp (delay=0ms, cc=cubic)",
    ]
    assert drawn.loc[drawn["label"] == "ddp (delay=5ms, cc=cubic)", "bw"].tolist() == [
        "50mbit",
        "none",
    ]
    # Without the sweep, delay no longer tells the drawn series apart.
    assert sorted(cap_series(step_time_over_repeats(summary))["label"].unique()) == [
        "ddp (cc=bbr)",
        "ddp (cc=cubic)",
        "pp (cc=cubic)",
        "tp (cc=cubic)",
    ]


def test_sensitivity_table_is_strategy_by_setting(slowdown: pd.DataFrame) -> None:
    table = sensitivity_table(slowdown)
    assert list(table.columns) == [
        "strategy",
        "unshaped step",
        "cap 50 Mbit/s",
        "delay 5 ms",
        "delay 20 ms",
        "loss 1 %",
    ]
    # Only cubic setups have a baseline: the BBR cell is not a row (the sentences list it).
    assert table["strategy"].tolist() == ["ddp", "pp", "tp"]
    tp = table.set_index("strategy").loc["tp"]
    assert tp["cap 50 Mbit/s"] == fmt_slowdown(*_expected("tp", ("50mbit", "0ms", "0pct")))
    assert tp["unshaped step"] == "151.5 ms"  # (150 + 153) / 2
    assert re.fullmatch(r"\d+\.\d\d× \[\d+\.\d\d, \d+\.\d\d\]", tp["delay 20 ms"])
    assert fmt_slowdown(1.8427) == "1.84×"


def test_sensitivity_sentences_list_orphans_and_the_engines_accuracy(
    summary: pd.DataFrame, slowdown: pd.DataFrame
) -> None:
    text = " ".join(sensitivity_sentences(slowdown, summary))
    assert (
        "1 setting had no run of its setup on the unshaped link, so no slowdown: "
        "ddp (gpt-tiny, 2x1, bbr, cap 50 Mbit/s)." in text
    )
    impaired = 3 * 2 * 3  # strategies x repeats x (two delays and one loss)
    assert "applied by the nfqueue engine (nftables random drop" in text
    assert f"in {impaired} cells." in text
    # Mean over the delay cells of the worst node's mean lateness, the range, the largest p99.
    assert "by 50 µs on average" in text and "from 48 µs to 52 µs over 12 cells" in text
    assert "99th percentile of at most 1.4 ms" in text
    assert "99th percentile of at most 1.4 ms; no packet passed undelayed." in text
    assert "dropped 1.01 % of 120,000 packets where 1 % was configured (6 cells)." in text
    assert "netem" not in text.replace("without netem", "")
    # Nothing to say without the data.
    assert sensitivity_sentences(slowdown.iloc[0:0], summary.drop(columns="link_engine")) == []


def test_slowdowns_leave_out_host_limited_cells(summary: pd.DataFrame) -> None:
    # tp's second run at 20 ms was host-limited: its slowdown rests on the first run alone, and
    # the section says one cell is left out (the monitor's verdict, docs/fidelity.md).
    tp20 = (summary["strategy"] == "tp") & (summary["delay"] == "20ms")
    marked = summary.assign(host_limited=tp20 & (summary["repeat"] == 1))
    derived = derive_study_tables(
        {"summary": marked, "msg_sizes": pd.DataFrame(), "op_volume": pd.DataFrame(),
         "step_times": pd.DataFrame()},
    )  # fmt: skip
    rows = derived["slowdown"]
    tp20 = rows[(rows["strategy"] == "tp") & (rows["delay"] == "20ms")].iloc[0]
    assert tp20["repeats"] == 1 and np.isnan(tp20["slowdown_ci_low"])
    assert tp20["slowdown_mean"] == pytest.approx(FACTORS[("none", "20ms", "0pct")]["tp"] / 1.01)
    everything = slowdown_table(summary)
    assert len(rows) == len(everything)  # the setting stays (one green run)
    text = " ".join(sensitivity_sentences(rows, marked))
    assert "leave out the cell the fidelity monitor found host-limited" in text
    assert "leave out" not in " ".join(sensitivity_sentences(everything, summary))


def test_cells_table_shows_the_link_engine(summary: pd.DataFrame) -> None:
    header, rows = cells_rows(summary)
    assert header[-1] == "link engine"
    engines = {row[-1] for row in rows}
    assert engines == {
        "—",
        "nfqueue (late 48 µs, p99 900 µs)",
        "nfqueue (late 52 µs, p99 1.4 ms)",
        "nfqueue (1.01 % dropped)",
    }
    assert link_engine_text({"link_engine": "netem"}) == "netem"
    assert link_engine_text({}) == "—"  # a summary from before the column


def test_report_has_the_sensitivity_section(
    summary: pd.DataFrame, slowdown: pd.DataFrame, tmp_path: Path
) -> None:
    summary.to_parquet(tmp_path / "summary.parquet")
    slowdown.to_parquet(tmp_path / "slowdown.parquet")
    png = plot_slowdown(slowdown, tmp_path / "fig" / "slowdown.png")
    out = tmp_path / "index.html"
    results = StudyResults(
        {
            "summary": tmp_path / "summary.parquet",
            "slowdown": tmp_path / "slowdown.parquet",
            "figures": [png],
        }
    )
    # No findings: this summary holds the sensitivity's columns only.
    render_report(
        results, out, config={"sweep": {}}, template=TEMPLATE, captions=CAPTIONS, findings=()
    )
    html = out.read_text()
    section = html[html.index('<h2 id="sensitivity">') : html.index('<h2 id="figures">')]
    # The figure sits in this section (with its caption), not among the other figures.
    assert section.count('<img src="data:image/png;base64,') == 1
    assert "<b>Slowdown on a shaped link.</b>" in section
    # Its caption names the baseline the results hold (no reference link here).
    assert "time over that of the same setup on the unshaped link, against" in section
    assert "{baseline}" not in html
    assert html.count('<img src="data:image/png;base64,') == 1
    # The table, every number from the slowdown table.
    settings = ("cap 50 Mbit/s", "delay 5 ms", "delay 20 ms", "loss 1 %")
    assert "".join(f"<th>{s}</th>" for s in settings) in section
    ddp = re.search(r"<tr><td>ddp</td>.*?</tr>", section).group(0)
    for setting in FACTORS:
        if setting != ("none", "0ms", "0pct"):
            assert f"<td>{fmt_slowdown(*_expected('ddp', setting))}</td>" in ddp, setting
    assert "ddp (gpt-tiny, 2x1, bbr, cap 50 Mbit/s)" in section
    assert "The NFQUEUE delayer released packets after their due time by 50 µs" in section
    # The cells table's engine column.
    assert "<th>link engine</th>" in html
    # (A long value may wrap anywhere: its cell is marked so.)
    assert '<td class="long">nfqueue (late 52 µs, p99 1.4 ms)</td>' in html


def test_the_slowdown_caption_names_the_reference_link(tmp_path: Path) -> None:
    """With a reference link the caption says the slowdowns are against it, not "unshaped"."""
    png = tmp_path / "slowdown.png"
    png.write_bytes(b"\x89PNG")
    results = StudyResults({}, config={"reference_link": {"name": "1 Gbit/s", "bw": "1gbit"}})
    captions = yaml.safe_load(CAPTIONS.read_text())
    entry = _figure_entries([png], captions, {"baseline": baseline_link(results)})[0]
    assert "same setup on the reference link (1 Gbit/s), against the bandwidth" in entry["caption"]
    assert "no slower than on the reference link (1 Gbit/s)" in entry["caption"]
