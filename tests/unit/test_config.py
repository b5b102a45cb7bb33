"""Study configuration: the schema (unknown keys, types, formats, defaults) and check_study."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from commscope import config as cfgmod
from commscope.config import (
    ConfigError,
    cell_id,
    cells_frame,
    check_study,
    load_config,
    path_escapes,
    read_yaml,
    strategy_names,
    strategy_spec,
    sweep_blocks,
    validate_config,
)
from commscope.contracts import SWEEP_AXES
from commscope.spec.link import loss_pct
from commscope.spec.models import model_config
from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan
from commscope.spec.settings import CellSettings, ClusterSettings

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}


def study(
    strategy: str = "ddp",
    nodes: int = 2,
    model: dict[str, Any] | None = None,
    strategies: dict[str, dict[str, Any]] | None = None,
    **sweep: Any,
) -> dict[str, Any]:
    """A minimal valid one-cell study, with overrides (``strategies`` defines named ones)."""
    config: dict[str, Any] = {
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
    if strategies is not None:
        config["strategies"] = strategies
    return config


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


def _expected_cells(config: dict[str, Any]) -> list[tuple]:
    """The union of every block's cartesian product, in order, computed here independently."""
    defaults = {
        "delay": ["0ms"],
        "jitter": ["0ms"],
        "loss": ["0pct"],
        "cc": ["cubic"],
        "repeat": [0],
    }
    blocks = config["sweep"] if isinstance(config["sweep"], list) else [config["sweep"]]
    out: list[tuple] = []
    for block in blocks:
        for cell in itertools.product(*(block.get(a, defaults.get(a)) for a in SWEEP_AXES)):
            if cell not in out:
                out.append(cell)
    return out


def test_default_config_validates_and_expands(default_config: dict[str, Any]) -> None:
    cells = check_study(default_config, max_nodes=8, engine_problem=lambda engine: "")
    expected = _expected_cells(default_config)
    assert len(cells) == len(expected) > 0
    assert [tuple(row) for row in cells.itertuples(index=False)] == expected
    assert list(cells.columns) == list(SWEEP_AXES)
    assert not cells.duplicated().any()
    # Every strategy the sweep names exists and resolves on every world size it runs at.
    assert set(cells["strategy"]) <= strategy_names(default_config) | {"replay"}
    trained = cells[cells["strategy"] != "replay"]
    for strategy, world in {(c.strategy, c.nodes * c.ranks_per_node) for c in trained.itertuples()}:
        ParallelPlan.from_dict(strategy_spec(default_config, strategy)).resolve(int(world))
    ids = [cell_id(row) for row in cells.to_dict("records")]
    assert len(set(ids)) == len(ids)
    for cid in ids:
        levels = cid.split("/")
        assert len(levels) == len(SWEEP_AXES)
        assert [lvl.split("~")[0] for lvl in levels] == list(SWEEP_AXES)
    first = dict(zip(SWEEP_AXES, expected[0], strict=True))
    assert cell_id(cells.iloc[0].to_dict()) == "/".join(f"{a}~{first[a]}" for a in SWEEP_AXES)


def test_default_config_values(default_config: dict[str, Any]) -> None:
    # Pipeline and bucket settings live in strategy definitions now, not in run:.
    assert not {"microbatches", "pp_schedule", "bucket_cap_mb"} & set(default_config["run"])
    assert default_config["models"]["gpt-tiny"]["kind"] == "gpt"  # default filled
    assert model_config(default_config["models"]["gpt-tiny"]).ffn_mult == 4  # the model's default
    assert default_config["cluster"]["connect_timeout_s"] == 10
    for name, spec in default_config["strategies"].items():
        assert name not in BUILTIN_STRATEGIES or spec != BUILTIN_STRATEGIES[name]
        ParallelPlan.from_dict(spec)  # every key is a plan field


def test_defaults_are_filled() -> None:
    config = validate_config(study())
    assert config["run"]["sample_hz"] == 1000
    assert config["run"]["timeout_s"] == 300
    assert config["run"]["warmup_steps"] == 2
    assert not {"microbatches", "pp_schedule", "bucket_cap_mb"} & set(config["run"])
    assert config["strategies"] == {}
    assert config["cluster"]["backend"] == "netns"
    assert config["cluster"]["name"] == "cs"
    assert config["models"]["m"]["kind"] == "gpt"
    assert model_config(config["models"]["m"]).ffn_mult == 4
    # Optional sweep axes default when the cells are expanded (also inside a list of blocks).
    cell = cells_frame(config).iloc[0]
    assert (cell["delay"], cell["jitter"], cell["loss"], cell["repeat"]) == (
        "0ms",
        "0ms",
        "0pct",
        0,
    )


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
    with pytest.raises(ConfigError, match="unknown key 'sweeps'"):
        load_config(path)


# ─────────────────────────────────────────────────────────── schema errors


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ((), "sweeps"),
        pytest.param(("sweep",), "bww"),
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
    assert f"unknown key {key!r}" in message


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
    [("delay", "10"), ("jitter", "1 ms"), ("loss", "0.5%"), ("strategy", "pp/2")],
)
def test_malformed_axis_values_are_rejected(axis: str, value: str) -> None:
    assert repr(value) in config_error(study(**{axis: [value]}))


