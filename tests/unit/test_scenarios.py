"""commscope.predict.scenarios: named configurations beyond the cluster, their traffic tables
and node matrices (the workflow rules that write them: tests/integration/
test_scenarios_workflow.py).

The small scenario is checked by hand; the seed-002 scenarios against the numbers the
predictor already reproduces (tests/unit/test_predict.py) and against what the mapping must
do: the same bytes on other links.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from commscope import cli as commscope_cli
from commscope.predict import cli
from commscope.predict.scenarios import (
    SCENARIO_DEFAULTS,
    TABLE_COLUMNS,
    TRAFFIC_COLUMNS,
    ScenarioFiles,
    predict_scenario,
    resolve_scenario,
    scenario_files_table,
    scenario_tables,
    write_scenario,
    write_scenario_table,
)

# A 4-layer GPT small enough to count by hand: one micro-batch is batch/m = 1 sequence of 16
# tokens, so every activation message is 1 x 16 x 32 x 4 B = 2048 B (fp32).
TINY = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
ACT = 1 * 16 * 32 * 4
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
# Seed 002 §4 / appendix A: GPT-3B on 32 GPUs, 8 per node, (p, t, d) = (4, 2, 4), DeepSpeed's
# default mapping (TP and DP inside a node, one stage per node) and the customized one (TP
# and PP inside a node, DP across nodes).
SEED_3B = {"preset": "gpt-3b", "pp": 4, "tp": 2, "dp": 4, "gpus_per_node": 8}
DEFAULT, CUSTOM = "pp-dp-tp", "dp-pp-tp"


def _by_traffic(frame: pd.DataFrame) -> dict[str, dict]:
    return frame.set_index("traffic").to_dict("index")


def test_tiny_scenario_by_hand() -> None:
    """pp = 2 stages of 2 layers, tp = 2 inside a node (2 GPUs per node, pp-dp-tp: node =
    stage), m = 4 micro-batches, the torch framework (4 TP all-reduces per block backward, 2
    forward; no recomputation, no vocab-parallel ops, no tied embeddings, no DP)."""
    pred = predict_scenario(TINY_SCENARIO, "tiny")
    assert list(pred.traffic.columns) == TRAFFIC_COLUMNS
    assert (pred.scenario.nodes, pred.scenario.world_size) == (2, 4)
    r0 = _by_traffic(pred.traffic[pred.traffic["rank"] == 0])
    assert set(r0) == {"tp", "pp"}
    tp_msgs = 4 * 2 * (2 + 4)  # micro-batches x layers x all-reduces
    assert (r0["tp"]["messages"], r0["tp"]["bytes"]) == (tp_msgs, tp_msgs * ACT)
    # Ring all-reduce over 2 ranks: each sends 2(n-1)/n S = S, to its node neighbour.
    assert r0["tp"]["sent_bytes"] == r0["tp"]["intra_node_bytes"] == tp_msgs * ACT
    assert r0["tp"]["inter_node_bytes"] == 0
    # Stage 0 sends 4 activations and receives 4 gradients; only sends are transmitted.
    assert (r0["pp"]["messages"], r0["pp"]["bytes"]) == (8, 8 * ACT)
    assert r0["pp"]["sent_bytes"] == r0["pp"]["inter_node_bytes"] == 4 * ACT
    assert r0["pp"]["sizes"] == f"{ACT}x8"
    # Node matrix: each node keeps its two ranks' TP traffic; 2 ranks x 4 messages cross over
    # in each direction (activations forward, gradients backward).
    grid = pred.node_matrix.pivot_table(
        index="src_node", columns="dst_node", values="bytes", aggfunc="sum"
    )
    assert grid.to_numpy().tolist() == [
        [2 * tp_msgs * ACT, 2 * 4 * ACT],
        [2 * 4 * ACT, 2 * tp_msgs * ACT],
    ]
    totals = _by_traffic(pred.totals())
    assert totals["tp"]["messages"] == 4 * tp_msgs and totals["pp"]["messages"] == 4 * 8
    per_node = pred.per_node()
    assert (
        per_node.groupby("node")["sent_bytes"].sum().tolist()
        == [2 * tp_msgs * ACT + 2 * 4 * ACT] * 2
    )


def test_mapping_tp_across_nodes_moves_tp_bytes_to_the_network() -> None:
    """The same tiny job with pp innermost (tp-dp-pp): the TP pairs straddle the two nodes and
    the pipeline stays inside one, so every TP byte crosses the network and no PP byte does;
    the bytes per traffic type are unchanged."""
    inside = predict_scenario(TINY_SCENARIO, "tp-inside")
    across = predict_scenario(TINY_SCENARIO | {"mapping": "tp-dp-pp"}, "tp-across")
    a, b = _by_traffic(inside.totals()), _by_traffic(across.totals())
    for kind in ("tp", "pp"):
        assert a[kind]["sent_bytes"] == b[kind]["sent_bytes"]
        assert a[kind]["messages"] == b[kind]["messages"]
    assert a["tp"]["inter_node_bytes"] == 0 < a["tp"]["intra_node_bytes"]
    assert b["tp"]["intra_node_bytes"] == 0
    assert b["tp"]["inter_node_bytes"] == a["tp"]["intra_node_bytes"]
    assert a["pp"]["intra_node_bytes"] == 0 and b["pp"]["inter_node_bytes"] == 0
    assert b["pp"]["intra_node_bytes"] == a["pp"]["inter_node_bytes"]


def test_seed002_gpt3b_rank0_traffic() -> None:
    """Rank 0 of GPT-3B (4, 2, 4), Megatron/DeepSpeed PTD-P (fp16, recomputation,
    vocab-parallel embedding, m = 8): the numbers test_predict derives term by term."""
    t0 = time.perf_counter()
    pred = predict_scenario(SEED_3B | {"mapping": DEFAULT}, "gpt-3b-32gpu-default")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10 and pred.seconds <= elapsed  # seconds, not minutes; typically < 0.5 s
    table = _by_traffic(pred.table())
    want = {  # traffic: (messages, payload bytes) at rank 0
        "tp": (680, 680 * 131_072_000),  # 89.13 GB
        "pp": (16, 16 * 131_072_000),  # 2.10 GB
        "dp": (1, 777_492_000),
        "emb": (1, 100_864_000),
    }
    for kind, (msgs, nbytes) in want.items():
        assert (table[kind]["rank0_messages"], table[kind]["rank0_bytes"]) == (msgs, nbytes)
    assert table["tp"]["rank0_bytes"] == 89_128_960_000
    assert table["tp"]["rank0_sizes"] == "131072000x680"
    assert table["all"]["rank0_bytes"] == sum(b for _, b in want.values())
    # The job: 8 ranks per stage, 8 micro-batches; per micro-batch stage 0 runs 14 layers x 6
    # all-reduces + the embedding's, stage 1 14 x 6, stage 2 13 x 6, stage 3 13 x 6 + the
    # head's input gradient + 3 cross-entropy statistics.
    assert table["tp"]["messages"] == 8 * 8 * ((14 * 6 + 1) + 14 * 6 + 13 * 6 + (13 * 6 + 4))
    assert table["pp"]["messages"] == 8 * 8 * (2 + 4 + 4 + 2)  # end stages talk to one side
    assert pred.traffic["rank"].nunique() == 32


@pytest.fixture(scope="module")
def seed_mappings() -> dict[str, pd.DataFrame]:
    return {
        m: predict_scenario(SEED_3B | {"mapping": m}, f"gpt-3b-{m}")
        for m in (DEFAULT, CUSTOM, "tp-dp-pp")
    }


def test_seed002_mappings_move_bytes_between_links(seed_mappings: dict) -> None:
    """Default: stages across nodes (PP and the first/last-stage embedding sync cross the
    network, TP and DP stay inside); customized: replicas across nodes (only DP crosses);
    TP outermost (tp-dp-pp): the TP pairs straddle nodes. Per traffic type the job sends the
    same bytes whatever the mapping."""
    tables = {m: _by_traffic(p.table()) for m, p in seed_mappings.items()}
    share = {m: {k: v["inter_node_share"] for k, v in t.items()} for m, t in tables.items()}
    assert {k: share[DEFAULT][k] for k in ("tp", "pp", "dp", "emb")} == {
        "tp": 0.0,
        "pp": 1.0,
        "dp": 0.0,
        "emb": 1.0,
    }
    assert {k: share[CUSTOM][k] for k in ("tp", "pp", "dp", "emb")} == {
        "tp": 0.0,
        "pp": 0.0,
        "dp": 1.0,
        "emb": 0.0,
    }
    assert share["tp-dp-pp"]["tp"] == 1.0
    tp_bytes = tables[DEFAULT]["tp"]["sent_bytes"]
    assert tables["tp-dp-pp"]["tp"]["inter_node_bytes"] == tp_bytes
    assert tables[DEFAULT]["tp"]["intra_node_bytes"] == tp_bytes
    for kind in ("tp", "pp", "dp", "emb", "all"):
        sent = {t[kind]["sent_bytes"] for t in tables.values()}
        msgs = {t[kind]["messages"] for t in tables.values()}
        assert len(sent) == 1 and len(msgs) == 1, kind
    # The customized mapping puts less on the network: DP once per step beats PP per
    # micro-batch.
    assert tables[CUSTOM]["all"]["inter_node_bytes"] < tables[DEFAULT]["all"]["inter_node_bytes"]


def test_node_matrix_is_square_and_sums_to_the_split(seed_mappings: dict) -> None:
    for pred in seed_mappings.values():
        nm = pred.node_matrix
        grid = nm.pivot_table(index="src_node", columns="dst_node", values="bytes", aggfunc="sum")
        assert grid.shape == (4, 4) and list(grid.index) == list(grid.columns) == [0, 1, 2, 3]
        job = _by_traffic(pred.table())["all"]
        diagonal = nm["src_node"] == nm["dst_node"]
        assert nm["bytes"].sum() == pytest.approx(job["intra_node_bytes"] + job["inter_node_bytes"])
        assert nm.loc[diagonal, "bytes"].sum() == pytest.approx(job["intra_node_bytes"])
        assert nm.loc[~diagonal, "bytes"].sum() == pytest.approx(job["inter_node_bytes"])
        assert nm["bytes"].sum() == pytest.approx(job["sent_bytes"])
        # Per row of the traffic table too: the split covers what the rank sends.
        t = pred.traffic
        assert (t["intra_node_bytes"] + t["inter_node_bytes"]).to_numpy() == pytest.approx(
            t["sent_bytes"].to_numpy()
        )


def test_seed002_scenarios_each_take_seconds() -> None:
    """The five seed-002 scenarios of the default config: GPT-1.5B on 16 GPUs (4, 2, 2) and
    GPT-3B on 32 GPUs (4, 2, 4), default and customized mapping, and (4, 4, 2)."""
    settings = [
        ("gpt-1.5b", (4, 2, 2), DEFAULT),
        ("gpt-1.5b", (4, 2, 2), CUSTOM),
        ("gpt-3b", (4, 2, 4), DEFAULT),
        ("gpt-3b", (4, 2, 4), CUSTOM),
        ("gpt-3b", (4, 4, 2), DEFAULT),
    ]
    for preset, (p, t, d), mapping in settings:
        t0 = time.perf_counter()
        pred = predict_scenario(
            {"preset": preset, "pp": p, "tp": t, "dp": d, "mapping": mapping}, preset
        )
        assert time.perf_counter() - t0 < 10
        assert pred.scenario.nodes == p * t * d // 8
        assert pred.traffic["rank"].nunique() == p * t * d


def test_resolve_scenario_defaults_and_errors() -> None:
    sc = resolve_scenario({"preset": "gpt-1.5b", "pp": 4, "tp": 2, "dp": 2}, "x")
    assert (sc.nodes, sc.gpus_per_node, sc.dtype_bytes) == (2, 8, 2)
    assert sc.plan.microbatches == 8 and sc.options.framework == "megatron"
    assert sc.options.recompute and sc.options.vocab_parallel
    # A schema that fills every key with its default gives the same scenario.
    filled = {k: v for k, v in SCENARIO_DEFAULTS.items()} | {
        "preset": "gpt-1.5b",
        "pp": 4,
        "tp": 2,
        "dp": 2,
    }
    assert resolve_scenario(filled, "x") == sc
    # A preset with one key changed.
    changed = resolve_scenario({"preset": "gpt-3b", "model": {"layers": 56}, "tp": 8}, "y")
    assert changed.model["layers"] == 56 and changed.model["hidden"] == 2000
    assert changed.model_name == "gpt-3b (modified)"
    with pytest.raises(ValueError, match="unknown keys"):
        resolve_scenario({"preset": "gpt-3b", "tensor_parallel": 2}, "z")
    with pytest.raises(ValueError, match="preset"):
        resolve_scenario({"preset": "gpt-175b"}, "z")
    with pytest.raises(ValueError, match="not a multiple of gpus_per_node"):
        resolve_scenario({"preset": "gpt-3b", "pp": 3}, "z")
    with pytest.raises(ValueError, match="give a preset or a model"):
        resolve_scenario({"pp": 2}, "z")


def test_scenario_tables_concatenate_written_scenarios(tmp_path: Path) -> None:
    dirs = []
    for name, mapping in (("tiny-default", "pp-dp-tp"), ("tiny-tp-across", "tp-dp-pp")):
        pred = predict_scenario(TINY_SCENARIO | {"mapping": mapping}, name)
        write_scenario(pred, tmp_path / name)
        dirs.append(tmp_path / name)
    table = scenario_tables(dirs)
    assert list(table.columns) == TABLE_COLUMNS
    assert table["scenario"].tolist() == ["tiny-default"] * 3 + ["tiny-tp-across"] * 3
    assert table["traffic"].tolist() == ["tp", "pp", "all"] * 2
    assert (table["predict_seconds"] > 0).all()
    tp = table[table["traffic"] == "tp"].set_index("scenario")["inter_node_share"]
    assert tp.to_dict() == {"tiny-default": 0.0, "tiny-tp-across": 1.0}
    assert scenario_tables([]).columns.tolist() == TABLE_COLUMNS


def test_scenario_files_are_the_callers_paths(tmp_path: Path) -> None:
    # The workflow declares every file; the package writes and reads exactly those paths.
    pred = predict_scenario(TINY_SCENARIO, "tiny")
    files = ScenarioFiles(
        traffic=tmp_path / "t" / "a.parquet",
        node_matrix=tmp_path / "n" / "b.parquet",
        rank_matrix=tmp_path / "r" / "c.parquet",
        meta=tmp_path / "m" / "d.json",
    )
    assert write_scenario(pred, files) == files.paths()
    assert all(p.is_file() for p in files.paths())
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "a.parquet",
        "b.parquet",
        "c.parquet",
        "d.json",
    ]
    table = scenario_files_table([files.traffic], [files.meta])
    write_scenario(pred, tmp_path / "dir")
    expected = scenario_tables([tmp_path / "dir"])
    pd.testing.assert_frame_equal(
        table.drop(columns="predict_seconds"), expected.drop(columns="predict_seconds")
    )
    out = tmp_path / "table.parquet"
    write_scenario_table([files.traffic], [tmp_path / "missing.json"], out)
    assert pd.read_parquet(out)["predict_seconds"].isna().all()


def test_cli_writes_the_scenario_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"predictions": {"tiny": TINY_SCENARIO}}))
    out = tmp_path / "out"
    # Through the `commscope predict` command, which hands the predictor the heatmap writer.
    rc = commscope_cli.main(
        ["predict", "--config", str(config), "--scenario", "tiny", "--out", str(out)]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "whole job, one step" in text and "inter share" in text
    for name in ("traffic.parquet", "node_matrix.parquet", "rank_matrix.parquet", "ops.parquet"):
        assert (out / name).exists(), name
    assert (out / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    want = predict_scenario(TINY_SCENARIO, "tiny").traffic
    pd.testing.assert_frame_equal(pd.read_parquet(out / "traffic.parquet"), want)
    # The same scenario from flags prints the same rank-0 line.
    rc = cli.main(
        ["--layers", "4", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "64"]
        + ["--batch", "4", "--pp", "2", "--tp", "2", "--mapping", "pp-dp-tp"]
        + ["--microbatches", "4", "--gpus-per-node", "2"]
    )
    assert rc == 0 and f"{ACT}x8" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--config", str(config), "--scenario", "missing"])
