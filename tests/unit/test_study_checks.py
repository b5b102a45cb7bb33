"""The checks the Snakefile and `commscope check` share (commscope.study.study_checks): each
problem named by its key, before anything runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from commscope.config import ConfigError, load_config
from commscope.study import study_checks

ROOT = Path(__file__).resolve().parents[2]


SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


@pytest.fixture
def default(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    # The link engine's probe starts processes (tests/integration covers it): here it passes.
    monkeypatch.setattr("commscope.study.local_engine_problem", lambda requested: "")
    return load_config(ROOT / "config" / "config.yaml", SCHEMA)


def test_the_default_study_passes(default: dict[str, Any]) -> None:
    cells = study_checks(copy.deepcopy(default), ROOT)
    assert len(cells) > 50


def test_a_missing_import_a_bad_prediction_and_bench_are_named(default: dict[str, Any]) -> None:
    cfg = copy.deepcopy(default)
    cfg["imports"]["nccl-coll-log"]["paths"] = ["tests/data/nope.log"]
    cfg["predictions"]["gpt-1.5b-16gpu-default"]["nodes"] = 3
    cfg["microbench"]["max_bytes"] = 1
    with pytest.raises(ConfigError) as err:
        study_checks(cfg, ROOT)
    text = str(err.value)
    assert "imports.nccl-coll-log.paths[0]: tests/data/nope.log does not exist" in text
    assert "predictions.gpt-1.5b-16gpu-default:" in text
    assert "microbench:" in text


def test_an_ssh_inventory_is_loaded_and_checked(default: dict[str, Any], tmp_path: Path) -> None:
    cfg = copy.deepcopy(default)
    cfg["cluster"] = {"backend": "ssh", "inventory": str(tmp_path / "none.yaml")}
    with pytest.raises(ConfigError, match=r"cluster.inventory: .*none.yaml does not exist"):
        study_checks(cfg, ROOT)
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text((ROOT / "config" / "cluster.example.yaml").read_text())
    cfg["cluster"]["inventory"] = str(inventory)
    # The example lists 2 hosts; the default study runs cells on 4 nodes.
    with pytest.raises(ConfigError, match=r"sweep.nodes: 4 nodes asked for but the cluster has 2"):
        study_checks(cfg, ROOT)