@pytest.mark.parametrize(
    ("axis", "value"),
    [("bw", "100mb"), ("delay", "10"), ("jitter", "1 ms"), ("loss", "0.5%"), ("strategy", "pp/2")],
)
def test_malformed_axis_values_never_pass(axis: str, value: str) -> None:
    # A malformed axis value is refused by the schema, in either form of the sweep, before any
    # cell is checked, and the message names the key (sweep.<axis>[0] or sweep[0].<axis>[0]).
    for form in (lambda b: b, lambda b: [b]):
        config = study(**{axis: [value]})
        config["sweep"] = form(config["sweep"])
        with pytest.raises(ConfigError, match=rf"config key sweep(\[0\])?\.{axis}"):
            validate_config(config)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(
            lambda c: c["sweep"].pop("bw"),
            "'bw' is a required property",
        ),
        (lambda c: c.pop("models"), "'models' is a required property"),
        pytest.param(
            lambda c: c["sweep"].update(nodes=[9]),
            "9 is greater than the maximum of 8",
        ),
        pytest.param(lambda c: c["sweep"].update(nodes=[]), "sweep.nodes: an empty list"),
        (lambda c: c.update(run={"sample_hz": 50}), "50 is less than the minimum of 100"),
        (
            lambda c: c.update(strategies={"s": {"pp": -1, "pp_schedule": "zb"}}),
            "'zb' is not one of",
        ),
        (lambda c: c.update(strategies={"s": {"dp": 0}}), "0 is not allowed here"),
        (lambda c: c.update(strategies={"s": {"dp": -2}}), "-2 is less than the minimum of -1"),
        (lambda c: c.update(strategies={"s": {"dp_kind": "zero"}}), "'zero' is not one of"),
        (
            lambda c: c.update(strategies={"s": {"micro_batches": 4}}),
            "unknown key 'micro_batches'",
        ),
        (lambda c: c.update(strategies={"s": {"mapping": "pp-dp-xp"}}), "does not match"),
        (lambda c: c.update(strategies={"s": {"mapping": "pp,dp"}}), "does not match"),
        (
            lambda c: c.update(strategies={"s": {"microbatches": 0}}),
            "0 is less than the minimum of 1",
        ),
        (lambda c: c.update(run={"microbatches": 4}), "unknown key 'microbatches'"),
        (lambda c: c.update(run={"pp_schedule": "1f1b"}), "unknown key 'pp_schedule'"),
        (lambda c: c.update(run={"bucket_cap_mb": 25}), "unknown key 'bucket_cap_mb'"),
        (lambda c: c["models"]["m"].update(kind="bert"), "'bert' is not one of"),
        (lambda c: c["models"]["m"].update(top_k=3), "3 is not one of"),
        pytest.param(lambda c: c.update(sweep=[]), "sweep: an empty list"),
        pytest.param(
            lambda c: c.update(sweep=[{**c["sweep"], "bww": 1}]),
            "unknown key 'bww'",
        ),
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
    config = study("pp4", model={"batch": 6}, strategies={"pp4": {"pp": -1, "microbatches": 4}})
    message = config_error(config)
    assert "cell strategy=pp4" in message
    assert "model.batch (6) divisible by microbatches (4)" in message
    config = study("pp3", model={"batch": 6}, strategies={"pp3": {"pp": -1, "microbatches": 3}})
    assert len(checked(config)) == 1
    # The built-in pp splits into 4 micro-batches.
    assert "model.batch (6) divisible by microbatches (4)" in config_error(
        study("pp", model={"batch": 6})
    )


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


def test_link_engine_problem_is_reported() -> None:
    """A link engine that cannot run (no netem asked for, a tool missing) stops the study
    before anything runs, with the probe's message and the requested engine."""
    asked: list[str] = []

    def problem(engine: str) -> str:
        asked.append(engine)
        return f"run.link_engine={engine} cannot run: nft missing (Debian package nftables)"

    message = config_error(study(delay=["10ms"]), engine_problem=problem)
    assert "run.link_engine=auto cannot run: nft missing" in message
    config = study(loss=["0.5pct"])
    config["run"] = {"link_engine": "netem"}
    assert "run.link_engine=netem" in config_error(config, engine_problem=problem)
    assert asked == ["auto", "netem"]
    assert len(checked(study(delay=["10ms"]), engine_problem=lambda engine: "")) == 1


def test_engine_is_only_probed_when_needed() -> None:
    def never(engine: str) -> str:
        raise AssertionError("engine_problem must not be called without delay/jitter/loss")

    assert len(checked(study(bw=["50mbit", "none"]), engine_problem=never)) == 2


def test_impairments_out_of_range_are_named() -> None:
    message = config_error(study(delay=["5ms"], jitter=["10ms"]))
    assert "jitter=10ms exceeds delay=5ms" in message
    assert "delay=1500ms must be at most 1000ms" in config_error(study(delay=["1500ms"]))


def test_loss_above_100_percent() -> None:
    message = config_error(study(loss=["150pct"]))
    assert "loss='150.0%'" in message
    assert "between 0% and 20%" in message


