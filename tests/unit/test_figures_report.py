"""Figures and the HTML report, drawn from a small synthetic study (2 strategies x 2 caps x 2
repeats) whose headline numbers are known."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from synthetic import make_ddp_cell, make_hybrid_cell

import commscope
from commscope import metrics, units
from commscope.contracts import METRIC_TABLES, STUDY_FIGURES, STUDY_TABLES
from commscope.metrics.io import aggregate_tables
from commscope.metrics.study import (
    STUDY_SOURCES,
    alpha_beta_curve,
    bytes_per_step_by_op,
    cross_node_share,
    derive_study_tables,
)
from commscope.plots import matrices, scenarios
from commscope.plots.cell import plot_cell_throughput
from commscope.plots.study import plot_study, study_figure_paths, study_table_paths
from commscope.report import StudyResults, render_report, software_versions, strategy_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The report's template and captions live in the repository, passed in as the rule does.
REPORT_DIR = Path(__file__).resolve().parents[2] / "report"
TEMPLATE = REPORT_DIR / "templates" / "report.html.j2"
CAPTIONS = REPORT_DIR / "captions.yaml"
STRATEGY_BUCKETS = {"ddp": (600_000, 400_000), "fsdp": (50_000, 20_000, 5_000)}
CONFIG = {
    "sweep": {"strategy": ["ddp", "fsdp"], "bw": ["10mbit", "none"], "repeats": 2},
    "cluster": {"backend": "netns", "nodes": 2, "state_dir": Path("/tmp/state")},
}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("study")
    metric_dirs, cells = [], {}
    for strategy, buckets in STRATEGY_BUCKETS.items():
        for bw in ("10mbit", "none"):
            for repeat in (0, 1):
                # Step time grows with the cap's scarcity and a little with the repeat, so the
                # sensitivity plot has something to show.
                slow = 3.0 if bw == "10mbit" else 1.0
                step_ms = [120.0] + [100.0 * slow + 2 * repeat] * 3
                cell = make_ddp_cell(
                    root / "runs",
                    strategy=strategy,
                    bw=bw,
                    repeat=repeat,
                    bucket_bytes=buckets,
                    step_ms=step_ms,
                )
                out = root / "metrics" / cell.relative_to(root / "runs")
                metrics.compute_cell_metrics(cell, out)
                metric_dirs.append(out)
                cells[metrics.load_cell(cell).meta["cell"]] = (cell, out)
    metrics.aggregate_cells(metric_dirs, root / "agg")
    return {"root": root, "agg": root / "agg", "cells": cells}


def _study_figures(agg: Path, out_dir: Path) -> list[Path]:
    return plot_study(study_table_paths(agg), study_figure_paths(out_dir))


def _cell_figure(metrics_dir: Path, out_png: Path) -> Path:
    """The cell figure from the metric tables the rule declares."""
    return plot_cell_throughput(
        metrics_dir / "throughput.parquet",
        metrics_dir / "step_times.parquet",
        metrics_dir / "summary.parquet",
        out_png,
    )


def _render(agg: Path, study_figs: list[Path], cell_figs: dict[str, Path], out: Path) -> None:
    # The aggregate's tables, the figures, and each cell's status naming its figure, as the
    # report rule declares them.
    names = ("summary", "slowdown", "crosscheck", "matrix_check")
    statuses = []
    for i, (cell, png) in enumerate(cell_figs.items()):
        status = {"cell": cell, "ran": True, "failure": None, "products": {"figure": str(png)}}
        statuses.append(out.parent / f"status-{i}.json")
        statuses[-1].parent.mkdir(parents=True, exist_ok=True)
        statuses[-1].write_text(json.dumps(status))
    results = StudyResults(
        {
            **{name: agg / f"{name}.parquet" for name in names},
            "figures": study_figs,
            "status": statuses,
        }
    )
    # The template's own sections only (the table sections have tests of their own).
    render_report(results, out, config=CONFIG, template=TEMPLATE, captions=CAPTIONS, sections=())


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5_000, path  # a real plot, not an empty canvas


def test_plot_cell_throughput_writes_png_deterministically(study: dict, tmp_path: Path) -> None:
    _cell_dir, metrics_dir = next(iter(study["cells"].values()))
    first = _cell_figure(metrics_dir, tmp_path / "a.png")
    second = _cell_figure(metrics_dir, tmp_path / "b.png")
    assert first == tmp_path / "a.png"
    _assert_png(first)
    assert first.read_bytes() == second.read_bytes()


def test_plot_study_writes_every_figure(study: dict, tmp_path: Path) -> None:
    paths = _study_figures(study["agg"], tmp_path / "fig")
    assert [p.name for p in paths] == [f"{name}.png" for name in STUDY_FIGURES]
    for path in paths:
        _assert_png(path)


def test_plot_study_survives_empty_tables(study: dict, tmp_path: Path) -> None:
    agg = tmp_path / "agg"
    agg.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    for name in METRIC_TABLES:
        table = pd.read_parquet(study["agg"] / f"{name}.parquet")
        table.iloc[0:0].to_parquet(empty / f"{name}.parquet")
    # The aggregate job's way: the study tables derived from the (empty) aggregated tables.
    aggregate_tables(
        {name: [empty / f"{name}.parquet"] for name in METRIC_TABLES},
        {name: agg / f"{name}.parquet" for name in (*METRIC_TABLES, *STUDY_TABLES)},
    )
    for path in _study_figures(agg, tmp_path / "fig"):
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_study_survives_an_aggregate_without_matrices(study: dict, tmp_path: Path) -> None:
    # An aggregate written before the matrix tables existed: "no data" figures, no failure.
    agg = tmp_path / "agg"
    agg.mkdir()
    for name in {*METRIC_TABLES, *STUDY_TABLES} - {"comm_matrix", "node_matrix"}:
        (agg / f"{name}.parquet").write_bytes((study["agg"] / f"{name}.parquet").read_bytes())
    paths = _study_figures(agg, tmp_path / "fig")
    assert [p.name for p in paths] == [f"{name}.png" for name in STUDY_FIGURES]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC


@pytest.fixture(scope="module")
def hybrid_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dp x tp with TP inside vs across nodes, two caps and two repeats each; plus a DDP cell on
    3 nodes at 1 Gbit/s whose payload is 1000x smaller (the colour scale turns logarithmic)."""
    root = tmp_path_factory.mktemp("hybrid")
    dirs = []
    for inside in (True, False):
        for bw in ("10mbit", "none"):
            for repeat in (0, 1):
                cell = make_hybrid_cell(root / "runs", tp_inside_node=inside, bw=bw, repeat=repeat)
                dirs.append(root / "metrics" / cell.relative_to(root / "runs"))
                metrics.compute_cell_metrics(cell, dirs[-1])
    for nodes in (2, 3):
        cell = make_ddp_cell(root / "runs", nodes=nodes, bucket_bytes=(1000,))
        dirs.append(root / "metrics" / cell.relative_to(root / "runs"))
        metrics.compute_cell_metrics(cell, dirs[-1])
    metrics.aggregate_cells(dirs, root / "agg")
    return root / "agg"


