"""Values the checks used to accept that failed later (issue 23): each is refused up front,
naming its key. A mapping that names a dimension twice, a rate tc cannot shape, a model of
terabytes, a socket sampler that would only spin."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from commscope.config import SCHEMA_PATH, ConfigError, check_study, load_config, validate_config
from commscope.spec.link import MAX_RATE_BPS, LinkShape
from commscope.spec.models import MAX_MODEL_PARAMS, model_config, param_count
from commscope.spec.plan import ParallelPlan, mapping_problem
from commscope.spec.settings import RunSettings
from commscope.study import machine_memory_bytes, study_checks

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


# ─────────────────────────────────────────────────────────── model size


@pytest.mark.parametrize(
    "spec",
    [
        {"layers": 3, "hidden": 48, "heads": 4, "seq": 20, "vocab": 100, "batch": 2},
        {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 64, "batch": 2, "ffn_mult": 2},
        {"kind": "moe", "layers": 3, "hidden": 32, "heads": 2, "seq": 8, "vocab": 64,
         "batch": 2, "experts": 4, "moe_every": 2},
        {"kind": "resnet50", "image": 32, "batch": 2, "num_classes": 10},
        {"kind": "vgg16", "image": 32, "batch": 2, "num_classes": 7},
    ],
    ids=["gpt", "gpt-ffn2", "moe", "resnet50", "vgg16"],
)  # fmt: skip
def test_param_count_is_the_real_modules(spec: dict[str, Any]) -> None:
    from commscope.workload.models import GPT
    from commscope.workload.moe import MoEGPT
    from commscope.workload.vision import build_vision_model

    cfg = model_config(spec)
    kind = spec.get("kind", "gpt")
    with torch.device("meta"):
        module = {"gpt": GPT, "moe": MoEGPT}.get(kind, build_vision_model)(cfg)
    assert param_count(spec) == sum(p.numel() for p in module.parameters())


def test_a_model_of_terabytes_is_refused_naming_it(default: dict[str, Any]) -> None:
    # hidden: 1000000 made 4.8e13 parameters, 768 TB of training state per replica.
    cfg = copy.deepcopy(default)
    cfg["models"]["gpt-tiny"]["hidden"] = 1_000_000
    message = _problems(cfg)
    assert "models.gpt-tiny: 4.8e+13 parameters (layers=4, hidden=1000000" in message
    assert "768 TB of weights, gradients and AdamW state" in message
    assert f"at most {MAX_MODEL_PARAMS:.0e} parameters" in message
    assert message.count("\n") == 1  # not once more per cell


def test_a_cell_whose_state_exceeds_the_shared_memory_is_refused(
    default: dict[str, Any],
) -> None:
    cfg = copy.deepcopy(default)
    cfg["models"]["gpt-tiny"].update(hidden=4096, heads=8)  # 0.81e9 parameters, 13 GB a copy
    # The 4-node block of config/full.yaml (the default study trains 2 ranks at most).
    cfg["sweep"].append(
        {"strategy": ["ddp", "fsdp", "tp", "pp"], "model": ["gpt-tiny"], "nodes": [4],
         "ranks_per_node": [1], "bw": ["1gbit"], "steps": [6]}
    )  # fmt: skip
    message = _problems(cfg, memory_bytes=32 * 10**9)
    # DDP on 4 nodes holds 4 copies; FSDP, TP and PP one, which fits.
    assert "models.gpt-tiny: 8.1e+08 parameters do not fit " in message
    assert "cell strategy=ddp model=gpt-tiny nodes=4 ranks_per_node=1 (world 4) needs at " in (
        message
    )
    assert "more than the 32.0 GB of memory its ranks share" in message
    assert message.count("\n") == 1
    # Unknown memory (an ssh cluster): only the size cap applies.
    assert len(check_study(cfg, engine_problem=lambda engine: "")) > 50


def test_the_default_study_fits_a_small_machine(default: dict[str, Any]) -> None:
    assert len(check_study(default, engine_problem=lambda e: "", memory_bytes=2 * 10**9)) > 50


def test_machine_memory_is_memtotal(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree:         1024 kB\n")
    assert machine_memory_bytes(meminfo) == 16384 * 1024
    assert machine_memory_bytes(tmp_path / "none") is None