def test_duplicate_axis_values() -> None:
    with pytest.raises(ConfigError, match="duplicate values in an axis"):
        cells_frame(validate_config(study(bw=["50mbit", "50mbit"])))


def test_loss_pct() -> None:
    assert loss_pct("0pct") == 0.0
    assert loss_pct("0.5pct") == 0.5


def test_cell_id_one_level_per_axis() -> None:
    values = ["pp", "m", 2, 1, "none", "0ms", "0ms", "0pct", "bbr", 6, 3]
    cell = dict(zip(SWEEP_AXES, values, strict=True))
    assert cell_id(cell) == (
        "strategy~pp/model~m/nodes~2/ranks_per_node~1/bw~none/"
        "delay~0ms/jitter~0ms/loss~0pct/cc~bbr/steps~6/repeat~3"
    )


# ─────────────────────────────────────────────────────────── congestion control, cluster links


def test_cc_is_a_sweep_axis_after_loss() -> None:
    assert SWEEP_AXES[SWEEP_AXES.index("loss") + 1] == "cc"
    cells = checked(study(cc=["bbr", "reno"]))
    assert list(cells["cc"]) == ["bbr", "reno"]
    assert cell_id(cells.iloc[0].to_dict()).split("/")[8] == "cc~bbr"
    # Left out: every cell runs CUBIC (seed 002's), not the host's default.
    assert list(checked(study())["cc"]) == ["cubic"]
    cell = CellSettings.from_mapping(cells.iloc[1].to_dict())
    assert cell.cc == "reno" and cell.link_shape().cc == "reno"
    assert cell.as_dict()["cc"] == "reno"


def test_unknown_cc_is_rejected_naming_the_axis() -> None:
    message = config_error(study(cc=["vegas"]))
    assert "sweep.cc" in message and "'vegas'" in message
    # Past the schema (a config built in code), check_study names the axis and the choices.
    config = validate_config(study())
    config["sweep"]["cc"] = ["vegas"]
    with pytest.raises(ConfigError) as err:
        check_study(config)
    assert "cc='vegas'" in str(err.value) and "cubic, bbr, reno" in str(err.value)


def test_cluster_mtu_and_offload() -> None:
    config = validate_config(study())
    assert (config["cluster"]["mtu"], config["cluster"]["offload"]) == (1500, False)
    settings = ClusterSettings.from_mapping(config["cluster"])
    assert (settings.mtu, settings.offload) == (1500, False)
    jumbo = ClusterSettings.from_mapping({"mtu": 9000, "offload": True})
    assert (jumbo.mtu, jumbo.offload) == (9000, True)
    assert ClusterSettings.from_mapping({"mtu": "9000", "offload": "false"}).offload is False


@pytest.mark.parametrize("mtu", [100, 575, 65536])
def test_cluster_mtu_out_of_range_names_the_key_and_the_fix(mtu: int) -> None:
    config = study()
    config["cluster"] = {"mtu": mtu}
    with pytest.raises(ConfigError, match=r"config key cluster\.mtu"):
        validate_config(config)
    with pytest.raises(ValueError) as err:
        ClusterSettings(mtu=mtu)
    assert str(err.value).startswith(f"cluster.mtu={mtu}: use an MTU between 576 and 65535")
    assert "9000: jumbo frames" in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("mtu", "big"), ("mtu", 1500.5), ("offload", "yes")])
def test_cluster_link_settings_of_the_wrong_type_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"cluster\.{key}="):
        ClusterSettings.from_mapping({key: value})


def test_schema_path_is_the_workflows_relative_to_the_working_directory() -> None:
    # The package does not locate the repository from its own file: the Snakefile passes the
    # schema next to it, and the default (for `commscope check` in the repository root) is
    # relative to the working directory, like the CLI's default config/config.yaml.
    assert not cfgmod.SCHEMA_PATH.is_absolute()
    assert Path("workflow") / "schemas" / "config.schema.yaml" == cfgmod.SCHEMA_PATH
    assert (ROOT / cfgmod.SCHEMA_PATH).is_file()


def test_an_explicit_schema_path_works_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # The default is relative to the working directory: elsewhere it says so and what to pass.
    with pytest.raises(ConfigError, match="schema workflow/schemas/config.schema.yaml not found"):
        validate_config(study())
    schema = ROOT / cfgmod.SCHEMA_PATH
    assert validate_config(study(), schema)["run"]["sample_hz"] == 1000
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**study(), "sweeps": {}}))
    with pytest.raises(ConfigError, match="unknown key 'sweeps'"):
        load_config(path, schema)


