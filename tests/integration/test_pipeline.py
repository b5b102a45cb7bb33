"""The real pipeline on a tiny study: `snakemake report` in a temporary directory.

2 nodes, DDP and PP, an unshaped and a capped link, a few steps. Checks the numbers against
physics, then that reruns follow only changed cells, then that nothing is left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from commscope.cluster.teardown import list_netns

from .browser import check_in_browser, chromium

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The tiny study, with comments, as a config file: what `snakemake --configfile` reads. Its
# cluster name and subnets are test-only: a real study may run concurrently.
TINY = REPO / "tests" / "config" / "tiny.yaml"
CONFIG = yaml.safe_load(TINY.read_text())
NAME = CONFIG["cluster"]["name"]
BASE = CONFIG["sweep"][0]


def snakemake(
    workdir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]
    return subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=1800, env=env or None
    )


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run into {rule: count}."""
    counts = {}
    for line in dry_run_output.split("Job stats:")[-1].splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # No config/config.yaml in the study directory: the Snakefile's default config would be
    # merged under --configfile's, so the tiny study is all there is.
    workdir = tmp_path_factory.mktemp("study")
    result = snakemake(workdir, "--cores", "2", "report", "--configfile", str(TINY))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return workdir


def _cell_dirs(workdir: Path, strategy: str) -> dict[str, Path]:
    runs = workdir / "results" / "runs" / f"strategy~{strategy}"
    return {p.parent.parent.name: p for p in runs.rglob("trace/cell.json")}


def test_report_is_self_contained(study: Path) -> None:
    html = (study / "results" / "report" / "index.html").read_text()
    assert html.count("data:image/png;base64,") >= 3
    assert not re.search(r"""(src|href)=["']https?://""", html)
    for strategy in ("ddp", "pp"):
        assert strategy in html


@pytest.mark.skipif(chromium() is None, reason="needs chromium (Debian package)")
def test_report_reads_well_in_chromium(study: Path, tmp_path: Path) -> None:
    """As a reader meets it: no sideways scrolling of the page (wide tables scroll in their
    box), every image decodes, no script or console error, and findings to read first."""
    result = check_in_browser(study / "results" / "report" / "index.html", tmp_path)
    assert result["overflow_px"] <= 0, result
    assert result["images"] > 0 and result["broken_images"] == [], result
    assert result["problems"] == [], result
    assert result["findings"] >= 1, result


def test_ddp_allreduce_bytes_equal_gradient_bytes(study: Path) -> None:
    for cell_json in _cell_dirs(study, "ddp").values():
        meta = json.loads(cell_json.read_text())
        ops = pd.read_parquet(cell_json.parent / "ops.parquet")
        measured = ops[ops.step >= 0]
        assert set(measured.op) <= {"allreduce", "broadcast"}
        per_step = measured[measured.op == "allreduce"].groupby(["rank", "step"])["bytes"].sum()
        assert len(per_step) == 2 * 4
        assert (per_step == meta["grad_bytes"]).all(), per_step


def test_pp_sends_only_between_adjacent_stages(study: Path) -> None:
    for cell_json in _cell_dirs(study, "pp").values():
        ops = pd.read_parquet(cell_json.parent / "ops.parquet")
        p2p = ops[(ops.step >= 1) & ops.op.isin(["send", "recv"])]
        assert set(zip(p2p["rank"], p2p["peer"], strict=True)) == {(0, 1), (1, 0)}
        # 1F1B over 2 micro-batches: stage 0 sends 2 activations, stage 1 sends 2 gradients.
        sends = p2p[p2p.op == "send"].groupby(["rank", "step"]).size()
        assert (sends == 2).all(), sends


def test_mapping_moves_tp_traffic_between_nodes(study: Path) -> None:
    """Same degrees, other placement: TP all-reduces stay on a node or cross the network."""
    internode = {}
    for strategy in ("tp-inside", "tp-across"):
        (cell_json,) = _cell_dirs(study, strategy).values()
        ops = pd.read_parquet(cell_json.parent / "ops.parquet")
        tp_groups = set(ops[(ops.step >= 1) & (ops.source == "functional")].group_ranks)
        expected = {"0,1", "2,3"} if strategy == "tp-inside" else {"0,2", "1,3"}
        assert tp_groups == expected, (strategy, tp_groups)
        wire = pd.read_parquet(cell_json.parent.parent / "metrics" / "wire.parquet")
        # The inter-node bytes the ops imply under this placement are what the wire carried.
        assert wire.wire_over_framework.between(0.98, 1.25).all(), wire
        internode[strategy] = wire.wire_tx_bytes.sum()
    # Inside, only the DP gradient sync (~280 KB/rank/step here) crosses nodes; across, the TP
    # activation all-reduces do (6 per layer of 32 KB: ~384 KB/rank/step).
    assert internode["tp-across"] > 1.15 * internode["tp-inside"], internode


