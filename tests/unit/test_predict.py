"""commscope.predict: the analytical op list against PyTorch's own rules, seed 002's equations
and a recorded cell (the comparison with real gloo traces:
tests/integration/test_predict_gloo.py).

These tests build no process group.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from commscope.predict import cli
from commscope.predict.cell import predict_cell
from commscope.predict.compare import summarize
from commscope.predict.frameworks import bucket_assignment, ddp_bucket_limits
from commscope.predict.matrix import node_matrix, rank_matrix
from commscope.predict.ops import predict_ops
from commscope.predict.options import PredictOptions
from commscope.predict.scenarios import resolve_scenario
from commscope.predict.schedule import schedule_actions
from commscope.predict.shapes import Param, gpt_params, grad_ready_order, moe_params
from commscope.predict.timing import (
    bubble_fraction,
    effective_bandwidth,
    predict_step_time,
    wire_bytes,
)
from commscope.spec.models import model_config
from commscope.spec.plan import ParallelPlan

FP32 = 4
TINY = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
H, L, S, V, B = (TINY[k] for k in ("hidden", "layers", "seq", "vocab", "batch"))
BLOCK = 2 * 2 * H + 4 * (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H)
FULL = V * H + S * H + L * BLOCK + 2 * H + H * V
# The default study's model (config/config.yaml models: gpt-tiny).
GPT_TINY = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 1024, "batch": 8}
# Seed 002's GPT-3B: (l, h, s, b, m) = (54, 2000, 1024, 32, 8); per-replica batch b * m.
GPT3B = {"layers": 54, "hidden": 2000, "heads": 20, "seq": 1024, "vocab": 50257, "batch": 256}
PTD_424 = {"pp": 4, "tp": 2, "dp": 4, "microbatches": 8}


def _per(pred: pd.DataFrame, rank: int) -> dict[str, tuple[int, int]]:
    """traffic -> (messages, bytes) of one rank."""
    g = pred[pred["rank"] == rank].groupby("traffic")["bytes"]
    return {t: (int(n), int(b)) for t, n, b in zip(g.size().index, g.size(), g.sum(), strict=True)}


# ─────────────────────────────────────────────────────────── PyTorch's own rules


@pytest.mark.parametrize("limits", [[1000, 1000], [300, 1000], [1, 1]])
def test_bucket_assignment_is_pytorchs(limits: list[int]) -> None:
    import torch
    import torch.distributed as dist

    numels = [10, 300, 5, 700, 20, 260, 1, 999, 3]
    order = [8, 2, 5, 0, 7, 1, 6, 3, 4]  # some gradient-ready order
    tensors = [torch.empty(numels[i]) for i in order]
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * 9, order)
    ours = bucket_assignment([numels[i] * FP32 for i in order], limits)
    assert [[order[i] for i in b] for b in ours] == [list(b) for b in theirs]


def test_grad_ready_order_is_autogrades() -> None:
    """The rule DDP's bucket rebuild depends on, against real autograd hooks (GPT and MoE)."""
    import torch

    from commscope.spec.models import GPTConfig, MoEConfig
    from commscope.workload.models import GPT, lm_loss, synthetic_batch
    from commscope.workload.moe import MoEGPT

    torch.manual_seed(0)
    for cfg, model, params in (
        (g := GPTConfig(**TINY), GPT(g), gpt_params(g, range(L))),
        (mc := MoEConfig(**TINY, experts=4, top_k=2), MoEGPT(mc), moe_params(mc)),
    ):
        ready: list[str] = []
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(lambda _p, n=name, out=ready: out.append(n))
        x, y = synthetic_batch(cfg, 2, 0)
        out = model(x)
        loss = lm_loss(out[0], y) + out[1] if isinstance(out, tuple) else lm_loss(out, y)
        loss.backward()
        assert [p.name for p in params] == [n for n, _ in model.named_parameters()]
        assert [params[i].name for i in grad_ready_order(params)] == ready


def test_fsdp_shard_pads_dim0_like_torch_chunk() -> None:
    assert Param("w", (65, 32)).fsdp_shard_numel(2) == 33 * 32
    assert Param("b", (32,)).fsdp_shard_numel(3) == 11
    assert Param("w", (128, 64)).fsdp_shard_numel(4) == 32 * 64