def _schema_properties(node: Any, path: str, defs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every (path, subschema) under a ``properties:`` of the schema, $defs included once."""
    if not isinstance(node, dict):
        return
    for name, sub in (node.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from _schema_properties(sub, f"{path}.{name}", defs)
    for key in ("additionalProperties", "items"):
        yield from _schema_properties(node.get(key), f"{path}.{key}", defs)
    for key in ("oneOf", "anyOf", "allOf"):
        for i, sub in enumerate(node.get(key) or []):
            yield from _schema_properties(sub, f"{path}.{key}[{i}]", defs)


def test_every_schema_property_is_described() -> None:
    # As in snakemake-workflow-template: a description on every property. A property that only
    # refers to a $defs shape may take the shape's description.
    schema = yaml.safe_load((ROOT / cfgmod.SCHEMA_PATH).read_text())
    defs = schema["$defs"]
    props = list(_schema_properties(schema, "$", defs))
    for name, shape in defs.items():
        props += list(_schema_properties(shape, f"$defs/{name}", defs))
    assert len(props) > 90

    def described(sub: dict[str, Any]) -> bool:
        if "description" in sub:
            return True
        ref = sub.get("$ref", "")
        return ref.startswith("#/$defs/") and "description" in defs[ref.removeprefix("#/$defs/")]

    assert [path for path, sub in props if not described(sub)] == []


def test_example_configs_validate_and_expand() -> None:
    # The tiny study of the integration test and any other config under tests/config/.
    paths = sorted((ROOT / "tests" / "config").glob("*.yaml"))
    assert paths
    for path in paths:
        assert len(check_study(load_config(path), engine_problem=lambda engine: "")) > 0, path


def test_validate_fills_in_place_and_returns_the_same_dict() -> None:
    config = study()
    before = copy.deepcopy(config)
    out = validate_config(config)
    assert out is config
    assert out["sweep"]["strategy"] == before["sweep"]["strategy"]
    assert "run" in config and "run" not in before


def test_pp_1f1b_needs_microbatches_per_stage() -> None:
    plan = {"pp": -1, "microbatches": 4, "pp_schedule": "1f1b"}
    config = study("p", nodes=8, model={"layers": 8, "batch": 8}, strategies={"p": plan})
    message = config_error(config)
    assert "microbatches (4) >= the number of pipeline ranks (8)" in message
    assert "pp_schedule: gpipe" in message  # the fix is named
    gpipe = {"p": plan | {"pp_schedule": "gpipe"}}
    assert len(checked(study("p", nodes=8, model={"layers": 8, "batch": 8}, strategies=gpipe))) == 1


# ─────────────────────────────────────────────────────────── sweep blocks


def _block(**axes: Any) -> dict[str, Any]:
    base = {"strategy": ["ddp"], "model": ["m"], "nodes": [2], "ranks_per_node": [1]}
    return base | {"bw": ["50mbit"], "steps": [2]} | axes


def test_sweep_as_a_list_of_blocks_is_the_union_of_their_products() -> None:
    config = study()
    config["sweep"] = [
        _block(strategy=["ddp", "tp"], bw=["50mbit", "none"]),  # 4 cells
        # Overlaps block 0 in (ddp, 50mbit) and (tp, 50mbit): a shared baseline runs once.
        _block(strategy=["ddp", "tp", "pp"], bw=["50mbit"], repeat=[0]),
        _block(strategy=["ddp"], steps=[20], delay=["5ms"], repeat=[0, 1]),  # 2 new cells
    ]
    cells = checked(config, engine_problem=lambda engine: "")
    assert sweep_blocks(config) == config["sweep"]
    got = [tuple(row) for row in cells.itertuples(index=False)]
    assert got == _expected_cells(config)
    assert len(cells) == 4 + 1 + 2
    assert not cells.duplicated().any()
    assert list(cells.columns) == list(SWEEP_AXES)
    # Axes a block leaves out take their defaults, block by block.
    short = cells[cells["steps"] == 2]
    assert set(short["delay"]) == {"0ms"} and set(short["repeat"]) == {0}
    assert set(short["jitter"]) == {"0ms"} and set(short["loss"]) == {"0pct"}
    long = cells[cells["steps"] == 20]
    assert set(long["delay"]) == {"5ms"} and sorted(long["repeat"]) == [0, 1]
    assert set(long["jitter"]) == {"0ms"} and set(long["loss"]) == {"0pct"}
    ids = [cell_id(row) for row in cells.to_dict("records")]
    assert len(set(ids)) == len(ids)


def test_a_single_block_and_a_list_of_one_are_the_same_study() -> None:
    one = study(bw=["50mbit", "none"], repeat=[0, 1])
    listed = copy.deepcopy(one)
    listed["sweep"] = [listed["sweep"]]
    assert checked(one).equals(checked(listed))


def test_duplicates_inside_one_block_are_still_an_error() -> None:
    config = study()
    config["sweep"] = [_block(), _block(bw=["none", "none"])]
    with pytest.raises(ConfigError, match="sweep block 1: duplicate values in an axis"):
        cells_frame(validate_config(config))


def test_every_block_is_checked() -> None:
    config = study(model={"heads": 1})
    config["sweep"] = [_block(), _block(strategy=["tp"])]  # only block 1's tp cell is bad
    message = config_error(config)
    assert "cell strategy=tp model=m" in message
    assert "cell strategy=ddp" not in message


# ─────────────────────────────────────────────────────────── named strategies


def test_a_custom_strategy_is_used_by_the_sweep() -> None:
    hybrid = {"dp": -1, "tp": 2, "mapping": "tp-dp", "dp_kind": "fsdp"}
    config = study("dp-tp-x", ranks_per_node=[2], strategies={"dp-tp-x": hybrid})
    cells = checked(config)
    assert cells["strategy"].tolist() == ["dp-tp-x"]
    assert strategy_names(config) == set(BUILTIN_STRATEGIES) | {"dp-tp-x"}
    assert strategy_spec(config, "dp-tp-x") == hybrid
    plan = ParallelPlan.from_dict(strategy_spec(config, "dp-tp-x")).resolve(4)
    assert (plan.dp, plan.tp, plan.dp_kind) == (2, 2, "fsdp")
    # Built-ins stay available next to the config's own; the returned spec is a copy.
    assert strategy_spec(config, "pp") == BUILTIN_STRATEGIES["pp"]
    strategy_spec(config, "ddp")["dp"] = 99
    assert BUILTIN_STRATEGIES["ddp"] == {"dp": -1}


def test_a_config_entry_replaces_the_built_in_of_that_name() -> None:
    config = study("pp", nodes=2, strategies={"pp": {"pp": -1, "microbatches": 3}})
    assert strategy_spec(config, "pp") == {"pp": -1, "microbatches": 3}
    message = config_error(config)  # batch 4 does not split into 3 micro-batches
    assert "model.batch (4) divisible by microbatches (3)" in message


def test_a_custom_strategy_is_checked_per_cell() -> None:
    # tp=4 with dp taking the rest: fine on 2 nodes x 2 ranks (world 4, dp 1); on 3 nodes
    # (world 6) 4 does not divide 6. Only the bad cell is reported.
    config = study("t4", nodes=2, strategies={"t4": {"dp": -1, "tp": 4}}, ranks_per_node=[2])
    config["models"]["m"]["heads"] = 4
    assert len(checked(config)) == 1
    config["sweep"]["nodes"] = [2, 3]
    message = config_error(config)
    assert "nodes=3 ranks_per_node=2 (world 6)" in message
    assert "does not divide the world size 6" in message
    assert "nodes=2 ranks_per_node=2" not in message


def test_unknown_strategy_names_the_available_ones() -> None:
    config = study("zero", strategies={"mine": {"dp": -1}})
    message = config_error(config)
    assert "sweep.strategy: 'zero' is neither built in nor defined under strategies:" in message
    expected = sorted({*BUILTIN_STRATEGIES, "mine"})
    assert f"(available: {expected})" in message
    # Only that problem: the unknown strategy's cells are not checked any further.
    assert len([ln for ln in message.splitlines() if ln.strip().startswith("- ")]) == 1


def test_degrees_must_multiply_to_the_world_size() -> None:
    config = study("d2t2", nodes=2, strategies={"d2t2": {"dp": 2, "tp": 2}})
    message = config_error(config)
    assert "cell strategy=d2t2 model=m nodes=2 ranks_per_node=1 (world 2)" in message
    assert "{'pp': 1, 'dp': 2, 'ep': 1, 'tp': 2} multiply to 4" in message
    assert "the cell has 2 ranks" in message
    assert "set one degree to -1" in message  # the fix
    config["sweep"]["ranks_per_node"] = [2]
    assert len(checked(config)) == 1


def test_two_free_degrees_are_rejected() -> None:
    message = config_error(study("x", strategies={"x": {"dp": -1, "tp": -1}}))
    assert "only one degree may be -1, got ['dp', 'tp']" in message


@pytest.mark.parametrize("mapping", ["tp-tp", "dp-tp-dp"])
def test_a_mapping_naming_a_dim_twice_is_rejected(mapping: str) -> None:
    # The schema's pattern admits repeats; check_study catches them, names the key once (not
    # every cell that uses the strategy) and says how to write one.
    config = study("m2", strategies={"m2": {"dp": -1, "mapping": mapping}})
    message = config_error(config)
    assert f"strategies.m2.mapping: {mapping!r} names " in message
    assert "cell strategy=m2" not in message
    assert "at most once" in message and "e.g. pp-dp-tp" in message


@pytest.mark.parametrize("mapping", ["pp-dp-xp", "pp_dp", "TP-DP", "pp-dp-ep-tp-pp"])
def test_a_malformed_mapping_is_rejected_by_the_schema(mapping: str) -> None:
    message = config_error(study("m2", strategies={"m2": {"dp": -1, "mapping": mapping}}))
    assert repr(mapping) in message
    assert "does not match" in message


MOE = {"kind": "moe", "experts": 4, "top_k": 2}


def test_moe_with_tp_is_rejected() -> None:
    config = study("mt", model=MOE, strategies={"mt": {"ep": -1, "tp": 2}}, ranks_per_node=[2])
    message = config_error(config)
    assert "cell strategy=mt model=m nodes=2 ranks_per_node=2 (world 4)" in message
    assert "model kind moe supports dp and ep (expert parallel), not tp/pp" in message
    assert len(checked(study("ep", model=MOE, ranks_per_node=[2]))) == 1  # ep over 4 is fine


def test_moe_needs_experts_divisible_by_ep() -> None:
    config = study("ep", model=MOE | {"experts": 3, "top_k": 1})
    assert "model.experts (3) must be divisible by the expert-parallel size (2)" in config_error(
        config
    )


def test_ep_on_a_dense_model_is_rejected() -> None:
    assert "ep=2 needs an MoE model (kind: moe); gpt has no experts" in config_error(study("ep"))


@pytest.mark.parametrize("kind", ["resnet50", "vgg16"])
def test_vision_model_with_tp_is_rejected(kind: str) -> None:
    config = study("tp", model={"kind": kind, "image": 32})
    for key in ("layers", "hidden", "heads", "seq", "vocab"):
        config["models"]["m"].pop(key)
    message = config_error(config)
    assert "cell strategy=tp" in message
    assert f"model kind {kind} runs data parallel only (ddp or fsdp): tp/pp/ep = 1" in message
    for ok in ("ddp", "fsdp"):
        config["sweep"]["strategy"] = [ok]
        assert len(checked(config)) == 1


def test_stdlib_data_needs_a_byte_vocabulary() -> None:
    message = config_error(study(model={"data": "stdlib", "vocab": 64}))
    assert "data: stdlib is byte level: set model.vocab to 256 (is 64)" in message
    assert len(checked(study(model={"data": "stdlib", "vocab": 256}))) == 1
    moe = study("ep", model=MOE | {"data": "stdlib", "vocab": 100})
    assert "set model.vocab to 256 (is 100)" in config_error(moe)


def test_interleaved_1f1b_needs_two_stages_per_rank() -> None:
    plan = {"pp": 2, "dp": -1, "pp_schedule": "interleaved-1f1b", "microbatches": 2}
    model = {"layers": 4}
    config = study("pi", model=model, strategies={"pi": plan}, ranks_per_node=[2])
    message = config_error(config)
    assert "cell strategy=pi" in message
    assert "interleaved-1f1b needs stages_per_rank >= 2" in message
    config["strategies"]["pi"]["stages_per_rank"] = 2
    assert len(checked(config)) == 1
    # 2 pipeline ranks x 3 stages each need 6 layers.
    config["strategies"]["pi"]["stages_per_rank"] = 3
    assert "needs model.layers (4) >= 6 stages" in config_error(config)


def test_one_stage_schedules_refuse_stages_per_rank() -> None:
    config = study(
        "pg", strategies={"pg": {"pp": -1, "pp_schedule": "gpipe", "stages_per_rank": 2}}
    )
    assert "gpipe runs one stage per rank: set stages_per_rank 1" in config_error(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            b"run:\n  timeout_s: 10\nrun:\n  sample_hz: 5\n",
            "line 3, column 1: duplicate key 'run' (first at line 1)",
        ),
        (b"a: &x [1, 2]\nb: *x\n", "line 1, column 4: anchors and aliases"),
        (
            b"run:\n\ttimeout_s: 10\n",
            "line 2, column 1: found character '\\t' that cannot start "
            "any token (indent with spaces, not tabs)",
        ),
        (b"run:\n  name: \xff\n", "line 2: byte 0xff is not UTF-8; save the file as UTF-8"),
        (
            b"run: !!python/object/apply:os.system [true]\n",
            "line 1, column 6: could not determine a constructor for the tag",
        ),
        (b"- a\n- b\n", "a config is a mapping of keys (cluster:, sweep:, ...), got a list"),
        (b"run: [1, 2\n", "line 2, column 1:"),
    ],
    ids=["duplicate", "alias", "tab", "not-utf8", "python-tag", "not-a-mapping", "unclosed"],
)
def test_bad_yaml_is_a_config_error_naming_the_line(
    tmp_path: Path, text: bytes, message: str
) -> None:
    """No traceback and no silent merge: each is a ConfigError with the file and the line."""
    path = tmp_path / "study.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    assert str(caught.value).startswith(f"{path}")
    assert message in str(caught.value)


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    """Nine levels of nine aliases would expand to 387 M items; the first alias stops it."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="anchors and aliases"):
        read_yaml(path)


@pytest.mark.parametrize("section", ["predictions", "imports", "strategies", "models"])
@pytest.mark.parametrize("name", ["../../../../x", "a/b", ".hidden", "-flag", "x y", "a;rm", ""])
def test_names_that_become_paths_are_strict(
    default_config: dict[str, Any], section: str, name: str
) -> None:
    """A name becomes a directory under results/ (or a sweep value in one): nothing that climbs
    out, hides, reads as an option or splits a shell word."""
    config = copy.deepcopy(default_config)
    entries = config[section]
    entries[name] = copy.deepcopy(next(iter(entries.values())))
    with pytest.raises(ConfigError, match=rf"config key {section}: .* does not match"):
        validate_config(config)


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("cluster", "connect_timeout_s"), 0.5, "cluster.connect_timeout_s"),
        (("run", "timeout_s"), 10**6, "run.timeout_s"),
        (("microbench", "max_bytes"), 2**31, "microbench.max_bytes"),
        (("microbench", "max_iters"), 10**6, "microbench.max_iters"),
        (("sweep", 0, "ranks_per_node"), [1000], "sweep[0].ranks_per_node[0]"),
        (("sweep", 0, "steps"), [10**7], "sweep[0].steps[0]"),
        (("sweep", 0, "repeat"), [0] * 101, "sweep[0].repeat"),
        (("sweep", 0, "repeat"), [100], "sweep[0].repeat[0]"),
    ],
)
def test_what_multiplies_cost_has_an_upper_bound(
    default_config: dict[str, Any], path: tuple, value: Any, where: str
) -> None:
    config = copy.deepcopy(default_config)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ConfigError, match=rf"config key {re.escape(where)}: "):
        validate_config(config)


