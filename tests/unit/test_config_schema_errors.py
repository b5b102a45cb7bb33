"""What the schema refuses and how it says so: unknown keys at every depth and empty lists
wherever a list is required, each named by its path in a few lines (issue 23).

The cases are generated: the schema is walked to check that every object is closed and every
list needs an item, and a config that has every kind of object and list in it (the default
study, plus the shapes it leaves out) is walked to try a misspelt key in each object and an
empty list in place of each list.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from commscope.config import SCHEMA_PATH, ConfigError, read_yaml, validate_config
from commscope.spec.schema_errors import key_path, short_repr

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((ROOT / SCHEMA_PATH).read_text())
# Mappings from a user's name to an entry: any key is a name, so none is unknown there.
NAMED_ENTRIES = {"strategies", "models", "imports", "replays", "predictions"}
# A few lines, never the whole sweep: jsonschema's own oneOf error printed over 1,000 characters.
MAX_MESSAGE_CHARS = 400


def _every_kind_of_entry() -> dict[str, Any]:
    """The default study plus what it leaves out (a prediction's model, a replay's placement),
    validated: every object and list the schema allows appears somewhere in it."""
    config = read_yaml(ROOT / "config" / "config.yaml")
    prediction = next(iter(config["predictions"].values()))
    prediction["model"] = {"layers": 2, "seq": 512}
    config["replays"]["dlrm-8gpu"]["ranks"] = [0, 0, 1, 1, 2, 2, 3, 3]
    config["sweep"][0]["delay"] = ["0ms"]
    config["sweep"][0].update(jitter=["0ms"], loss=["0pct"], cc=["cubic"], repeat=[0])
    return validate_config(config, ROOT / SCHEMA_PATH)


FULL = _every_kind_of_entry()


def _walk(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) of a config, depth first."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, i))


def _at(config: dict[str, Any], path: tuple) -> Any:
    for part in path:
        config = config[part]
    return config


def _refusal(config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_config(config, ROOT / SCHEMA_PATH)
    message = str(caught.value)
    assert len(message) <= MAX_MESSAGE_CHARS, message
    return message


OBJECTS = [
    path
    for path, value in _walk(FULL)
    if isinstance(value, dict) and value and (not path or path[-1] not in NAMED_ENTRIES)
]
LISTS = [path for path, value in _walk(FULL) if isinstance(value, list)]


def test_the_walk_reaches_every_depth() -> None:
    # Top level, sections, named entries, a prediction's model, a replay's source and its cell,
    # a sweep block, a microbenchmark link: the shapes a typo can hide in.
    reached = {key_path(p) for p in OBJECTS}
    for where in (
        "(top level)",
        "cluster",
        "run",
        "microbench",
        "microbench.links[0]",
        "strategies.dp-tp",
        "imports.nccl-coll-log",
        "replays.ddp-replayed",
        "replays.ddp-replayed.source",
        "replays.ddp-replayed.source.cell",
        "predictions.gpt-1.5b-16gpu-default",
        "predictions.gpt-1.5b-16gpu-default.model",
        "models.moe-tiny",
        "sweep[0]",
    ):
        assert where in reached
    assert len(LISTS) > 40


@pytest.mark.parametrize("path", OBJECTS, ids=key_path)
def test_an_unknown_key_is_named_at_any_depth(path: tuple) -> None:
    config = copy.deepcopy(FULL)
    _at(config, path)["zz_unknown"] = 1
    message = _refusal(config)
    where = key_path((*path, "zz_unknown"))
    assert f"config key {where}: unknown key 'zz_unknown'" in message
    assert message.count("\n") == 0  # one problem, one line


@pytest.mark.parametrize("path", OBJECTS, ids=key_path)
def test_a_misspelt_key_gets_its_did_you_mean_at_any_depth(path: tuple) -> None:
    config = copy.deepcopy(FULL)
    target = _at(config, path)
    key = next(iter(target))
    target[f"{key}s"] = target.pop(key)
    message = _refusal(config)
    assert f"{key_path((*path, f'{key}s'))}: unknown key '{key}s'; did you mean {key!r}" in message


@pytest.mark.parametrize("path", LISTS, ids=key_path)
def test_an_empty_list_is_refused_wherever_a_list_is_required(path: tuple) -> None:
    config = copy.deepcopy(FULL)
    parent = _at(config, path[:-1])
    parent[path[-1]] = []
    message = _refusal(config)
    assert f"config key {key_path(path)}: an empty list; list at least one value" in message


def _schema_nodes(node: Any, where: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema (dict) of the schema with its location, $defs included."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _schema_nodes(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _schema_nodes(value, f"{where}/{i}")


def test_every_object_of_the_schema_is_closed() -> None:
    """No object takes keys it does not know: each closes itself, or (a $defs shape) is
    closed with unevaluatedProperties wherever it is used."""
    shapes = {f"$/$defs/{name}" for name in SCHEMA["$defs"]}
    open_objects = []
    for where, node in _schema_nodes(SCHEMA):
        if "properties" not in node:
            continue
        closed = False in (node.get("additionalProperties"), node.get("unevaluatedProperties"))
        if not closed and where in shapes:
            ref = where.replace("$/", "#/", 1)
            uses = [n for _, n in _schema_nodes(SCHEMA) if n.get("$ref") == ref]
            closed = bool(uses) and all(n.get("unevaluatedProperties") is False for n in uses)
        if not closed:
            open_objects.append(where)
    assert open_objects == []


def test_every_list_of_the_schema_needs_an_item() -> None:
    """A list the config gives is never empty: an empty axis would make a study of no cells
    (accepted before as "ok, 0 cells"); a key that may be left out says so by its default."""
    arrays = [w for w, n in _schema_nodes(SCHEMA) if n.get("type") == "array"]
    assert len(arrays) >= 14
    assert [w for w in arrays if _schema_at(w).get("minItems", 0) < 1] == []


def _schema_at(where: str) -> dict[str, Any]:
    node: Any = SCHEMA
    for part in where.split("/")[1:]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


# ─────────────────────────────────────────────────────────── the cases issue 23 found


def test_a_renamed_key_in_a_sweep_block_names_the_block_the_key_and_the_fix() -> None:
    # bandwidth for bw: difflib finds nothing that close, but bw is the required key missing.
    config = copy.deepcopy(FULL)
    config["sweep"][2]["bandwidth"] = config["sweep"][2].pop("bw")
    message = _refusal(config)
    assert message == (
        "config key sweep[2].bandwidth: unknown key 'bandwidth'; did you mean 'bw' (required, "
        "not given)? (schema: config.schema.yaml)"
    )
    # The same in a single block (the sweep's other form).
    single = copy.deepcopy(FULL)
    single["sweep"] = copy.deepcopy(config["sweep"][2])
    assert "config key sweep.bandwidth: unknown key 'bandwidth'; did you mean 'bw'" in (
        _refusal(single)
    )


def test_an_empty_axis_names_the_block_the_axis_and_its_default() -> None:
    config = copy.deepcopy(FULL)
    config["sweep"][3]["delay"] = []
    assert _refusal(config) == (
        "config key sweep[3].delay: an empty list; list at least one value, or leave delay "
        "out (default ['0ms']) (schema: config.schema.yaml)"
    )


@pytest.mark.parametrize(
    ("sweep", "expected"),
    [
        ({}, "config key sweep: empty; give the required keys strategy, model, nodes"),
        ([], "config key sweep: an empty list; list at least one value"),
        ([{}], "config key sweep[0]: empty; give the required keys strategy, model, nodes"),
        ("ddp", "config key sweep: 'ddp' should be a mapping (key: value) or a list"),
    ],
    ids=["empty-block", "empty-list", "empty-block-in-list", "a-string"],
)
def test_an_empty_or_misshapen_sweep_says_what_a_sweep_is(sweep: Any, expected: str) -> None:
    config = copy.deepcopy(FULL)
    config["sweep"] = sweep
    message = _refusal(config)
    assert expected in message
    assert "not valid under any of the given schemas" not in message


def test_several_problems_are_listed_one_line_each() -> None:
    config = copy.deepcopy(FULL)
    config["sweep"][0]["dealy"] = ["1ms"]
    config["sweep"][1]["nodes"] = []
    config["run"]["sample_hz"] = 10**6
    lines = _refusal(config).splitlines()
    assert lines[0] == "3 problems (schema: config.schema.yaml):"
    assert lines[1:] == [
        "  - config key run.sample_hz: 1000000 is greater than the maximum of 10000",
        "  - config key sweep[0].dealy: unknown key 'dealy'; did you mean 'delay'?",
        "  - config key sweep[1].nodes: an empty list; list at least one value",
    ]


def test_many_problems_are_counted_past_the_first_eight() -> None:
    config = copy.deepcopy(FULL)
    blocks = len(config["sweep"])
    assert blocks > 8
    for block in config["sweep"]:
        block["nodes"] = []
    with pytest.raises(ConfigError) as caught:
        validate_config(config, ROOT / SCHEMA_PATH)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith(f"{blocks} problems")
    assert len(lines) == 1 + 8 + 1 and lines[-1] == f"  - ... and {blocks - 8} more"


def test_unknown_keys_close_to_none_share_one_line() -> None:
    config = copy.deepcopy(FULL)
    config["sweep"][0].update({f"zz{i}": 1 for i in range(3)})
    assert _refusal(config) == (
        "config key sweep[0]: unknown keys 'zz0', 'zz1', 'zz2'; known keys: bw, cc, delay, "
        "jitter, loss, model, nodes, ranks_per_node, repeat, steps, strategy (schema: "
        "config.schema.yaml)"
    )


def test_a_pattern_error_says_what_the_pattern_stands_for() -> None:
    config = copy.deepcopy(FULL)
    config["sweep"][0]["bw"] = ["100mb"]
    message = _refusal(config)
    assert "config key sweep[0].bw[0]: '100mb' does not match" in message
    assert "(A rate cap: a number with kbit, mbit or gbit" in message


def test_a_forbidden_value_names_what_is_allowed() -> None:
    config = copy.deepcopy(FULL)
    config["strategies"]["dp-tp"]["tp"] = 0
    assert "config key strategies.dp-tp.tp: 0 is not allowed here (A parallel degree" in (
        _refusal(config)
    )


def test_short_repr_cuts_a_sweep_to_a_line() -> None:
    assert len(short_repr(FULL["sweep"])) <= 100
    assert key_path(["sweep", 2, "bandwidth"]) == "sweep[2].bandwidth"
    assert key_path([]) == "(top level)"