# ─────────────────────────────────────────────────────────── strategies, from the shapes


def test_ddp_buckets_hold_every_gradient() -> None:
    cap_mb = 0.01
    pred = predict_ops(TINY, {"dp": -1, "bucket_cap_mb": cap_mb}, 2, 1)
    for _, ops in pred.groupby("rank"):
        assert (ops["op"] == "allreduce").all() and (ops["traffic"] == "dp").all()
        assert ops["bytes"].sum() == FULL * FP32
        # Every bucket but the last reached the cap (a bucket closes once it is >= the cap).
        assert (ops["bytes"].iloc[:-1] >= int(cap_mb * 2**20)).all()
    one = predict_ops(TINY, {"dp": -1}, 2, 1)  # 25 MiB: one bucket
    assert one.groupby("rank").size().tolist() == [1, 1]


@pytest.mark.parametrize("cap_mb", [None, 25, 25.0, 1, 0.5, 0.01])
def test_ddp_bucket_limits_are_pytorchs(cap_mb: float | None) -> None:
    """The caps DDP sets from its bucket_cap_mb argument (None: the argument left out)."""
    from torch.nn.parallel.distributed import _BucketCapacityConfig

    torch_caps = _BucketCapacityConfig.create(cap_mb, None, use_python_reducer=False)
    first, cap = ddp_bucket_limits(cap_mb)
    assert (first, cap) == (torch_caps.first_bucket_bytes_cap, torch_caps.bucket_bytes_cap)
    # Only a DDP built without the argument has a smaller first bucket; 25 given is not that.
    assert (first < cap) == (cap_mb is None)


def test_ddp_default_buckets_of_gpt_tiny() -> None:
    """The default study's model: 4,254,720 B of fp32 gradients (1,063,680 parameters).

    In gradient-ready order the head (1024 x 128), the final norm (2 x 128) and the last block's
    MLP (fc2 128 x 512 + 128, fc1 512 x 128 + 512) are 263,040 parameters, 1,052,160 B: the
    first to reach 1 MiB (1,048,576 B) closes the first bucket; the rest fit one 25 MiB bucket.
    These are the sizes torch 2.13's DDP reports (``rebuilt_bucket_sizes`` of
    ``_get_ddp_logging_data()``) on 2 gloo ranks after its rebuild, with and without the cap.
    """

    def dp_sizes(plan: dict[str, Any]) -> list[int]:
        pred = predict_ops(GPT_TINY, plan, 2, 1)
        return pred[pred["rank"] == 0]["bytes"].tolist()

    assert ParallelPlan().bucket_cap_mb is None
    assert dp_sizes({"dp": -1}) == [1_052_160, 3_202_560]
    assert dp_sizes({"dp": -1, "bucket_cap_mb": None}) == [1_052_160, 3_202_560]
    assert dp_sizes({"dp": -1, "bucket_cap_mb": 25}) == [4_254_720]  # given: first at 25 MiB
    assert dp_sizes({"dp": -1, "bucket_cap_mb": 1}) == [1_052_160, 1_058_304, 1_056_768, 1_087_488]


@pytest.mark.parametrize(
    ("flags", "cap_mb", "buckets"), [([], None, 2), (["--bucket-cap-mb", "25"], 25.0, 1)]
)
def test_cli_bucket_cap_follows_ddp(flags: list[str], cap_mb: float | None, buckets: int) -> None:
    model = [f"--{k}={v}" for k, v in GPT_TINY.items()]
    args = cli.build_parser().parse_args([*model, "--dp", "2", "--gpus-per-node", "1", *flags])
    _, spec = cli.scenario_spec(args)
    sc = resolve_scenario(spec)
    assert sc.plan.bucket_cap_mb == cap_mb
    pred = predict_ops(sc.model, sc.plan, sc.nodes, sc.gpus_per_node, sc.dtype_bytes, sc.options)
    assert (pred["rank"] == 0).sum() == buckets