@pytest.mark.parametrize(
    ("field", "subnet", "message"),
    [
        ("mgmt_subnet", "0.0.0.0/1", "is not inside a private or benchmarking range"),
        ("mgmt_subnet", "8.8.8.0/24", "is not inside a private or benchmarking range"),
        ("exp_subnet", "100.64.0.0/24", "is not inside a private or benchmarking range"),
        ("mgmt_subnet", "10.0.0.0/8", "use a prefix from /16 to /29"),
        ("exp_subnet", "192.168.1.0/30", "use a prefix from /16 to /29"),
        ("mgmt_subnet", "198.18.0.5/24", "has host bits set"),
        ("exp_subnet", "198.18.0.0/25", "overlap; give each its own subnet"),
    ],
)
def test_subnets_are_private_sane_and_apart(
    default_config: dict[str, Any], field: str, subnet: str, message: str
) -> None:
    """A netns cluster's subnets: inside RFC 1918 or RFC 2544 space (a bridge on 0.0.0.0/1 took
    over the host's routes), /16 to /29, and apart from each other; checked before anything
    runs, naming the key."""
    config = copy.deepcopy(default_config)
    config["cluster"][field] = subnet
    with pytest.raises(ConfigError, match=rf"cluster\.(mgmt|exp)_subnet.*{re.escape(message)}"):
        check_study(config, engine_problem=lambda engine: "")
    # The same range, a private one, passes.
    config["cluster"][field] = "10.77.0.0/24" if field == "mgmt_subnet" else "172.20.0.0/24"
    check_study(config, engine_problem=lambda engine: "")