def test_representative_cells(hybrid_study: Path) -> None:
    node_mat = pd.read_parquet(hybrid_study / "node_matrix.parquet")
    summary = pd.read_parquet(hybrid_study / "summary.parquet")
    chosen = matrices.representative_cells(node_mat, summary)
    # One per strategy: the most nodes, no cap before any cap, the first repeat.
    assert chosen["strategy"].tolist() == ["ddp", "dpxtp-tp-across", "dpxtp-tp-inside"]
    assert chosen["nodes"].tolist() == [3, 2, 2]
    assert chosen["bw"].tolist() == ["1gbit", "none", "none"]
    assert chosen["repeat"].tolist() == [0, 0, 0]
    # Without the summary the caps are unknown: still one deterministic cell per strategy.
    assert len(matrices.representative_cells(node_mat)) == 3
    assert matrices.representative_cells(pd.DataFrame()).empty


def test_plot_comm_matrices(hybrid_study: Path, tmp_path: Path) -> None:
    summary = pd.read_parquet(hybrid_study / "summary.parquet")
    first, second = (
        matrices.plot_comm_matrices(
            hybrid_study / "node_matrix.parquet",
            hybrid_study / "comm_matrix.parquet",
            summary,
            out / "comm_matrix_nodes.png",
            out / "comm_matrix_ranks.png",
        )
        for out in (tmp_path / "a", tmp_path / "b")
    )
    assert [p.name for p in first] == ["comm_matrix_nodes.png", "comm_matrix_ranks.png"]
    for a, b in zip(first, second, strict=True):
        _assert_png(a)
        assert a.read_bytes() == b.read_bytes()  # same data, same bytes