def test_wire_bytes_cover_framework_bytes(study: Path) -> None:
    for strategy in ("ddp", "pp", "tp-inside", "tp-across"):
        for cell_json in _cell_dirs(study, strategy).values():
            wire = pd.read_parquet(cell_json.parent.parent / "metrics" / "wire.parquet")
            assert len(wire) == 2
            # Headers, TCP acks and the rendezvous store come on top; never less than the payload.
            assert (wire.wire_tx_bytes >= wire.framework_tx_bytes).all(), wire
            assert (wire.framework_tx_bytes > 0).all()


def test_step_time_grows_as_the_cap_shrinks(study: Path) -> None:
    summary = pd.read_parquet(study / "results" / "aggregate" / "summary.parquet")
    ddp = summary[summary.strategy == "ddp"].set_index("bw")["step_time_mean_s"]
    # ~540 KB of gradients per step: ~0.2 s at 20 Mbit/s, milliseconds unshaped.
    assert ddp["20mbit"] > 3 * ddp["none"], ddp


def test_counters_sampled_fast_enough(study: Path) -> None:
    for cell_json in _cell_dirs(study, "ddp").values():
        counters = pd.read_parquet(cell_json.parent / "counters.parquet")
        for _, node in counters.groupby("node"):
            duration_s = (node.t_ns.max() - node.t_ns.min()) / 1e9
            assert len(node) / duration_s >= 100


def test_nothing_to_do_after_a_full_run(study: Path) -> None:
    result = snakemake(study, "-n", "report", "--configfile", str(TINY))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr


def test_adding_a_cell_reruns_only_that_cell(study: Path, tmp_path: Path) -> None:
    config = dict(CONFIG, sweep=[dict(BASE, bw=["20mbit", "none", "50mbit"]), CONFIG["sweep"][1]])
    changed = tmp_path / "changed.yaml"
    # sort_keys=False: the study ran from tiny.yaml's key order, and Snakemake compares params
    # (dicts) in order, so a sorted dump alone would look like a change of every cell.
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    result = snakemake(study, "-n", "report", "--configfile", str(changed))
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout)
    # Two new cells (ddp and pp at 50mbit): their runs and statuses (run_cell is a checkpoint:
    # a cell's analysis joins the DAG once it ran), the new link's microbenchmark, then one of
    # each across-cell job. The predictions beyond the cluster stay as they are.
    assert counts == {
        "run_cell": 2,
        "cell_status": 2,
        "microbench_run": 1,
        "microbench_analyse": 1,
        "microbench_tables": 1,
        "microbench_figures": 1,
        "aggregate": 1,
        "learning": 1,
        "study_figures": 1,
        "report": 1,
    }, counts
    assert "bw~20mbit" not in result.stdout.split("rule run_cell")[-1].split("rule ")[0]


def test_unused_config_change_reruns_only_the_report(study: Path, tmp_path: Path) -> None:
    models = {"tiny": CONFIG["models"]["tiny"], "other": dict(CONFIG["models"]["tiny"], batch=8)}
    # Same cells (model axis unchanged), one unused model added: no cell reruns; only the
    # report, which shows the config, is redone.
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(dict(CONFIG, models=models), sort_keys=False))
    result = snakemake(study, "-n", "report", "--configfile", str(changed))
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout) == {"report": 1}


def test_cluster_torn_down_after_the_workflow(study: Path) -> None:
    assert not [ns for ns in list_netns() if ns.startswith(f"cs-{NAME}-")]
    leftovers = subprocess.run(
        ["pgrep", "-af", "[c]ommscope.(sampler|workload)"], capture_output=True, text=True
    ).stdout
    assert NAME not in leftovers and "commscope-" not in leftovers, leftovers


def test_bad_config_stops_before_anything_runs(tmp_path: Path) -> None:
    bad = dict(CONFIG, sweep=dict(BASE, strategy=["tp"], nodes=[4]))
    bad["models"] = {"tiny": dict(CONFIG["models"]["tiny"], heads=2)}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(bad))
    result = snakemake(tmp_path, "--cores", "1", "report")
    assert result.returncode != 0
    assert "model.heads" in result.stderr and "divisible by 4" in result.stderr
    assert not (tmp_path / "results").exists()
    assert not [ns for ns in list_netns() if ns.startswith(f"cs-{NAME}-")]


def test_exports_exist_for_every_cell(study: Path) -> None:
    for cell_json in (study / "results" / "runs").rglob("trace/cell.json"):
        export = cell_json.parent.parent / "export"
        assert json.loads((export / "trace.json").read_text())["traceEvents"]
        assert (export / "flows.csv").stat().st_size > 0
        assert sorted(p.name for p in (export / "chakra").glob("*.et"))
        # The ready-to-run ASTRA-sim input set beside the traces.
        for name in ("comm_group.json", "network.yml", "system.json", "run_astra.sh"):
            assert (export / "chakra" / name).stat().st_size > 0, name
    # The report's export section gives the command and a row per cell.
    html = (study / "results" / "report" / "index.html").read_text()
    assert "Exports for simulators: ASTRA-sim" in html and "run_astra.sh" in html