def test_tp_and_pp_counts() -> None:
    tp = predict_ops(TINY, {"tp": -1}, 1, 2)
    act = B * S * H * FP32
    fwd, bwd = (tp[(tp["rank"] == 0) & (tp["phase"] == p)] for p in ("fwd", "bwd"))
    assert len(fwd) == 2 * L and len(bwd) == 4 * L  # proj/fc2; q, k, v, fc1 input grads
    assert set(tp["bytes"]) == {act}
    # Activation recomputation re-runs each block's forward in the backward: +2 all-reduces.
    rec = predict_ops(TINY, {"tp": -1}, 1, 2, options=PredictOptions(recompute=True))
    assert (rec[rec["rank"] == 0]["phase"] == "bwd").sum() == 6 * L
    # pp=3 over 4 layers: stages get 2, 1, 1 layers; m micro-batches each way per neighbour.
    m = 3
    pp = predict_ops(TINY | {"batch": 6}, {"pp": -1, "microbatches": m}, 3, 1)
    mb_act = 6 // m * S * H * FP32
    assert set(pp["bytes"]) == {mb_act}
    counts = pp.groupby(["rank", "op"]).size().to_dict()
    assert counts == {
        (0, "send"): m,
        (0, "recv"): m,
        (1, "send"): 2 * m,
        (1, "recv"): 2 * m,
        (2, "send"): m,
        (2, "recv"): m,
    }


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2)])
def test_schedules_run_every_microbatch_once(schedule: str, v: int) -> None:
    plan = ParallelPlan(pp=4, pp_schedule=schedule, microbatches=8, stages_per_rank=v)
    for r in range(4):
        acts = schedule_actions(plan, r)
        stages = [r + k * 4 for k in range(v)]
        assert sorted(acts) == sorted((k, s, i) for k in "BF" for s in stages for i in range(8))
        for s in stages:  # a micro-batch's backward follows its forward
            for i in range(8):
                assert acts.index(("F", s, i)) < acts.index(("B", s, i))
    assert bubble_fraction(4, 8, v) == pytest.approx((3 / v) / (8 + 3 / v))


def test_moe_all_to_alls_balanced() -> None:
    moe = TINY | {"kind": "moe", "layers": 2, "experts": 4, "top_k": 2}
    pred = predict_ops(moe, {"ep": -1}, 2, 2)
    a2a = pred[(pred["rank"] == 0) & (pred["op"] == "alltoall")]
    tokens = B * S * 2  # balanced top-2, no drops at capacity factor 1.25
    assert a2a["phase"].value_counts().to_dict() == {"fwd": 3 * 2, "bwd": 2 * 2}
    assert sorted(set(a2a["bytes"])) == [4 * 8, tokens * H * FP32]
    dense = sum(p.numel for p in moe_params(_moe_cfg(moe)) if not p.expert)
    dp = pred[(pred["rank"] == 0) & (pred["traffic"] == "dp")]
    assert dp["bytes"].sum() == dense * FP32 and set(dp["group_ranks"]) == {"0,1,2,3"}


def test_resnet50_ddp_buckets_and_buffer_broadcasts() -> None:
    spec = {"kind": "resnet50", "image": 32, "batch": 2}
    pred = predict_ops(spec, {"dp": -1}, 2, 1)
    r0 = pred[pred["rank"] == 0]
    grads = r0[r0["op"] == "allreduce"]
    assert grads["bytes"].sum() == 25_557_032 * FP32  # torchvision's parameter count
    # DDP's defaults: the first bucket closes at 1 MiB (here the fc layer alone, 8,196,000 B,
    # ready first), the others at 25 MiB; the last holds the rest.
    assert grads["bytes"].iloc[0] == (2048 * 1000 + 1000) * FP32
    assert (grads["bytes"].iloc[1:-1] >= 25 * 2**20).all()
    # BatchNorm running stats (float32) and batch counters (int64): one broadcast per dtype.
    bcast = r0[r0["op"] == "broadcast"]
    assert bcast["dtype"].tolist() == ["float32", "int64"] and (bcast["phase"] == "fwd").all()
    assert bcast["bytes"].iloc[1] == 53 * 8


def _moe_cfg(spec: dict[str, Any]) -> Any:
    return model_config(spec)


# ─────────────────────────────────────────────────────────── seed 002: GPT-3B, 32 GPUs