@pytest.mark.parametrize(
    ("typo", "hint"),
    [
        (
            lambda c: c["run"].update(sampel_hz=5),
            "run.sampel_hz: unknown key 'sampel_hz'; did you mean 'sample_hz'?",
        ),
        (
            lambda c: c["sweep"][0].update(dealy=["1ms"]),
            "sweep[0].dealy: unknown key 'dealy'; did you mean 'delay'?",
        ),
        (
            lambda c: c["models"]["gpt-tiny"].update(hiden=64),
            "models.gpt-tiny.hiden: unknown key 'hiden'; did you mean 'hidden'?",
        ),
        (
            lambda c: c.update(zzz=1),
            "zzz: unknown key 'zzz'; known keys: cluster, imports, microbench, models",
        ),
    ],
    ids=["run", "sweep-block", "model", "top-level"],
)
def test_a_misspelt_key_gets_a_suggestion(
    default_config: dict[str, Any], typo: Any, hint: str
) -> None:
    config = copy.deepcopy(default_config)
    typo(config)
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    assert hint in str(caught.value)


def test_a_sweep_past_the_cell_limit_is_refused(default_config: dict[str, Any]) -> None:
    config = copy.deepcopy(default_config)
    config["sweep"] = [{**config["sweep"][0], "steps": list(range(1, 6)),
                        "repeat": list(range(100)), "bw": ["none", "1gbit", "2gbit"]}]  # fmt: skip
    with pytest.raises(ConfigError, match=r"sweep: 6000 cells, more than 5000"):
        check_study(config, engine_problem=lambda engine: "")