def test_bytes_per_step_by_op_means_over_measured_steps(study: dict) -> None:
    agg = study["agg"]
    table = bytes_per_step_by_op(
        pd.read_parquet(agg / "op_volume.parquet"), pd.read_parquet(agg / "step_times.parquet")
    ).set_index(["strategy", "op"])
    # Two ranks each send the whole gradient in every measured step; the step -1 broadcast
    # and the warm-up step are left out; barriers have no payload.
    assert table.loc[("ddp", "allreduce"), "bytes_per_step"] == 2_000_000
    assert table.loc[("fsdp", "allreduce"), "bytes_per_step"] == 150_000
    assert table.loc[("ddp", "barrier"), "bytes_per_step"] == 0
    assert ("ddp", "broadcast") not in table.index
    assert table.loc[("ddp", "allreduce"), "cells"] == 4


def test_strategy_table(study: dict) -> None:
    summary = pd.read_parquet(study["agg"] / "summary.parquet")
    table = strategy_table(summary).set_index("strategy")
    assert table.loc["ddp", "cells"] == 4
    assert table.loc["ddp", "framework_bytes_per_step"] == 2_000_000
    assert table.loc["fsdp", "messages_per_step"] == 8  # 2 ranks x (3 buckets + barrier)
    # (3 x 300 + 3 x 100 + 2 + 2 x 302 + ... ) ms: mean over caps and repeats.
    assert table.loc["ddp", "step_time_mean_s"] == pytest.approx((0.3 + 0.302 + 0.1 + 0.102) / 4)
    assert table.loc["ddp", "wire_over_framework"] == pytest.approx(1.05)


def test_formatters() -> None:
    assert units.fmt_bytes(2_000_000) == "2.00 MB"
    assert units.fmt_bytes(150_000) == "150.00 kB"
    assert units.fmt_bytes(512) == "512 B"
    assert units.fmt_bytes(float("nan")) == "n/a"
    assert units.fmt_bps(84e6) == "84.0 Mbit/s"
    assert units.fmt_bps(1.5e9) == "1.5 Gbit/s"
    assert units.fmt_ms(0.1) == "100.0 ms"
    assert units.fmt_ratio(1.05) == "1.05"
    assert units.fmt_ratio(None) == "n/a"
    assert units.fmt_count(6.0) == "6"


def test_software_versions() -> None:
    versions = software_versions()
    for key in ("python", "torch", "commscope", "snakemake", "pandas", "kernel"):
        assert versions[key], key
    assert versions["pandas"] == pd.__version__
    assert versions["commscope"] == commscope.__version__