def test_gpt3b_32gpus_rank0_against_seed002() -> None:
    """Rank 0 of (p, t, d) = (4, 2, 4) under Megatron/DeepSpeed PTD-P, default mapping.

    Our generalisation differs from Eq. 2-4 where the paper simplifies: 54 layers over 4 stages
    split 14/14/13/13 (rank 0 runs 14, not l/p = 13.5); the vocab-parallel embedding adds one
    forward all-reduce per micro-batch on the first stage; DP carries the first stage's real
    parameters (14 layers + padded embedding shard + position embedding), not 2N/(pt). PP is
    Eq. 3 exactly; EmbTableSyn is the padded embedding shard V'/t x h.
    """
    pred = predict_ops(
        GPT3B, PTD_424 | {"mapping": "pp-dp-tp"}, 4, 8, 2, PredictOptions(framework="megatron")
    )
    layers, h, s, b, m, p, t, vocab = 54, 2000, 1024, 32, 8, 4, 2, 50257
    msg = 2 * b * s * h  # 16-bit activations
    got = _per(pred, 0)
    assert got["tp"] == (m * (14 * 6 + 1), m * (14 * 6 + 1) * msg)  # 680 x 131.072 MB
    assert got["pp"] == (2 * m, 2 * m * msg)  # Eq. 3: m x 2 x 2bsh
    v_pad = 50432  # 50257 -> multiple of 128 x t
    layer = 2 * 2 * h + (3 * h // t) * h + 3 * h // t + h * (h // t) + h
    layer += (4 * h // t) * h + 4 * h // t + h * (4 * h // t) + h
    assert got["dp"] == (1, 2 * (14 * layer + v_pad // t * h + s * h))  # 777.492 MB
    assert got["emb"] == (1, 2 * v_pad // t * h)  # 100.864 MB
    # Seed 002's own numbers for comparison.
    eq2_msgs = m * layers / p * 6
    n_params = 12 * layers * h * h * (1 + 13 / (12 * h) + (vocab + s) / (12 * layers * h))  # Eq. 10
    eq4 = 2 * n_params / (p * t)
    assert got["tp"][0] - eq2_msgs == m * (6 * 0.5 + 1)  # half a layer more + embedding
    assert got["dp"][1] / eq4 == pytest.approx(1.154, abs=0.001)
    # Default mapping: TP pairs inside a node, DP over the node's 4 TP pairs, PP across nodes.
    r0 = pred[pred["rank"] == 0].drop_duplicates("traffic").set_index("traffic")["group_ranks"]
    assert r0.to_dict() == {"tp": "0,1", "pp": "0,8,16,24", "dp": "0,2,4,6", "emb": "0,24"}
    # Eq. 2 holds exactly where its assumptions do: l divisible by p, no vocab-parallel ops.
    even = predict_ops(
        GPT3B | {"layers": 56},
        PTD_424,
        4,
        8,
        2,
        PredictOptions(framework="megatron", vocab_parallel=False),
    )
    assert _per(even, 0)["tp"] == (m * 56 // p * 6, m * 56 // p * 6 * msg)


def test_mapping_moves_traffic_between_nodes() -> None:
    """Default (pp-dp-tp: a node per stage) vs customized (dp-pp-tp: a node per replica)."""
    opts = PredictOptions(framework="megatron")
    kinds = {}
    for mapping in ("pp-dp-tp", "dp-pp-tp"):
        pred = predict_ops(GPT3B, PTD_424 | {"mapping": mapping}, 4, 8, 2, opts)
        mat = rank_matrix(pred)
        cross = mat[mat["src_node"] != mat["dst_node"]]
        kinds[mapping] = set(cross["traffic"])
        assert set(mat.loc[mat["src_node"] == mat["dst_node"], "traffic"]) >= {"tp"}
        # The ring model conserves each rank's transmitted bytes.
        sent = summarize(pred).groupby("rank")["sent_bytes"].sum()
        assert mat.groupby("src_rank")["bytes"].sum().to_numpy() == pytest.approx(sent.to_numpy())
        nm = node_matrix(pred)
        assert len(nm) == 16 and nm["bytes"].sum() == pytest.approx(mat["bytes"].sum())
    assert kinds == {"pp-dp-tp": {"pp", "emb"}, "dp-pp-tp": {"dp"}}


def test_large_prediction_is_fast() -> None:
    t0 = time.monotonic()
    pred = predict_ops(
        GPT3B | {"layers": 48, "hidden": 1600, "heads": 16},
        PTD_424 | {"dp": 2},
        2,
        8,
        2,
        PredictOptions(framework="megatron"),
    )
    assert time.monotonic() - t0 < 10
    assert pred["rank"].nunique() == 16


# ─────────────────────────────────────────────────────────── timing


def test_alpha_beta_step_time() -> None:
    pred = predict_ops(TINY, {"dp": -1}, 2, 1)
    alpha, beta, flops = 1e-4, 1e6, 1e9
    t = predict_step_time(pred, flops, alpha, beta, 10 * beta)
    n, size = 2, FULL * FP32
    comm = 2 * (n - 1) * alpha + wire_bytes("allreduce", size, n) / beta
    assert wire_bytes("allreduce", size, n) == size  # 2(n-1)/n S
    assert t["comm_s"] == pytest.approx(comm)
    assert t["step_time_s"] == pytest.approx(t["compute_s"] + comm)
    assert t["comm_ratio"] == pytest.approx(comm / t["step_time_s"])
    assert t["bubble_s"] == 0
    # A pipeline with free communication: the bubble is Eq. 7's (p-1)/(m+p-1) of the step.
    pp = predict_ops(TINY, {"pp": -1, "microbatches": 4}, 2, 1)
    t = predict_step_time(pp, flops, 0.0, math.inf, math.inf)
    slow = t["per_rank"].set_index("rank").loc[t["critical_rank"]]
    assert t["bubble_ratio"] == pytest.approx(1 / 5) == t["bubble_ratio_analytical"]
    assert slow["t_comm"] == 0


def test_effective_bandwidth_from_recorded_ops() -> None:
    def op(rank: int, group: str, nbytes: int, seconds: float, kind: str = "allreduce") -> dict:
        n = len(group.split(","))
        return dict(rank=rank, op=kind, bytes=nbytes, group_ranks=group, group_size=n, peer=-1,
                    step=2, t_issue_ns=0, t_end_ns=int(seconds * 1e9))  # fmt: skip

    ops = pd.DataFrame(
        [op(0, "0,1", 4_000_000, 0.1), op(0, "0,2", 4_000_000, 1.0), op(0, "0,2", 8 << 20, 0.5)]
        + [op(0, "0,2", 4_000_000, 9.0, "recv") | {"peer": 2, "group_ranks": "0,2"}]
    )
    bw = effective_bandwidth(ops, ranks_per_node=2)
    assert bw["intranode"] == pytest.approx(4e6 / 0.1)  # 2(n-1)/n S = S for n = 2
    assert bw["internode"] == pytest.approx(np.median([4e6 / 1.0, (8 << 20) / 0.5]))


def test_cli_prints_rank_traffic_and_node_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "--preset",
            "gpt-3b",
            "--pp",
            "4",
            "--tp",
            "2",
            "--dp",
            "4",
            "--gpus-per-node",
            "8",
            "--mapping",
            "pp-dp-tp",
            "--framework",
            "megatron",
            "--dtype-bytes",
            "2",
            "--flops-per-s",
            "2e13",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "131072000x680" in out and "131072000x16" in out and "100864000x1" in out
    assert "node x node" in out and "bubble ratio" in out


def test_predict_cell_reads_and_writes_the_declared_files(tmp_path: Path) -> None:
    # The workflow passes each file it declares; the package chooses no file names.
    cell = Path(__file__).resolve().parents[1] / "data" / "cells" / "ddp-2rank"
    outs = {k: tmp_path / k / f"{k}.out" for k in ("ops", "compare", "timing")}
    compare = predict_cell(
        cell_json=cell / "cell.json",
        ops=cell / "ops.parquet",
        steps=cell / "steps.parquet",
        model_spec=GPT_TINY,
        # No cap in the strategy, but the cell (recorded with 25 MiB given) says what DDP ran.
        plan_spec={"dp": -1},
        warmup_steps=2,
        out_ops=outs["ops"],
        out_compare=outs["compare"],
        out_timing=outs["timing"],
    )
    assert compare["match"].all()
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(outs.values())
    timing = pd.read_parquet(outs["timing"])
    assert timing["bandwidth_source"].tolist() == ["trace effective bandwidth"]
