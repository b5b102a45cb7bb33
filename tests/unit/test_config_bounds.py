"""Values the checks used to accept that failed later (issue 23): each is refused up front,
naming its key. A mapping that names a dimension twice, a rate tc cannot shape, a socket
sampler that would only spin."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from commscope.config import SCHEMA_PATH, ConfigError, check_study, load_config, validate_config
from commscope.spec.link import MAX_RATE_BPS, LinkShape
from commscope.spec.plan import ParallelPlan, mapping_problem
from commscope.spec.settings import RunSettings
from commscope.study import study_checks

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / SCHEMA_PATH


@pytest.fixture
def default(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    # The link engine's probe starts processes (tests/integration covers it): here it passes.
    monkeypatch.setattr("commscope.study.local_engine_problem", lambda requested: "")
    return load_config(ROOT / "config" / "config.yaml", SCHEMA)


def _problems(config: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        check_study(config, engine_problem=lambda engine: "", **kw)
    return str(caught.value)


# ─────────────────────────────────────────────────────────── mapping


@pytest.mark.parametrize(
    ("mapping", "why"),
    [
        ("pp-dp-tp", ""),
        ("dp-dp-tp", "'dp-dp-tp' names dp twice"),
        ("tp-dp-tp-dp", "'tp-dp-tp-dp' names dp, tp twice"),
        ("pp-xp", "'pp-xp' has ['xp'] (no such dimension)"),
    ],
)
def test_mapping_problem(mapping: str, why: str) -> None:
    got = mapping_problem(mapping)
    assert got.startswith(why) if why else got == ""
    if why:
        assert "use each of pp, dp, ep, tp at most once" in got
        with pytest.raises(ValueError, match="strategy mapping "):
            ParallelPlan(mapping=mapping).order()


def test_a_prediction_mapping_naming_a_dimension_twice_is_refused(
    default: dict[str, Any],
) -> None:
    # Accepted before: the predictor never ordered the mesh of a scenario until it ran.
    cfg = copy.deepcopy(default)
    cfg["predictions"]["gpt-1.5b-16gpu-default"]["mapping"] = "dp-dp-tp"
    message = _problems(cfg)
    assert "predictions.gpt-1.5b-16gpu-default.mapping: 'dp-dp-tp' names dp twice" in message
    assert message.count("\n") == 1  # the one problem


def test_a_strategy_mapping_is_named_once_by_its_key(default: dict[str, Any]) -> None:
    cfg = copy.deepcopy(default)
    cfg["strategies"]["dp-tp"]["mapping"] = "dp-dp-tp"
    message = _problems(cfg)
    assert "strategies.dp-tp.mapping: 'dp-dp-tp' names dp twice" in message
    assert "cell strategy=dp-tp" not in message


# ─────────────────────────────────────────────────────────── rate


@pytest.mark.parametrize("bw", ["99999999999999999999gbit", "401gbit", "400000.5mbit"])
def test_a_rate_above_what_tc_shapes_is_refused_naming_bw(bw: str) -> None:
    with pytest.raises(ValueError, match=rf"bw={bw!r} is above the fastest cap .* 400gbit"):
        LinkShape.parse(bw)


def test_the_fastest_rate_is_accepted() -> None:
    assert LinkShape.parse("400gbit").rate_bps == MAX_RATE_BPS
    assert LinkShape.parse("none").rate_bps is None


def test_a_digits_only_rate_is_refused_naming_its_block(default: dict[str, Any]) -> None:
    # Accepted before and refused only by tc at shaping time ('illegal value for "burst"').
    cfg = copy.deepcopy(default)
    cfg["sweep"][2]["bw"] = ["99999999999999999999gbit"]
    message = _problems(cfg)
    assert "sweep[2]: bw='99999999999999999999gbit' is above the fastest cap" in message
    assert "use 'none' for no cap" in message


def test_a_rate_longer_than_any_rate_is_refused_by_the_schema(default: dict[str, Any]) -> None:
    cfg = copy.deepcopy(default)
    cfg["sweep"][0]["bw"] = ["9" * 400 + "gbit"]
    with pytest.raises(ConfigError, match=r"config key sweep\[0\]\.bw\[0\]: .* is too long"):
        validate_config(cfg, SCHEMA)


def test_a_microbenchmark_link_is_checked_like_a_sweep_link(default: dict[str, Any]) -> None:
    cfg = copy.deepcopy(default)
    cfg["microbench"]["links"][1]["bw"] = "1000gbit"
    with pytest.raises(ConfigError, match=r"microbench\.links\[1\]: bw='1000gbit' is above"):
        study_checks(cfg, ROOT)


# ─────────────────────────────────────────────────────────── socket_hz


@pytest.mark.parametrize("hz", [1e9, 101, 0.5, -1])
def test_a_socket_rate_the_sampler_cannot_keep_is_refused(
    default: dict[str, Any], hz: float
) -> None:
    cfg = copy.deepcopy(default)
    cfg["run"]["socket_hz"] = hz
    with pytest.raises(ConfigError, match=r"^config key run\.socket_hz: "):
        validate_config(cfg, SCHEMA)
    with pytest.raises(ValueError, match=r"run\.socket_hz=.*: use 0 \(off\) or 1 to 100 Hz"):
        RunSettings(socket_hz=hz)


@pytest.mark.parametrize("hz", [0, 1, 10, 100, 2.5])
def test_socket_rates_the_sampler_keeps_pass(default: dict[str, Any], hz: float) -> None:
    cfg = copy.deepcopy(default)
    cfg["run"]["socket_hz"] = hz
    assert validate_config(cfg, SCHEMA)["run"]["socket_hz"] == hz
    assert RunSettings(socket_hz=hz).socket_hz == hz


def test_socket_hz_still_defaults_to_10(default: dict[str, Any]) -> None:
    assert default["run"]["socket_hz"] == 10