def test_render_report_is_self_contained(study: dict, tmp_path: Path) -> None:
    study_figs = _study_figures(study["agg"], tmp_path / "fig")
    cell_figs = {
        cell: _cell_figure(m_dir, tmp_path / f"{i}.png")
        for i, (cell, (_c_dir, m_dir)) in enumerate(sorted(study["cells"].items())[:2])
    }
    out = tmp_path / "report" / "index.html"
    _render(study["agg"], study_figs, cell_figs, out)
    html = out.read_text()

    assert html.startswith("<!DOCTYPE html>")
    assert html.count('<img src="data:image/png;base64,') == len(study_figs) + len(cell_figs)
    # Folded: each cell's figure and the config; the per-cell tables in sections of their own.
    assert html.count("<details>") == len(cell_figs) + 1
    assert '<details class="section" id="run">' in html
    for cell in cell_figs:
        assert f"<summary>{cell}</summary>" in html
    # The summary numbers, formatted for humans (ddp row, then fsdp row).
    ddp_row = re.search(r"<tr><td class=\"text\">ddp</td>.*?</tr>", html).group(0)
    for text in ("2.00 MB", "201.0 ms", ">6<", "1.05 MB", "1.05</td>"):
        assert text in ddp_row, text
    fsdp_row = re.search(r"<tr><td class=\"text\">fsdp</td>.*?</tr>", html).group(0)
    assert "150.00 kB" in fsdp_row and ">8<" in fsdp_row
    # Every cell is listed, the config is there as YAML, versions too.
    assert html.count("<td>10mbit</td>") == 4 and html.count("<td>none</td>") == 4
    assert "  strategy:\n  - ddp\n  - fsdp" in html
    assert "state_dir: /tmp/state" in html  # a Path in the config does not break the dump
    assert '<th class="text">torch</th>' in html
    # Nothing outside the file is referenced (base64 payloads stripped first: their alphabet
    # can spell anything).
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    assert not re.search(r"https?:", text)
    assert not re.search(r"(src|href)=\"(?!data:|#)", html)  # links inside the page only
    # Findings first, computed from the tables (ddp and fsdp unshaped and at 10 Mbit/s), each
    # linking to a section of the page.
    # (One list per research question and source.)
    findings_list = "".join(re.findall(r'<ol class="findings">(.*?)</ol>', html, re.S))
    assert "Most sensitive to bandwidth" in findings_list
    assert "sends the most bytes across nodes per step" in findings_list
    for target in re.findall(r'href="#([a-z0-9-]+)"', html):
        assert f'id="{target}"' in html, target
    assert html.index('id="findings"') < html.index('id="run"')
    # The abstract opens the page; the figures come before any per-cell table.
    assert html.index('id="abstract"') < html.index('id="findings"')
    assert html.index('id="figures"') < html.index('id="detail"') < html.index('id="run"')
    assert "cells ran on 2 nodes" in html
    assert "<link" not in text and "<script" not in text


def test_report_embeds_the_communication_matrices(hybrid_study: Path, tmp_path: Path) -> None:
    study_figs = _study_figures(hybrid_study, tmp_path / "fig")
    out = tmp_path / "index.html"
    _render(hybrid_study, study_figs, {}, out)
    html = out.read_text()
    assert html.count('<img src="data:image/png;base64,') == len(study_figs)
    for title in ("Communication matrix between nodes", "Communication matrix between ranks"):
        assert f"<b>{title}.</b>" in html
    assert "Rows send, columns receive" in html
    assert "<th>inter-node bytes / step (model)</th>" in html
    # TP across nodes puts 8 MB a step on the network, TP inside a node 1 MB.
    across = re.search(r"<tr><td class=\"text\">dpxtp-tp-across</td>.*?</tr>", html).group(0)
    inside = re.search(r"<tr><td class=\"text\">dpxtp-tp-inside</td>.*?</tr>", html).group(0)
    assert "<td>8.00 MB</td><td>1.00 MB</td>" in across
    assert "<td>1.00 MB</td><td>8.00 MB</td>" in inside


