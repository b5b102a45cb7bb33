"""Study configuration: the schema (unknown keys, types, formats, defaults) and check_study."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from commscope import config as cfgmod
from commscope.config import (
    SWEEP_AXES,
    ConfigError,
    cell_id,
    cells_frame,
    check_study,
    load_config,
    loss_pct,
    validate_config,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}


def study(
    strategy: str = "ddp", nodes: int = 2, model: dict[str, Any] | None = None, **sweep: Any
) -> dict[str, Any]:
    """A minimal valid one-cell study, with overrides."""
    return {
        "models": {"m": {**TINY, **(model or {})}},
        "sweep": {
            "strategy": [strategy],
            "model": ["m"],
            "nodes": [nodes],
            "ranks_per_node": [1],
            "bw": ["50mbit"],
            "steps": [2],
            **sweep,
        },
    }


def checked(config: dict[str, Any], **kw: Any) -> Any:
    return check_study(validate_config(config), **kw)


def config_error(config: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        checked(config, **kw)
    return str(info.value)


# ─────────────────────────────────────────────────────────── the default study


@pytest.fixture(scope="module")
def default_config() -> dict[str, Any]:
    return load_config(DEFAULT_CONFIG)


def test_default_config_validates_and_expands(default_config: dict[str, Any]) -> None:
    cells = check_study(default_config, max_nodes=4, has_netem=lambda: False)
    sweep = default_config["sweep"]
    expected = 1
    for axis in SWEEP_AXES:
        expected *= len(sweep[axis])
    assert expected == 4 * 1 * 2 * 1 * 3  # strategies x model x nodes x rpn x bw (rest single)
    assert len(cells) == expected == 24
    assert list(cells.columns) == list(SWEEP_AXES)
    assert not cells.duplicated().any()
    assert set(cells["strategy"]) == {"ddp", "fsdp", "tp", "pp"}
    assert set(cells["bw"]) == {"50mbit", "200mbit", "none"}
    ids = [cell_id(row) for row in cells.to_dict("records")]
    assert len(set(ids)) == len(ids)
    for cid in ids:
        levels = cid.split("/")
        assert len(levels) == len(SWEEP_AXES)
        assert [lvl.split("~")[0] for lvl in levels] == list(SWEEP_AXES)
    first = cells.iloc[0].to_dict()
    assert cell_id(first) == (
        "strategy~ddp/model~gpt-tiny/nodes~2/ranks_per_node~1/bw~50mbit/"
        "delay~0ms/jitter~0ms/loss~0pct/steps~6/repeat~0"
    )


def test_default_config_values(default_config: dict[str, Any]) -> None:
    assert default_config["run"]["microbatches"] == 4
    assert default_config["models"]["gpt-tiny"]["ffn_mult"] == 4  # default filled
    assert default_config["models"]["gpt-tiny"]["kind"] == "gpt"
    assert default_config["cluster"]["connect_timeout_s"] == 10


def test_defaults_are_filled() -> None:
    config = validate_config(study())
    assert config["run"]["sample_hz"] == 1000
    assert config["run"]["timeout_s"] == 300
    assert config["run"]["warmup_steps"] == 2
    assert config["run"]["microbatches"] == 4
    assert config["run"]["pp_schedule"] == "1f1b"
    assert config["sweep"]["repeat"] == [0]
    assert config["sweep"]["delay"] == ["0ms"]
    assert config["sweep"]["jitter"] == ["0ms"]
    assert config["sweep"]["loss"] == ["0pct"]
    assert config["cluster"]["backend"] == "netns"
    assert config["cluster"]["name"] == "cs"
    assert config["models"]["m"]["ffn_mult"] == 4


def test_given_values_are_kept() -> None:
    config = study(repeat=[0, 1, 2])
    config["run"] = {"sample_hz": 250}
    validate_config(config)
    assert config["run"]["sample_hz"] == 250
    assert config["run"]["timeout_s"] == 300  # siblings still defaulted
    assert config["sweep"]["repeat"] == [0, 1, 2]
    assert len(check_study(config)) == 3


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(study()))
    config = load_config(path)
    assert config["run"]["sample_hz"] == 1000
    path.write_text(yaml.safe_dump({**study(), "sweeps": {}}))
    with pytest.raises(ConfigError, match="'sweeps' was unexpected"):
        load_config(path)


# ─────────────────────────────────────────────────────────── schema errors


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ((), "sweeps"),
        (("sweep",), "bww"),
        (("run",), "timeout"),
        (("cluster",), "nmae"),
        (("models", "m"), "layer"),
    ],
)
def test_unknown_keys_are_errors_naming_the_key(where: tuple[str, ...], key: str) -> None:
    config = study()
    config["run"] = {}
    config["cluster"] = {}
    target = config
    for part in where:
        target = target[part]
    target[key] = 1
    message = config_error(config)
    assert f"'{key}' was unexpected" in message


def test_wrong_type_names_the_value() -> None:
    config = study()
    config["sweep"]["nodes"] = ["two"]
    message = config_error(config)
    assert "'two' is not of type 'integer'" in message


@pytest.mark.parametrize("bw", ["100mb", "100Mbit", "1gbps", "100", "fast"])
def test_malformed_bw_is_rejected(bw: str) -> None:
    message = config_error(study(bw=[bw]))
    assert repr(bw) in message
    assert "does not match" in message


@pytest.mark.parametrize(
    ("axis", "value"),
    [("delay", "10"), ("jitter", "1 ms"), ("loss", "0.5%"), ("strategy", "zero")],
)
def test_malformed_axis_values_are_rejected(axis: str, value: str) -> None:
    assert repr(value) in config_error(study(**{axis: [value]}))


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda c: c["sweep"].pop("bw"), "'bw' is a required property"),
        (lambda c: c.pop("models"), "'models' is a required property"),
        (lambda c: c["sweep"].update(nodes=[9]), "9 is greater than the maximum of 8"),
        (lambda c: c["sweep"].update(nodes=[]), "should be non-empty"),
        (lambda c: c.update(run={"sample_hz": 50}), "50 is less than the minimum of 100"),
        (lambda c: c.update(run={"pp_schedule": "zb"}), "'zb' is not one of"),
    ],
)
def test_schema_rejections(mutate: Any, fragment: str) -> None:
    config = study()
    mutate(config)
    assert fragment in config_error(config)


def test_the_base_study_is_valid() -> None:
    # The rejections above come from their mutation, not from the base study.
    assert len(checked(study())) == 1


# ─────────────────────────────────────────────────────────── check_study


def test_tp_heads_not_divisible_by_world() -> None:
    message = config_error(study("tp", nodes=2, model={"heads": 1}))
    # heads=1 over 2 ranks: the cell and the fix are both named.
    assert "cell strategy=tp model=m nodes=2 ranks_per_node=1 (world 2)" in message
    assert "model.heads (1) divisible by 2" in message


def test_tp_world_counts_ranks_per_node() -> None:
    config = study("tp", nodes=2, model={"heads": 2}, ranks_per_node=[2])
    message = config_error(config)
    assert "nodes=2 ranks_per_node=2 (world 4)" in message
    assert "model.heads (2) divisible by 4" in message


def test_pp_needs_a_layer_per_stage() -> None:
    message = config_error(study("pp", nodes=4, model={"layers": 3}))
    assert "cell strategy=pp model=m nodes=4" in message
    assert "model.layers (3) >= 4 stages" in message


def test_pp_batch_must_split_into_microbatches() -> None:
    config = study("pp", model={"batch": 6})
    config["run"] = {"microbatches": 4}
    message = config_error(config)
    assert "cell strategy=pp" in message
    assert "model.batch (6) divisible by microbatches (4)" in message
    config = study("pp", model={"batch": 6})
    config["run"] = {"microbatches": 3}
    assert len(checked(config)) == 1


def test_model_must_be_defined() -> None:
    config = study(model=None)
    config["sweep"]["model"] = ["m", "gpt-huge"]
    message = config_error(config)
    assert "sweep.model: 'gpt-huge' is not defined under models" in message
    assert "['m']" in message


def test_nodes_above_cluster_size() -> None:
    config = study(nodes=4)
    message = config_error(config, max_nodes=2)
    assert "sweep.nodes: 4 nodes asked for but the cluster has 2" in message
    assert "add hosts to the inventory" in message
    assert len(checked(study(nodes=4), max_nodes=4)) == 1
    assert len(checked(study(nodes=4))) == 1  # no limit given


def test_every_problem_is_reported_at_once() -> None:
    config = study("tp", nodes=4, model={"heads": 2})
    config["sweep"]["strategy"] = ["tp", "pp"]
    config["sweep"]["model"] = ["m", "nope"]
    message = config_error(config, max_nodes=2)
    lines = [line for line in message.splitlines() if line.strip().startswith("- ")]
    assert len(lines) == 4  # unknown model, too many nodes, tp heads, pp layers
    assert "'nope'" in message
    assert "model.heads (2) divisible by 4" in message
    assert "model.layers (2) >= 4 stages" in message


def test_delay_without_netem_is_rejected() -> None:
    config = study(delay=["10ms"])
    message = config_error(config, has_netem=lambda: False)
    assert "netem" in message
    assert "delay=10ms" in message
    assert "sch_netem" in message
    assert len(checked(study(delay=["10ms"]), has_netem=lambda: True)) == 1
    for axis, value in (("jitter", "1ms"), ("loss", "0.5pct")):
        assert "netem" in config_error(study(**{axis: [value]}), has_netem=lambda: False)


def test_netem_is_only_asked_when_needed() -> None:
    def never() -> bool:
        raise AssertionError("has_netem must not be called without delay/jitter/loss")

    assert len(checked(study(bw=["50mbit", "none"]), has_netem=never)) == 2


def test_loss_above_100_percent() -> None:
    message = config_error(study(loss=["150pct"]))
    assert "loss='150.0%'" in message
    assert "between 0% and 100%" in message


def test_duplicate_axis_values() -> None:
    with pytest.raises(ConfigError, match="duplicate values in an axis"):
        cells_frame(validate_config(study(bw=["50mbit", "50mbit"])))


def test_loss_pct() -> None:
    assert loss_pct("0pct") == 0.0
    assert loss_pct("0.5pct") == 0.5


def test_cell_id_one_level_per_axis() -> None:
    cell = dict(zip(SWEEP_AXES, ["pp", "m", 2, 1, "none", "0ms", "0ms", "0pct", 6, 3], strict=True))
    assert cell_id(cell) == (
        "strategy~pp/model~m/nodes~2/ranks_per_node~1/bw~none/"
        "delay~0ms/jitter~0ms/loss~0pct/steps~6/repeat~3"
    )


def test_schema_path_exists() -> None:
    assert cfgmod.SCHEMA_PATH.is_file()
    assert cfgmod.SCHEMA_PATH == ROOT / "workflow" / "schemas" / "config.schema.yaml"


def test_validate_fills_in_place_and_returns_the_same_dict() -> None:
    config = study()
    before = copy.deepcopy(config)
    out = validate_config(config)
    assert out is config
    assert out["sweep"]["strategy"] == before["sweep"]["strategy"]
    assert "run" in config and "run" not in before


def test_pp_1f1b_needs_microbatches_per_stage() -> None:
    config = study("pp", nodes=8, model={"layers": 8, "batch": 8})
    config["run"] = {"microbatches": 4, "pp_schedule": "1f1b"}
    with pytest.raises(ConfigError, match="microbatches"):
        checked(config)