def test_the_estimate_counts_what_is_left_at_its_own_or_the_typical_time(
    default_config: dict[str, Any], tmp_path: Path
) -> None:
    """Three cells, one done; one of the two left ran before (its own 30 s counts), the other
    takes the median of the recorded times (10 and 30 s: 20 s). Two links, none recorded: the
    default each."""
    cells = cells_frame(validate_config(study(bw=["none", "10mbit", "20mbit"])))
    assert len(cells) == 3
    ids = [cell_id(row) for row in cells.to_dict("records")]
    done = tmp_path / "runs" / ids[0] / "raw"
    done.mkdir(parents=True)
    (done / "run.json").write_text("{}")
    for cid, seconds in ((ids[0], 10.0), (ids[1], 30.0)):
        bench = tmp_path / "benchmarks" / "run_cell" / f"{cid}.tsv"
        bench.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text(f"s\th:m:s\n{seconds}\t0:00:10\n")
    estimate = cfgmod.estimate_study(cells, ["bw~none/x", "bw~10mbit/x"], tmp_path)
    assert (estimate.cells, estimate.done, estimate.links, estimate.links_done) == (3, 1, 2, 0)
    assert estimate.cell_s == 30.0 + 20.0
    assert estimate.link_s == 2 * cfgmod.DEFAULT_LINK_S
    assert estimate.measured
    assert estimate.analysis_s == 2 * cfgmod.ANALYSIS_CELL_S  # two cells left to analyse
    assert estimate.describe().startswith(
        "3 cells (1 already done), 2 microbenchmark links (0 done): about 2 min of cluster time "
        "left, from this checkout's earlier run times"
    )
    fresh = cfgmod.estimate_study(cells, [], tmp_path / "nothing")
    assert fresh.cell_s == 3 * cfgmod.DEFAULT_CELL_S and not fresh.measured


