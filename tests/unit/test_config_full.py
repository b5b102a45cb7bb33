"""config/full.yaml, the testbed study, stays a valid study when merged over the default one
(as `snakemake --configfile config/full.yaml` merges it)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from snakemake.utils import update_config

from commscope.config import check_study, validate_config

ROOT = Path(__file__).resolve().parents[2]


def test_full_study_is_valid_on_8_hosts() -> None:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "full.yaml").read_text()))
    cells = check_study(validate_config(copy.deepcopy(config)), max_nodes=8)
    assert config["cluster"]["backend"] == "ssh"
    assert sorted(set(cells["nodes"])) == [2, 4, 8]
    assert set(cells["repeat"]) == {0, 1, 2}
    base = cells[cells["strategy"].isin(["ddp", "fsdp", "tp", "pp-m8"])]
    assert base["bw"].nunique() >= 5 and base["delay"].nunique() >= 4
    assert len(cells) == 414  # the count the file's expected wall time is for