def test_scenario_heatmaps(tmp_path: Path) -> None:
    """Predicted scenarios' node x node heatmaps: one per scenario (from the table or its
    parquet file: same PNG bytes) and several side by side on one colour scale."""
    from commscope.predict.scenarios import predict_scenario, write_scenario

    tiny = {
        "model": {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4},
        "pp": 2,
        "tp": 2,
        "microbatches": 4,
        "gpus_per_node": 2,
        "framework": "torch",
        "dtype_bytes": 4,
    }
    inside = predict_scenario(tiny | {"mapping": "pp-dp-tp"}, "tp-inside")
    across = predict_scenario(tiny | {"mapping": "tp-dp-pp"}, "tp-across")
    write_scenario(inside, tmp_path / "inside")
    first = scenarios.plot_scenario_heatmap(inside.node_matrix, tmp_path / "a.png")
    again = scenarios.plot_scenario_heatmap(
        tmp_path / "inside" / "node_matrix.parquet", tmp_path / "b.png"
    )
    _assert_png(first)
    assert first.read_bytes() == again.read_bytes()
    both = scenarios.plot_scenario_heatmaps(
        [inside.node_matrix, across.node_matrix], tmp_path / "c.png"
    )
    _assert_png(both)
    # The panel is the node matrix summed over traffic types, titled with the inter-node share.
    title, grid, nodes = scenarios._scenario_panel(across.node_matrix)
    assert nodes == [0, 1] and grid.shape == (2, 2)
    job = across.table().set_index("traffic").loc["all"]
    assert grid.to_numpy().trace() == pytest.approx(job["intra_node_bytes"])
    assert grid.to_numpy().sum() == pytest.approx(job["sent_bytes"])
    assert title.startswith("tp-across\n") and f"{job['inter_node_share']:.1%} of bytes" in title
    _assert_png(scenarios.plot_scenario_heatmaps([], tmp_path / "empty.png"))


def test_aggregate_writes_the_study_tables(study: dict) -> None:
    # The aggregate job derives the tables the study figures draw; plots only read them.
    agg = study["agg"]
    sources = {name: pd.read_parquet(agg / f"{name}.parquet") for name in STUDY_SOURCES}
    for name, table in derive_study_tables(sources).items():
        pd.testing.assert_frame_equal(
            pd.read_parquet(agg / f"{name}.parquet"), table.reset_index(drop=True)
        )
    assert set(STUDY_TABLES) <= set(study_table_paths(agg))


def test_aggregate_slowdown_of_the_synthetic_study(study: dict) -> None:
    # Each strategy's 10 Mbit/s repeats (300 and 302 ms steps) over its unshaped runs' mean
    # step (100 and 102 ms): a slowdown per repeat, averaged, with its interval.
    table = pd.read_parquet(study["agg"] / "slowdown.parquet").set_index(["strategy", "bw"])
    per_repeat = pd.Series([0.300 / 0.101, 0.302 / 0.101])
    for strategy in STRATEGY_BUCKETS:
        capped = table.loc[(strategy, "10mbit")]
        assert capped["varied"] == "bw" and capped["repeats"] == 2
        assert capped["baseline_repeats"] == 2
        assert capped["baseline_step_time_s"] == pytest.approx(0.101)
        assert capped["slowdown_mean"] == pytest.approx(per_repeat.mean())
        assert capped["slowdown_sd"] == pytest.approx(per_repeat.std())
        assert capped["slowdown_ci_low"] < capped["slowdown_mean"] < capped["slowdown_ci_high"]
        assert table.loc[(strategy, "none"), "varied"] == "baseline"
    # Cells run before there was a link engine: none named, nothing measured.
    summary = pd.read_parquet(study["agg"] / "summary.parquet")
    assert (summary["link_engine"] == "").all() and summary["delay_late_us_mean"].isna().all()


def test_cross_node_share_and_alpha_beta_curve() -> None:
    grid = pd.DataFrame([[3.0, 1.0], [0.0, 4.0]])
    assert cross_node_share(grid) == pytest.approx(1 / 8)
    assert cross_node_share(pd.DataFrame([[0.0]])) is None
    fit = {"alpha_s": 1e-3, "beta_Bps": 1e6, "group_size": 2, "backend": "gloo"}
    sizes, times = alpha_beta_curve(fit, "reduce_scatter", 1024, 2**20, points=5)
    assert len(sizes) == len(times) == 5 and sizes[0] == 1024
    # gloo's reduce-scatter is a full all-reduce: on 2 ranks the whole buffer crosses the link.
    assert times[-1] == pytest.approx(1e-3 + 2**20 / 1e6)