def test_a_replay_cell_is_estimated_from_its_own_rules_benchmark(
    default_config: dict[str, Any], tmp_path: Path
) -> None:
    """A replay cell runs in run_replay_cell (workflow/rules/run.smk): its time is there."""
    cells = cells_frame(default_config)
    cells = cells[cells["strategy"] == "replay"].head(1)
    cid = cell_id(cells.iloc[0].to_dict())
    bench = tmp_path / "benchmarks" / "run_replay_cell" / f"{cid}.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\n42.0\t0:00:42\n")
    assert cfgmod.estimate_study(cells, [], tmp_path).cell_s == 42.0


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("results/runs/{strategy}/raw", None),
        ("results/logs/x.log", None),
        ("/tmp/x", "not under results/"),
        ("other/x", "not under results/"),
        ("results/../x", "'..' component"),
        ("results/{free}/x", "wildcards ['free'] are not limited"),
        ("results/{strategy,.*}/x", None),
    ],
)
def test_an_output_outside_results_is_named(pattern: str, why: str | None) -> None:
    got = path_escapes(pattern, {"strategy", "name"})
    assert got == why if why is None else why in got


def test_replay_entries_are_checked_before_anything_runs(default_config: dict[str, Any]) -> None:
    cfg = copy.deepcopy(default_config)
    cfg["replays"]["ddp-replayed"]["source"]["cell"]["bw"] = "33mbit"
    cfg["replays"]["dlrm-8gpu"]["source"] = {"import": "nope"}
    cfg["replays"]["dlrm-8gpu"]["ranks"] = [0, 0, 0, 1, 1, 2, 2, 3]
    cfg["strategies"]["replay"] = {"dp": -1}
    cfg["sweep"].append({**cfg["sweep"][-1], "strategy": ["replay"], "model": ["missing"]})
    with pytest.raises(ConfigError) as err:
        check_study(cfg)
    text = str(err.value)
    assert "strategies.replay: the name is reserved for replay cells" in text
    assert "sweep.model: 'missing' (strategy replay) is not defined under replays:" in text
    assert "replays.ddp-replayed.source.cell: strategy~ddp/model~gpt-tiny/nodes~2/" in text
    assert "bw~33mbit" in text and "is not a cell of this study's sweep" in text
    assert "replays.dlrm-8gpu.source.import: 'nope' is not defined under imports:" in text
    assert "replays.dlrm-8gpu.ranks: [0, 0, 0, 1, 1, 2, 2, 3] does not put ranks_per_node=2" in text


# ─────────────────────────────────────────────────────────── topology against the sweep

LEAF_SPINE = {"kind": "leaf-spine", "racks": 2, "nodes_per_rack": 2, "spines": 2}


def test_a_leaf_spine_study_is_checked_against_its_racks_and_rates() -> None:
    fits = {**study(nodes=4), "cluster": {"topology": {**LEAF_SPINE, "oversubscription": 2}}}
    assert len(checked(fits)) == 1
    too_many = {**study(nodes=8), "cluster": {"topology": LEAF_SPINE}}
    assert "2 racks x 2 nodes hold 4 nodes, the sweep asks for 8" in config_error(too_many)
    uncapped = {
        **study(nodes=4, bw=["none", "1gbit"]),
        "cluster": {"topology": {**LEAF_SPINE, "oversubscription": 2}},
    }
    assert "sweep.bw has uncapped values ['none']" in config_error(uncapped)
    real = {**study(), "cluster": {"backend": "ssh", "topology": LEAF_SPINE}}
    assert "leaf-spine is built on the netns backend only" in config_error(real)
    bad = {**study(), "cluster": {"topology": {**LEAF_SPINE, "links": {"node9": {"bw": "1gbit"}}}}}
    assert "cluster.topology.links.node9: no such link" in config_error(bad)


def test_a_node_override_must_hold_with_every_cell_that_uses_it() -> None:
    jitter = {**LEAF_SPINE, "links": {"node1": {"jitter": "2ms"}}}
    # A jitter alone is fine where the cells' delay carries it ...
    assert len(checked({**study(nodes=2, delay=["5ms"]), "cluster": {"topology": jitter}})) == 1
    # ... and refused, naming the link and the cell's link, where it would exceed the delay.
    message = config_error({**study(nodes=2), "cluster": {"topology": jitter}})
    assert "cluster.topology.links.node1: with the cell's link (rate=50mbit" in message
    assert "exceeds delay=0ms" in message
    # An override no cell runs on would be silently unused.
    unused = {**LEAF_SPINE, "links": {"node3": {"bw": "10mbit"}}}
    message = config_error({**study(nodes=2), "cluster": {"topology": unused}})
    assert "links.node3: no cell runs on node3 (placement pack" in message
    spread = {**unused, "placement": "spread", "links": {"node2": {"bw": "10mbit"}}}
    assert len(checked({**study(nodes=2), "cluster": {"topology": spread}})) == 1
