"""workflow/rules/scenarios.smk run by the snakemake executable: the rules write the
predictions table, and editing one scenario reruns only that scenario."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
TINY_SCENARIO = {
    "model": TINY,
    "pp": 2,
    "tp": 2,
    "mapping": "pp-dp-tp",
    "microbatches": 4,
    "gpus_per_node": 2,
    "framework": "torch",
    "dtype_bytes": 4,
}


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("snakemake")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(exe), "--cores", "2", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_workflow_rules_write_the_table_and_rerun_only_an_edited_scenario(
    tmp_path: Path,
) -> None:
    """workflow/rules/scenarios.smk under a throw-away Snakefile and config (two tiny
    scenarios): predict_scenario and predictions_table write their files; editing one
    scenario makes only that scenario's prediction out of date."""
    scenarios = {
        "tiny-a": TINY_SCENARIO,
        "tiny-b": TINY_SCENARIO | {"mapping": "tp-dp-pp"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"predictions": scenarios}))
    (tmp_path / "Snakefile").write_text(
        'configfile: "config.yaml"\n\n\n'
        f'include: "{REPO / "workflow" / "rules" / "scenarios.smk"}"\n'
    )
    run = _snakemake(tmp_path, "results/predictions/table.parquet")
    assert run.returncode == 0, run.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "results" / "predictions" / "table.parquet")
    assert sorted(table["scenario"].unique()) == ["tiny-a", "tiny-b"]
    for name in scenarios:
        assert (tmp_path / "results" / "logs" / "predict_scenario" / f"{name}.log").exists()
    scenarios["tiny-b"] = TINY_SCENARIO | {"mapping": "dp-pp-tp"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"predictions": scenarios}))
    dry = _snakemake(tmp_path, "-n", "results/predictions/table.parquet")
    assert dry.returncode == 0, dry.stderr[-3000:]
    text = dry.stdout + dry.stderr
    assert "name=tiny-b" in text and "name=tiny-a" not in text
    assert "params have changed" in text