def test_prediction_matches_every_dense_cell_exactly(study: Path) -> None:
    compares = list((study / "results" / "runs").rglob("predict/compare.parquet"))
    assert len(compares) == 6
    for path in compares:
        compare = pd.read_parquet(path)
        assert len(compare) > 0
        # Bytes and message counts per rank, measured step and traffic type.
        assert compare["match"].all(), compare[~compare["match"]]
    html = (study / "results" / "report" / "index.html").read_text()
    assert "Predicted vs measured traffic" in html


def test_wire_and_recorded_ops_agree_in_every_cell(study: Path) -> None:
    """The cross-validation the report shows: per node and direction, and per node pair
    from the packet-header capture, every cell of every strategy passes."""
    agg = study / "results" / "aggregate"
    check = pd.read_parquet(agg / "crosscheck.parquet")
    assert check["cell"].nunique() == 6
    assert check["passed"].all(), check[~check["passed"]]
    matrix = pd.read_parquet(agg / "matrix_check.parquet")
    # 2 nodes: each cell has the pairs (0, 1) and (1, 0), measured on the wire.
    assert matrix.groupby("cell").size().eq(2).all() and matrix["cell"].nunique() == 6
    assert matrix["passed"].all(), matrix[~matrix["passed"]]
    for cell_json in (study / "results" / "runs").rglob("trace/cell.json"):
        sockets = pd.read_parquet(cell_json.parent / "sockets.parquet")
        assert set(sockets.node) == {0, 1} and (sockets.bytes_acked > 0).any()
    html = (study / "results" / "report" / "index.html").read_text()
    assert "Wire vs recorded ops, per cell" in html


def test_microbenchmarks_reach_the_cap_and_feed_the_step_time(study: Path) -> None:
    bench = study / "results" / "microbench"
    summary = pd.read_parquet(bench / "summary.parquet")
    assert set(summary.bw) == {"20mbit", "none"}
    ops = {"allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"}
    assert set(summary.op) == ops
    capped = summary[(summary.bw == "20mbit") & (summary.bytes == summary.bytes.max())]
    # One-way transfers of 1 MiB at 20 Mbit/s run at the cap, never above it.
    best = capped.set_index("op").utilization
    assert 0.8 <= best["sendrecv"] <= 1.02 and best["allreduce"] <= 1.02, best
    fit = pd.read_parquet(bench / "fit.parquet")
    assert len(fit) == 2 * len(ops) and (fit.beta_Bps > 0).all()
    for timing in (study / "results" / "runs").rglob("predict/timing.parquet"):
        row = pd.read_parquet(timing).iloc[0]
        assert row.predicted_step_s > 0 and row.measured_step_s > 0
    html = (study / "results" / "report" / "index.html").read_text()
    for title in ("alpha-beta fits", "Predicted vs measured step time", "Beyond the cluster"):
        assert title in html
    table = pd.read_parquet(study / "results" / "predictions" / "table.parquet")
    assert set(table.scenario) == {"gpt-1.5b-16"}


def test_a_failed_cell_still_ends_in_a_report_and_runs_again_next_time(
    study: Path, tmp_path: Path
) -> None:
    """Issue 23: a cell that keeps failing is left out, listed at the top of the report and
    named by the command's error (exit non-zero, the report written); the next invocation runs
    only that cell again. On a copy of the study, with one cell added whose every attempt
    fails (COMMSCOPE_FAULT_CELLS), then without the fault."""
    work = tmp_path / "study"
    shutil.copytree(study, work, symlinks=True)
    config = dict(CONFIG, sweep=[dict(BASE, bw=["20mbit", "none", "50mbit"], strategy=["ddp"])])
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config, sort_keys=False))
    new = "strategy~ddp/model~tiny/nodes~2/ranks_per_node~1/bw~50mbit/"
    env = dict(os.environ, COMMSCOPE_FAULT_CELLS=re.escape(new))
    failed = snakemake(work, "--cores", "2", "report", "--configfile", str(changed), env=env)
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0, out[-3000:]
    assert "1 cell(s) failed after their attempts" in out and new in out, out[-3000:]
    log = next((work / "results" / "logs" / "run_cell").rglob("bw~50mbit/**/*.log")).read_text()
    assert "attempt 3 of 3 (attempt 2 failed in provision: injected fault" in log
    html = (work / "results" / "report" / "index.html").read_text()
    assert "Failed cells" in html and "ddp (tiny, 2 x 1, bw 50mbit" in html
    # The cells that ran are all in it; the findings that could have used the cell say so.
    assert "Computed without 1 failed cell" in html
    (released,) = json.loads((work / "results" / "failed_cells.json").read_text())
    assert released.startswith(new)
    # What the next invocation does: that one cell, then the study-wide jobs.
    dry = snakemake(work, "-n", "report", "--configfile", str(changed))
    counts = job_counts(dry.stdout)
    assert counts["run_cell"] == 1 and counts["cell_status"] == 1, counts
    again = snakemake(work, "--cores", "2", "report", "--configfile", str(changed))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    html = (work / "results" / "report" / "index.html").read_text()
    assert "Failed cells" not in html and "Computed without" not in html
    assert len(list((work / "results" / "runs").rglob("bw~50mbit/**/raw/run.json"))) == 1
