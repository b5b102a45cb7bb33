"""Real gloo training on CPU for every strategy, checked against communication physics.

Two spawned jobs (``torch.multiprocessing``), each training several strategies one after the
other through :func:`commscope.workload.train.run`, every one into its own directory, so the price
of starting Python processes with torch is paid once per job:

* 2 ranks: the base strategies ddp, tp, pp and fsdp on a tiny GPT (2 layers, hidden 32, 2 heads,
  seq 16, vocab 64, batch 4), and ResNet-50 under DDP at 32 px;
* 4 ranks: the hybrids (dp x tp with TP inside and across "nodes", fsdp x tp, tp x pp,
  interleaved 1F1B x dp) on the same GPT with 4 layers, and expert parallelism on an MoE GPT.

Every expected number below is derived from the model's shape and the plan (``group_of`` says
which ranks form each group), not read back from a previous run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan

from .gloo import free_port, run_ranks

WORLD = 2
STEPS = 3  # DDP rebuilds its buckets at the start of step 1; step 2 is a plain step
MICROBATCHES = 2
MODEL = {"layers": 2, "hidden": 32, "heads": 2, "seq": 16, "vocab": 64, "batch": 4}
PLANS: dict[str, dict[str, Any]] = {
    "ddp": BUILTIN_STRATEGIES["ddp"],
    "tp": BUILTIN_STRATEGIES["tp"],
    "pp": {"pp": -1, "microbatches": MICROBATCHES, "pp_schedule": "1f1b"},
    "fsdp": BUILTIN_STRATEGIES["fsdp"],
}
# FSDP last: the order is kept from when its reduce-scatters left the capture's poller busy.
STRATEGIES = ("ddp", "tp", "pp", "fsdp")
RESNET = {"kind": "resnet50", "image": 32, "batch": 2}  # 1x1 at layer4, 2 values per BN channel
RESNET_STEPS = 2
PHASES = {"fwd", "bwd", "optim", "fwd_bwd", "other"}
JOIN_TIMEOUT_S = 300  # each job takes ~30-45 s on 2 busy cores; a hang fails instead of blocking
FP32, INT64 = 4, 8
# Completion times are stamped by Python callbacks, which wait for the GIL while the issuing
# thread runs Python (up to the 5 ms switch interval, more on 2 busy cores; measured 7.6 ms in
# FSDP's first optimizer step, which initializes its state in Python).
GIL_SLACK_NS = 30_000_000

H, L, S, V, B = MODEL["hidden"], MODEL["layers"], MODEL["seq"], MODEL["vocab"], MODEL["batch"]
# Parameters of the full GPT: embeddings, per block 2 LayerNorms + 4 attention + 2 MLP linears,
# final LayerNorm, head without bias.
BLOCK_PARAMS = 2 * 2 * H + 4 * (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H)
EMB_PARAMS = V * H + S * H
HEAD_PARAMS = 2 * H + H * V
FULL_PARAMS = EMB_PARAMS + L * BLOCK_PARAMS + HEAD_PARAMS
FULL_PARAM_BYTES = FULL_PARAMS * FP32
# What tensor parallelism shards per block: q/k/v/fc1 column-wise (weight and bias), proj/fc2
# row-wise (weight only; their biases stay replicated). A TP rank of 2 keeps half of it.
TP_SHARDED_PER_BLOCK = 3 * (H * H + H) + (4 * H * H + 4 * H) + H * H + 4 * H * H
TP2_BLOCK_PARAMS = BLOCK_PARAMS - TP_SHARDED_PER_BLOCK // 2


def _worker(rank: int, world: int, jobs: dict[str, dict], ports: dict[str, int], root: str) -> None:
    """One rank: train every job in turn (a fresh process group and capture each time)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    import torch

    from commscope.workload import capture, capture_native, train

    torch.set_num_threads(1)
    for name, job in jobs.items():
        os.environ["MASTER_PORT"] = str(ports[name])
        # The kernel under functional collectives: the native one (make setup builds it) unless
        # the job asks for the Python one; train.run installs the capture anew.
        os.environ[capture_native.ENV] = job.get("capture", "native")
        capture.uninstall()
        capture.reset()
        capture.set_step(-1)
        capture.set_phase("other")
        train.run(
            {
                **{k: v for k, v in job.items() if k != "capture"},
                "device": "cpu",
                "threads": 1,
                "pg_timeout_s": 60,
                "out_dir": str(Path(root) / name),
            }
        )


def _spawn(world: int, jobs: dict[str, dict], root: Path) -> Path:
    ports = {name: free_port() for name in jobs}
    run_ranks(
        _worker, (world, jobs, ports, str(root)), world, JOIN_TIMEOUT_S, f"{world}-rank training"
    )
    return root


def _load(root: Path, name: str, world: int) -> dict[str, Any]:
    d = root / name

    def frame(prefix: str) -> pd.DataFrame:
        return pd.concat(
            [pd.read_parquet(d / f"{prefix}_rank{r}.parquet") for r in range(world)],
            ignore_index=True,
        )

    meta = [json.loads((d / f"rank{r}.json").read_text()) for r in range(world)]
    return {
        "ops": frame("ops"),
        "steps": frame("steps"),
        "train": frame("train"),
        "moe": frame("moe"),
        "meta": meta,
    }


# DDP with 10 kB buckets: the GPT's gradients (~70 kB) go out in several all-reduces, the
# first ones while the backward still computes (the wait tests).
DDP_BUCKETS = {"dp": -1, "bucket_cap_mb": 0.01}
JOBS2: dict[str, dict[str, Any]] = {
    **{s: {"plan": PLANS[s], "model": MODEL, "steps": STEPS} for s in STRATEGIES if s != "fsdp"},
    "ddp-buckets": {"plan": DDP_BUCKETS, "model": MODEL, "steps": STEPS},
    # TP again with the capture's Python kernels (no native build, COMMSCOPE_CAPTURE=python):
    # the same rows, ends and waits.
    "tp-python": {"plan": PLANS["tp"], "model": MODEL, "steps": STEPS, "capture": "python"},
    "resnet50": {"plan": BUILTIN_STRATEGIES["ddp"], "model": RESNET, "steps": RESNET_STEPS},
    "fsdp": {"plan": PLANS["fsdp"], "model": MODEL, "steps": STEPS},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spawn(WORLD, JOBS2, tmp_path_factory.mktemp("capture"))


@pytest.fixture(scope="module")
def traces(runs: Path) -> dict[str, dict[str, Any]]:
    return {s: _load(runs, s, WORLD) for s in JOBS2}


def _in_steps(ops: pd.DataFrame) -> pd.DataFrame:
    return ops[ops["step"] >= 0]


# ─────────────────────────────────────────────────────────── common to every strategy


@pytest.mark.parametrize("strategy", [*STRATEGIES, "resnet50"])
def test_rank_metadata(traces: dict, strategy: str) -> None:
    meta = traces[strategy]["meta"]
    assert [m["rank"] for m in meta] == [0, 1]
    assert all(m["world_size"] == WORLD and m["backend"] == "gloo" for m in meta)
    # make setup builds the native kernel: a rank that fell back to Python would cost more.
    assert {m["capture"] for m in meta} == {"native"}
    # The plan as resolved for this world is recorded with every rank.
    plan = ParallelPlan.from_dict(JOBS2[strategy]["plan"]).resolve(WORLD)
    assert all(ParallelPlan(**m["plan"]) == plan for m in meta)
    expected_local = {
        "ddp": FULL_PARAMS,  # replicated
        "fsdp": FULL_PARAMS // WORLD,  # every parameter sharded on dim 0, no padding here
        "tp": EMB_PARAMS + L * TP2_BLOCK_PARAMS + HEAD_PARAMS,
        "pp": None,  # checked below: stages hold different parts
        "resnet50": 25_557_032,  # torchvision's count at 1000 classes, replicated
    }[strategy]
    if expected_local is not None:
        for m in meta:
            assert m["param_count_local"] == expected_local
            assert m["grad_bytes_local"] == expected_local * FP32
    else:
        assert sum(m["param_count_local"] for m in meta) == FULL_PARAMS
        assert [m["param_count_local"] for m in meta] == [
            EMB_PARAMS + BLOCK_PARAMS,
            BLOCK_PARAMS + HEAD_PARAMS,
        ]


@pytest.mark.parametrize("strategy", [*STRATEGIES, "resnet50"])
def test_ops_are_well_formed(traces: dict, strategy: str) -> None:
    ops = traces[strategy]["ops"]
    assert len(ops) > 0
    assert (ops["t_issue_ns"] > 0).all()
    assert set(ops["phase"]) <= PHASES
    assert set(ops["rank"]) == {0, 1}
    assert (ops["group_size"] == WORLD).all()
    assert (ops["group_ranks"] == "0,1").all()
    # Outside the training loop (set-up and the final barrier) the step is -1, phase "other".
    outside = ops[ops["step"] < 0]
    assert (outside["phase"] == "other").all()
    assert set(ops["step"]) <= {-1, *range(JOBS2[strategy]["steps"])}
    # Per rank, issue order and the per-group sequence numbers agree (no P2P keys except pp).
    for _, per_rank in ops.groupby("rank"):
        assert per_rank["t_issue_ns"].is_monotonic_increasing
    # Both ranks issue the same collectives in the same order (they would deadlock otherwise).
    coll = ops[ops["peer"] < 0]
    r0 = coll[coll["rank"] == 0][["op", "seq", "step", "numel"]].reset_index(drop=True)
    r1 = coll[coll["rank"] == 1][["op", "seq", "step", "numel"]].reset_index(drop=True)
    if strategy != "tp":  # tp's set-up scatters count numel differently on root and non-root
        pd.testing.assert_frame_equal(r0, r1)
    else:
        pd.testing.assert_frame_equal(r0[["op", "seq", "step"]], r1[["op", "seq", "step"]])


def _check_steps_table(steps: pd.DataFrame, world: int, n_steps: int, pipelined: bool) -> None:
    per_step = steps[steps["phase"] == "step"]
    counts = per_step.groupby(["rank", "step"]).size()
    assert counts.to_dict() == {(r, s): 1 for r in range(world) for s in range(n_steps)}
    assert (steps["t_end_ns"] >= steps["t_start_ns"]).all()
    phases = {"fwd_bwd", "optim", "step"} if pipelined else {"fwd", "bwd", "optim", "step"}
    assert set(steps["phase"]) == phases
    for (_rank, step), rows in steps.groupby(["rank", "step"]):
        whole = rows[rows["phase"] == "step"].iloc[0]
        parts = rows[rows["phase"] != "step"]
        assert len(parts) == len(phases) - 1, step
        # Phases lie inside their step, in order.
        assert (parts["t_start_ns"] >= whole["t_start_ns"]).all()
        assert (parts["t_end_ns"] <= whole["t_end_ns"]).all()
        assert parts["t_start_ns"].is_monotonic_increasing


@pytest.mark.parametrize("strategy", [*STRATEGIES, "resnet50"])
def test_steps_table(traces: dict, strategy: str) -> None:
    _check_steps_table(
        traces[strategy]["steps"], WORLD, JOBS2[strategy]["steps"], pipelined=strategy == "pp"
    )


@pytest.mark.parametrize("strategy", [*STRATEGIES, "resnet50"])
def test_every_op_has_a_completion_time(traces: dict, strategy: str) -> None:
    ops = traces[strategy]["ops"]
    missing = ops[ops["t_end_ns"].isna()]
    assert missing.empty, missing[["op", "source", "phase"]].value_counts().to_dict()
    assert (ops["t_end_ns"] >= ops["t_issue_ns"]).all()
    assert str(ops["t_end_ns"].dtype) == "Int64"


# ─────────────────────────────────────────────────────────── waits


@pytest.mark.parametrize("strategy", [*STRATEGIES, "ddp-buckets", "resnet50"])
def test_every_op_records_the_training_threads_wait(traces: dict, strategy: str) -> None:
    ops = traces[strategy]["ops"]
    for col in ("t_wait_start_ns", "t_wait_end_ns", "wait_ns"):
        assert str(ops[col].dtype) == "Int64", col
    assert ops["wait_ns"].notna().all()  # CPU ops: every wait is observable
    waited = ops[ops["wait_ns"] > 0]
    never = ops[ops["wait_ns"] == 0]
    assert never["t_wait_start_ns"].isna().all() and never["t_wait_end_ns"].isna().all()
    assert (waited["t_wait_end_ns"] - waited["t_wait_start_ns"] == waited["wait_ns"]).all()
    # A wait starts no earlier than the op's issue and, once it returns, the op is complete.
    assert (waited["t_wait_start_ns"] >= waited["t_issue_ns"]).all()
    late = waited["t_end_ns"] - waited["t_wait_end_ns"]
    assert (late <= GIL_SLACK_NS).all(), late.max()


def test_ddp_waits_on_its_buckets_once_the_backward_is_computed(traces: dict) -> None:
    from commscope.metrics import sync

    t = traces["ddp-buckets"]
    ops = _in_steps(t["ops"])
    buckets = ops[(ops["op"] == "allreduce") & (ops["step"] >= 1)]
    # A rank whose last bucket completes before its backward's compute ends never waits: the
    # other rank was the late one. Some rank waits in every step.
    assert set(buckets[buckets["wait_ns"] > 0]["step"]) == set(range(1, STEPS))
    for (rank, step), rows in buckets.groupby(["rank", "step"]):
        assert len(rows) >= 3, (rank, step)
        waited = rows[rows["wait_ns"] > 0]
        if waited.empty:
            continue
        # The reducer waits in its final callback, after the last bucket went out: one start
        # for every bucket of the step, and each wait ends with its bucket (or with the
        # reducer's return, when the bucket's completion callback was still waiting for the GIL).
        assert waited["t_wait_start_ns"].nunique() == 1
        assert waited["t_wait_start_ns"].iloc[0] >= rows["t_issue_ns"].max()
        late = waited["t_end_ns"] - waited["t_wait_end_ns"]
        assert ((late >= 0) & (late <= GIL_SLACK_NS)).all(), late.max()
        # Shorter than issue -> completion for every bucket; the first by at least the time
        # the backward computed after issuing it.
        duration = rows["t_end_ns"] - rows["t_issue_ns"]
        assert (rows["wait_ns"] < duration).all()
        first = rows.iloc[0]
        overlap = rows["t_issue_ns"].max() - first["t_issue_ns"]
        assert overlap > 0
        assert first["wait_ns"] <= max(0, first["t_end_ns"] - first["t_issue_ns"] - overlap)
    exposed = sync.exposed_comm(t["ops"], t["steps"])
    assert set(exposed["exposed_source"]) == {"waits"}
    assert (exposed["exposed_comm_s"] <= exposed["comm_s"]).all()
    assert (exposed["exposed_comm_s"] < exposed["comm_s"]).any()


def test_a_blocking_op_waits_over_its_whole_interval(traces: dict) -> None:
    ops = traces["ddp"]["ops"]
    # Step 1's bucket-layout broadcasts: the reducer issues and waits on them in C++.
    bcast = ops[(ops["op"] == "broadcast") & (ops["step"] == 1)]
    assert len(bcast) > 0
    assert (bcast["t_wait_start_ns"] == bcast["t_issue_ns"]).all()
    assert (bcast["t_wait_end_ns"] == bcast["t_end_ns"]).all()
    assert (bcast["wait_ns"] == bcast["t_end_ns"] - bcast["t_issue_ns"]).all()
    # The final barrier: torch.distributed's synchronous call waits from the op's issue until
    # it returns, with the completion (stamped on gloo's thread) inside the GIL's slack.
    barrier = ops[(ops["op"] == "barrier") & (ops["step"] == -1)].groupby("rank").tail(1)
    assert len(barrier) == WORLD
    assert (barrier["t_wait_start_ns"] == barrier["t_issue_ns"]).all()
    gap = (barrier["t_wait_end_ns"] - barrier["t_end_ns"]).abs()
    assert (gap <= GIL_SLACK_NS).all(), gap.max()


def test_pp_waits_on_its_sends_and_recvs_in_the_schedule(traces: dict) -> None:
    ops = _in_steps(traces["pp"]["ops"])
    p2p = ops[ops["op"].isin(["send", "recv"]) & (ops["step"] >= 1)]
    # The schedule waits on every recv before using it, and on its sends at the end: each
    # gloo send/recv completes inside that wait, whose return stamps its completion (unless the
    # poller saw it first, between the completion and the waiting thread's next bytecode).
    assert (p2p["wait_ns"] > 0).all()
    gap = p2p["t_wait_end_ns"] - p2p["t_end_ns"]
    assert ((gap >= 0) & (gap <= GIL_SLACK_NS)).all(), gap.describe()
    assert (p2p["wait_ns"] <= p2p["t_end_ns"] - p2p["t_issue_ns"]).all()
    # The sends are waited on only at the end of the schedule, long after their issue.
    sends = p2p[p2p["op"] == "send"]
    assert (sends["wait_ns"] < sends["t_end_ns"] - sends["t_issue_ns"]).any()


@pytest.mark.parametrize("job", ["tp", "tp-python"])
def test_tp_waits_on_every_functional_all_reduce_at_first_use(traces: dict, job: str) -> None:
    ops = _in_steps(traces[job]["ops"])
    functional = ops[ops["source"] == "functional"]
    assert len(functional) > 0
    # Forward and backward alike: AsyncCollectiveTensor's wait (on a view of the output, below
    # the autograd keys) is stamped.
    assert set(functional["phase"]) == {"fwd", "bwd"}
    assert functional["t_wait_start_ns"].notna().all()


def test_fsdp_waits_on_its_synchronous_collectives_from_their_issue(traces: dict) -> None:
    ops = _in_steps(traces["fsdp"]["ops"])
    coll = ops[ops["op"].isin(["allgather", "reduce_scatter"])]
    assert len(coll) > 0
    assert (coll["t_wait_start_ns"] == coll["t_issue_ns"]).all()


# ─────────────────────────────────────────────────────────── DDP


def test_ddp_allreduces_the_gradients_once_per_step(traces: dict) -> None:
    t = traces["ddp"]
    ops, grad_bytes = t["ops"], t["meta"][0]["grad_bytes_local"]
    assert grad_bytes == FULL_PARAM_BYTES
    steps = _in_steps(ops)
    ar = steps[steps["op"] == "allreduce"]
    assert (ar["phase"] == "bwd").all()
    assert (ar["source"] == "c10d").all()
    # Every rank all-reduces exactly its gradients each step (one 25 MB bucket holds them all).
    per_step = ar.groupby(["rank", "step"])["bytes"].sum()
    assert per_step.to_dict() == {(r, s): grad_bytes for r in range(WORLD) for s in range(STEPS)}
    assert (ar["bytes_out"] == ar["bytes"]).all()
    # The only other ops inside steps: at the first forward after step 0 the reducer rebuilds
    # its buckets in gradient-ready order and rank 0 broadcasts the new layout (bucket indices
    # as int32, one per parameter plus one, then the bucket sizes). Step 2 is all-reduce only.
    other = steps[steps["op"] != "allreduce"]
    assert set(other["op"]) == {"broadcast"}
    assert set(zip(other["step"], other["phase"], strict=True)) == {(1, "fwd")}
    n_tensors = 2 + L * 16 + 2 + 1
    assert sorted(set(other["numel"])) == [1, n_tensors + 1]
    assert set(steps[steps["step"] == 2]["op"]) == {"allreduce"}
    # Set-up (step -1): DDP broadcasts rank 0's parameters so all replicas start equal.
    setup = ops[ops["step"] < 0]
    assert setup[setup["op"] == "broadcast"]["bytes"].max() == FULL_PARAM_BYTES


def test_ddp_completion_times(traces: dict) -> None:
    ops = traces["ddp"]["ops"]
    assert ops["t_end_ns"].notna().all()
    assert (ops["t_end_ns"] >= ops["t_issue_ns"]).all()


# ─────────────────────────────────────────────────────────── FSDP


def test_fsdp_gathers_and_reduce_scatters_the_full_model(traces: dict) -> None:
    t = traces["fsdp"]
    ops, shard_bytes = t["ops"], t["meta"][0]["grad_bytes_local"]
    assert shard_bytes * WORLD == FULL_PARAM_BYTES
    steps = _in_steps(ops)
    assert set(steps["op"]) == {"allgather", "reduce_scatter"}
    for (_rank, _step), rows in steps.groupby(["rank", "step"]):
        rs = rows[rows["op"] == "reduce_scatter"]
        assert (rs["phase"] == "bwd").all()
        # Capture records the reduce-scatter input (the unsharded gradients) as `bytes` and the
        # local shard as `bytes_out`: one step reduces every gradient of the model once.
        assert rs["bytes"].sum() == FULL_PARAM_BYTES
        assert rs["bytes_out"].sum() == shard_bytes
        assert len(rs) == L + 1  # one per fully_shard unit: each block and the root
        # Forward all-gathers every unit once: local shards in, full parameters out.
        ag_fwd = rows[(rows["op"] == "allgather") & (rows["phase"] == "fwd")]
        assert len(ag_fwd) == L + 1
        assert ag_fwd["bytes"].sum() == shard_bytes
        assert ag_fwd["bytes_out"].sum() == FULL_PARAM_BYTES
        # Backward gathers only what forward resharded.
        ag_bwd = rows[(rows["op"] == "allgather") & (rows["phase"] == "bwd")]
        assert BLOCK_PARAMS * FP32 in set(ag_bwd["bytes_out"])
        assert len(ag_bwd) >= L


def test_fsdp_backward_regathers_the_blocks_and_the_root(traces: dict) -> None:
    # By design (docs/strategies.md): the plan's reshard_after_forward applies to every FSDP
    # unit including the root, as torchtitan does outside pipelines; torch's own default (None)
    # would keep the root gathered. So backward re-gathers the L blocks and the root.
    steps = _in_steps(traces["fsdp"]["ops"])
    for (_rank, _step), rows in steps.groupby(["rank", "step"]):
        ag_bwd = rows[(rows["op"] == "allgather") & (rows["phase"] == "bwd")]
        assert len(ag_bwd) == L + 1
        assert sum(ag_bwd["bytes_out"] == BLOCK_PARAMS * FP32) == L


def test_fsdp_allgather_completion_times(traces: dict) -> None:
    ag = traces["fsdp"]["ops"]
    ag = ag[ag["op"].isin(["allgather", "barrier"])]
    assert ag["t_end_ns"].notna().all()
    assert (ag["t_end_ns"] >= ag["t_issue_ns"]).all()


def test_fsdp_reduce_scatter_completion_times(traces: dict) -> None:
    # gloo's reduce-scatter Work has no future and never reports is_completed(); the capture's
    # waiter thread wait()s on it instead, so it has an end time like every other op.
    rs = traces["fsdp"]["ops"]
    rs = rs[rs["op"] == "reduce_scatter"]
    assert len(rs) == WORLD * STEPS * (L + 1)
    assert rs["t_end_ns"].notna().all()
    assert (rs["t_end_ns"] >= rs["t_issue_ns"]).all()
    # It completes before the step's optimizer starts (FSDP waits on it at the end of
    # backward); the stamp is taken in Python, so it may trail by a GIL hand-off.
    steps = traces["fsdp"]["steps"]
    optim = steps[steps["phase"] == "optim"].set_index(["rank", "step"])["t_start_ns"]
    last_end = rs[rs["step"] >= 0].groupby(["rank", "step"])["t_end_ns"].max()
    assert (last_end.astype("int64") <= optim.loc[last_end.index] + GIL_SLACK_NS).all()


# ─────────────────────────────────────────────────────────── TP


@pytest.mark.parametrize("job", ["tp", "tp-python"])
def test_tp_allreduces_per_layer(traces: dict, job: str) -> None:
    ops = traces[job]["ops"]
    steps = _in_steps(ops)
    assert set(steps["op"]) == {"allreduce"}
    assert (steps["source"] == "functional").all()  # DTensor redistributions
    activation_bytes = B * S * H * FP32  # every rank sees the whole batch
    assert set(steps["bytes"]) == {activation_bytes}
    counts = steps.groupby(["rank", "step", "phase"]).size().to_dict()
    # Forward: the two row-wise linears (attn.proj, mlp.fc2) leave partial sums that are
    # all-reduced, 2 per layer. Backward: the gradient w.r.t. the replicated input of every
    # column-wise linear is partial and all-reduced; q, k and v each wrap the input on their own
    # (no fused qkv), so attention costs 3 and the MLP's fc1 1: 4 per layer.
    expected = {}
    for r in range(WORLD):
        for s in range(STEPS):
            expected[(r, s, "fwd")] = 2 * L
            expected[(r, s, "bwd")] = 4 * L
    assert counts == expected
    # Set-up: parameters are distributed from rank 0 (scatter for shards, broadcast for
    # replicated biases of row-wise layers), outside any step.
    setup = ops[ops["step"] < 0]
    assert set(setup["op"]) == {"scatter", "broadcast", "barrier"}


@pytest.mark.parametrize("job", ["tp", "tp-python"])
def test_tp_completion_times(traces: dict, job: str) -> None:
    ops = traces[job]["ops"]
    steps = _in_steps(ops)
    assert len(steps) == WORLD * STEPS * 6 * L
    # Forward all-reduces too: DTensor's AsyncCollectiveTensor waits below the autograd keys,
    # so the end comes from the inner c10d Work's future, not from wait_tensor.
    assert steps["t_end_ns"].notna().all()
    assert (steps["t_end_ns"] >= steps["t_issue_ns"]).all()
    # A forward all-reduce completes before the forward is over (its result feeds the next
    # layer), and long before the step ends.
    fwd = steps[steps["phase"] == "fwd"]
    bounds = traces[job]["steps"]
    fwd_end = bounds[bounds["phase"] == "fwd"].set_index(["rank", "step"])["t_end_ns"]
    ends = fwd.set_index(["rank", "step"])["t_end_ns"].astype("int64")
    assert (ends <= fwd_end.loc[ends.index] + GIL_SLACK_NS).all()


@pytest.mark.parametrize("job", ["tp", "tp-python"])
def test_tp_completion_times_keep_nanosecond_precision(traces: dict, job: str) -> None:
    ends = traces[job]["ops"]["t_end_ns"].dropna().astype("int64")
    assert len(ends) > 20
    # Real time_ns() values are multiples of 256 only by chance (1 in 256 each).
    assert not (ends % 256 == 0).all()


def test_tp_native_ends_need_no_gil_slack(traces: dict) -> None:
    """The native kernel stamps a functional op's end on gloo's thread as its future completes,
    without the GIL: before the training thread's wait on it returns, every time (the Python
    callback may run up to GIL_SLACK_NS later)."""
    meta = traces["tp"]["meta"]
    assert {m["capture"] for m in meta} == {"native"}
    assert {m["capture"] for m in traces["tp-python"]["meta"]} == {"python"}
    ops = _in_steps(traces["tp"]["ops"])
    waited = ops[ops["wait_ns"] > 0]
    assert len(waited) > 0
    assert (waited["t_end_ns"] <= waited["t_wait_end_ns"]).all()
    # The two runs record the same ops (only the times differ).
    cols = ["rank", "op", "source", "group", "bytes", "seq", "step", "phase"]
    python = traces["tp-python"]["ops"][cols].reset_index(drop=True)
    assert traces["tp"]["ops"][cols].reset_index(drop=True).equals(python)


# ─────────────────────────────────────────────────────────── PP


def test_pp_point_to_point_per_microbatch(traces: dict) -> None:
    ops = traces["pp"]["ops"]
    steps = _in_steps(ops)
    assert set(steps["op"]) == {"send", "recv"}
    assert (steps["phase"] == "fwd_bwd").all()
    assert set(zip(steps["rank"], steps["peer"], strict=True)) == {(0, 1), (1, 0)}
    # Collectives (set-up barrier, final barrier) carry no peer.
    assert (ops[~ops["op"].isin(["send", "recv"])]["peer"] == -1).all()
    # After the warm-up step (step 0 also exchanges pickled shape metadata): rank 0 sends one
    # activation per micro-batch and receives its gradient; rank 1 the mirror image.
    mb_bytes = (B // MICROBATCHES) * S * H * FP32
    measured = steps[steps["step"] >= 1]
    counts = measured.groupby(["rank", "step", "op"]).size().to_dict()
    assert counts == {
        (r, s, op): MICROBATCHES
        for r in range(WORLD)
        for s in range(1, STEPS)
        for op in ("send", "recv")
    }
    assert set(measured["bytes"]) == {mb_bytes}
    assert (measured["dtype"] == "float32").all()
    warmup = steps[steps["step"] == 0]
    assert len(warmup) > len(measured[measured["step"] == 1])
    # What one rank sends, the other receives: byte totals match per direction.
    sent = steps[steps["op"] == "send"].groupby("rank")["bytes"].sum()
    recvd = steps[steps["op"] == "recv"].groupby("rank")["bytes"].sum()
    assert sent[0] == recvd[1] and sent[1] == recvd[0]
    # P2P sequence numbers count per (op, peer): 0, 1, ... on each rank.
    for (_r, _op), rows in ops[ops["peer"] >= 0].groupby(["rank", "op"]):
        assert rows["seq"].tolist() == list(range(len(rows)))


def test_pp_completion_times(traces: dict) -> None:
    ops = traces["pp"]["ops"]
    assert ops["t_end_ns"].notna().all()  # gloo send/recv complete through the poller
    assert (ops["t_end_ns"] >= ops["t_issue_ns"]).all()


# ─────────────────────────────────────────────────────────── ResNet-50 under DDP

RESNET_PARAMS = 25_557_032  # torchvision's resnet50() at 1000 classes
# BatchNorm layers: the stem, 3 per bottleneck (16 blocks), one per stage's downsample (4).
RESNET_BN_LAYERS = 1 + 3 * (3 + 4 + 6 + 3) + 4
# Their channels: stem 64; per stage with width p and n blocks, n x (p + p + 4p) plus the
# downsample's 4p.
RESNET_BN_CHANNELS = 64 + sum(n * 6 * p + 4 * p for p, n in ((64, 3), (128, 4), (256, 6), (512, 3)))
RESNET_TENSORS = 161  # parameter tensors (vision.py: torchvision's order and count)
BUCKET_CAP_BYTES = 25 * 2**20  # PyTorch's bucket cap without bucket_cap_mb (the plan's default)
FIRST_BUCKET_CAP_BYTES = 2**20  # and its first bucket's (dist._DEFAULT_FIRST_BUCKET_BYTES)
LARGEST_RESNET_PARAM_BYTES = 512 * 512 * 3 * 3 * FP32  # a layer4 3x3 convolution


def test_resnet50_allreduces_every_parameter_each_step(traces: dict) -> None:
    t = traces["resnet50"]
    ops, grad_bytes = t["ops"], t["meta"][0]["grad_bytes_local"]
    assert grad_bytes == RESNET_PARAMS * FP32 == 102_228_128
    steps = _in_steps(ops)
    ar = steps[steps["op"] == "allreduce"]
    assert (ar["phase"] == "bwd").all() and (ar["source"] == "c10d").all()
    assert (ar["dtype"] == "float32").all()
    # All parameters are trainable, and only gradients are all-reduced: exactly 4 bytes per
    # parameter per step on every rank; BN running statistics are never all-reduced.
    per_step = ar.groupby(["rank", "step"])["bytes"].sum()
    expected = {(r, s): RESNET_PARAMS * FP32 for r in range(WORLD) for s in range(RESNET_STEPS)}
    assert per_step.to_dict() == expected
    # Until DDP has seen one backward (no find_unused_parameters) it keeps every gradient in one
    # bucket; from step 1 it fills buckets in gradient-ready order (the order it issues them),
    # each closing once it reaches its cap (so at most one parameter past it): the plan leaves
    # bucket_cap_mb unset, so PyTorch's 1 MiB for the first and 25 MiB for the others; the last
    # holds the rest.
    for (_rank, step), rows in ar.groupby(["rank", "step"]):
        sizes = rows["bytes"].tolist()
        if step == 0:
            assert sizes == [RESNET_PARAMS * FP32]
            continue
        assert len(sizes) >= 4  # ~102 MB in buckets of at least 25 MiB but the first and last
        assert all(b < BUCKET_CAP_BYTES + LARGEST_RESNET_PARAM_BYTES for b in sizes)
        assert sizes[0] >= FIRST_BUCKET_CAP_BYTES
        assert sizes[0] < FIRST_BUCKET_CAP_BYTES + LARGEST_RESNET_PARAM_BYTES
        assert all(b >= BUCKET_CAP_BYTES for b in sizes[1:-1])


def test_resnet50_broadcasts_the_batchnorm_buffers_every_forward(traces: dict) -> None:
    assert RESNET_BN_LAYERS == 53 and RESNET_BN_CHANNELS == 26_560
    ops = traces["resnet50"]["ops"]
    steps = _in_steps(ops)
    bc = steps[steps["op"] == "broadcast"]
    assert (bc["phase"] == "fwd").all()
    assert (bc["root"] == 0).all()  # rank 0's buffers win
    # Every forward (DDP's broadcast_buffers default): running_mean and running_var of every
    # BN channel as one float32 tensor, and every layer's num_batches_tracked as one int64.
    for (_rank, step), rows in bc.groupby(["rank", "step"]):
        buffers = rows[rows["dtype"] != "int32"]
        assert sorted(zip(buffers["dtype"], buffers["bytes"], strict=True)) == [
            ("float32", 2 * RESNET_BN_CHANNELS * FP32),
            ("int64", RESNET_BN_LAYERS * INT64),
        ], step
        # Step 1 adds the bucket rebuild: bucket count, then one index per tensor plus one.
        layout = rows[rows["dtype"] == "int32"]
        n_buckets = len(steps[(steps["op"] == "allreduce") & (steps["step"] == step)]) // WORLD
        expected_layout = [n_buckets, RESNET_TENSORS + 1] if step == 1 else []
        assert sorted(layout["numel"]) == expected_layout
    assert set(steps["op"]) == {"allreduce", "broadcast"}
    # Set-up: DDP's initial sync broadcasts rank 0's parameters with the float buffers.
    setup = ops[(ops["step"] < 0) & (ops["op"] == "broadcast") & (ops["dtype"] == "float32")]
    assert set(setup["bytes"]) == {(RESNET_PARAMS + 2 * RESNET_BN_CHANNELS) * FP32}


def test_resnet50_trains(traces: dict) -> None:
    train = traces["resnet50"]["train"]
    assert len(train) == WORLD * RESNET_STEPS
    (loss,) = [c for c in train.columns if "loss" in c]  # the per-step training loss
    assert train[loss].map(math.isfinite).all()
    ar = traces["resnet50"]["ops"]
    ar = ar[ar["op"] == "allreduce"]
    assert ar["t_end_ns"].notna().all() and (ar["t_end_ns"] >= ar["t_issue_ns"]).all()


# ═══════════════════════════════════════════════════════════ hybrids on 4 ranks

WORLD4 = 4
STEPS4 = 3
MODEL4 = MODEL | {"layers": 4}
L4 = MODEL4["layers"]
MOE = MODEL4 | {"kind": "moe", "experts": 4, "top_k": 2}
HYBRIDS: dict[str, dict[str, Any]] = {
    # TP inside a node (2 ranks per node: TP pairs are contiguous ranks), DP across nodes.
    "dp-tp": {"dp": -1, "tp": 2, "mapping": "pp-dp-tp"},
    # The same degrees with TP across nodes.
    "dp-tp-across": {"dp": -1, "tp": 2, "mapping": "tp-dp"},
    "tp-pp": {"tp": 2, "pp": -1, "microbatches": MICROBATCHES},
    "pp-interleaved": {
        "pp": 2,
        "dp": 2,
        "pp_schedule": "interleaved-1f1b",
        "stages_per_rank": 2,
        "microbatches": MICROBATCHES,
    },
    "ep": BUILTIN_STRATEGIES["ep"],
    "fsdp-tp": {"dp": -1, "tp": 2, "dp_kind": "fsdp"},  # last: see STRATEGIES above
}
JOBS4: dict[str, dict[str, Any]] = {
    name: {"plan": plan, "model": MOE if name == "ep" else MODEL4, "steps": STEPS4}
    for name, plan in HYBRIDS.items()
}
PLANS4 = {name: ParallelPlan.from_dict(plan).resolve(WORLD4) for name, plan in HYBRIDS.items()}
PIPELINED4 = {"tp-pp", "pp-interleaved"}
ALL_RANKS = ",".join(map(str, range(WORLD4)))

# The group every kind of op must use, as the mesh dimension whose group_of it is ("world":
# every rank). TP all-reduces are DTensor's functional collectives; DP sync is c10d (DDP, or
# replicate/FSDP2); MoE's dense part is DDP over every rank (EP ranks see different tokens).
OP_DIMS: dict[str, dict[tuple[str, str], str]] = {
    "dp-tp": {("allreduce", "functional"): "tp", ("allreduce", "c10d"): "dp"},
    "dp-tp-across": {("allreduce", "functional"): "tp", ("allreduce", "c10d"): "dp"},
    "fsdp-tp": {
        ("allreduce", "functional"): "tp",
        ("allgather", "c10d"): "dp",
        ("reduce_scatter", "c10d"): "dp",
    },
    "tp-pp": {("allreduce", "functional"): "tp", ("send", "c10d"): "pp", ("recv", "c10d"): "pp"},
    "pp-interleaved": {("allreduce", "c10d"): "dp", ("send", "c10d"): "pp", ("recv", "c10d"): "pp"},
    "ep": {("alltoall", "c10d"): "ep", ("allreduce", "c10d"): "world"},
}

# Per-rank parameter counts. An MoE block: 2 LayerNorms, attention, the router (no bias); each
# expert is one dense MLP.
MOE_DENSE_BLOCK = 2 * 2 * H + 4 * (H * H + H) + H * MOE["experts"]
MOE_EXPERT = (H * 4 * H + 4 * H) + (4 * H * H + H)
MOE_DENSE = EMB_PARAMS + L4 * MOE_DENSE_BLOCK + HEAD_PARAMS
TP2_FULL4 = EMB_PARAMS + L4 * TP2_BLOCK_PARAMS + HEAD_PARAMS
EXPECTED_LOCAL4: dict[str, list[int]] = {
    "dp-tp": [TP2_FULL4] * 4,
    "dp-tp-across": [TP2_FULL4] * 4,
    "fsdp-tp": [TP2_FULL4 // 2] * 4,  # TP shards, then FSDP halves them (no padding here)
    # pp coordinate 0 (ranks 0, 1: the first TP pair) holds layers 0-1 and the embeddings,
    # pp coordinate 1 layers 2-3 and the head.
    "tp-pp": [EMB_PARAMS + 2 * TP2_BLOCK_PARAMS] * 2 + [2 * TP2_BLOCK_PARAMS + HEAD_PARAMS] * 2,
    # 4 one-layer stages; pp coordinate 0 (ranks 0, 1) runs stages 0 and 2, coordinate 1
    # stages 1 and 3.
    "pp-interleaved": [EMB_PARAMS + 2 * BLOCK_PARAMS] * 2 + [2 * BLOCK_PARAMS + HEAD_PARAMS] * 2,
    "ep": [MOE_DENSE + L4 * (MOE["experts"] // WORLD4) * MOE_EXPERT] * 4,
}


@pytest.fixture(scope="module")
def runs4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _spawn(WORLD4, JOBS4, tmp_path_factory.mktemp("capture4"))


@pytest.fixture(scope="module")
def traces4(runs4: Path) -> dict[str, dict[str, Any]]:
    return {name: _load(runs4, name, WORLD4) for name in JOBS4}


def _group(plan: ParallelPlan, dim: str, rank: int) -> str:
    if dim == "world":
        return ALL_RANKS
    return ",".join(map(str, plan.group_of(dim, rank)))


def _groups(ops: pd.DataFrame) -> set[str]:
    return set(ops["group_ranks"])


def _measured(name: str, ops: pd.DataFrame) -> pd.DataFrame:
    """Ops of the measured steps: pipelines exchange shape metadata in step 0 (warm-up)."""
    return ops[ops["step"] >= (1 if name in PIPELINED4 else 0)]


def test_the_plans_lay_out_the_groups_as_intended() -> None:
    # What the tests below rely on, in numbers: 2 ranks per node means {0, 1} and {2, 3}.
    def groups(name: str, dim: str) -> set[str]:
        return {_group(PLANS4[name], dim, r) for r in range(WORLD4)}

    assert groups("dp-tp", "tp") == {"0,1", "2,3"} and groups("dp-tp", "dp") == {"0,2", "1,3"}
    assert groups("dp-tp-across", "tp") == {"0,2", "1,3"}
    assert groups("dp-tp-across", "dp") == {"0,1", "2,3"}
    assert groups("fsdp-tp", "tp") == {"0,1", "2,3"} and groups("fsdp-tp", "dp") == {"0,2", "1,3"}
    assert groups("tp-pp", "tp") == {"0,1", "2,3"} and groups("tp-pp", "pp") == {"0,2", "1,3"}
    assert groups("pp-interleaved", "dp") == {"0,1", "2,3"}
    assert groups("pp-interleaved", "pp") == {"0,2", "1,3"}
    assert groups("ep", "ep") == {ALL_RANKS}


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_rank_metadata(traces4: dict, name: str) -> None:
    meta = traces4[name]["meta"]
    assert [m["rank"] for m in meta] == list(range(WORLD4))
    assert all(m["world_size"] == WORLD4 and m["backend"] == "gloo" for m in meta)
    assert all(ParallelPlan(**m["plan"]) == PLANS4[name] for m in meta)
    assert [m["param_count_local"] for m in meta] == EXPECTED_LOCAL4[name]
    assert [m["grad_bytes_local"] for m in meta] == [n * FP32 for n in EXPECTED_LOCAL4[name]]


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_ops_go_only_to_the_groups_the_plan_implies(traces4: dict, name: str) -> None:
    plan, ops = PLANS4[name], traces4[name]["ops"]
    measured = _measured(name, ops)
    dims = OP_DIMS[name]
    kinds = set(zip(measured["op"], measured["source"], strict=True))
    # DDP's bucket rebuild (MoE: the dense part is classic DDP) broadcasts once, in step 1.
    extra = {("broadcast", "c10d")} if name == "ep" else set()
    assert kinds - extra == set(dims), kinds
    for row in measured.itertuples():
        dim = dims.get((row.op, row.source), "world")
        assert row.group_ranks == _group(plan, dim, row.rank), (row.op, row.source, row.rank)
        assert row.group_size == len(row.group_ranks.split(","))
        if row.peer >= 0:
            # P2P goes to the other member of this rank's pipeline group (adjacent stages).
            assert row.peer in set(plan.group_of("pp", row.rank)) - {row.rank}


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_ops_are_well_formed(traces4: dict, name: str) -> None:
    ops = traces4[name]["ops"]
    assert set(ops["rank"]) == set(range(WORLD4))
    assert set(ops["phase"]) <= PHASES
    assert set(ops["step"]) <= {-1, *range(STEPS4)}
    assert (ops[ops["step"] < 0]["phase"] == "other").all()
    for _, per_rank in ops.groupby("rank"):
        assert per_rank["t_issue_ns"].is_monotonic_increasing
    # The members of every group issue its collectives in the same order.
    coll = ops[ops["peer"] < 0]
    for group, rows in coll.groupby("group_ranks"):
        members = [int(r) for r in group.split(",")]
        assert set(rows["rank"]) == set(members), group
        seqs = [
            rows[rows["rank"] == r][["op", "seq", "step"]].reset_index(drop=True) for r in members
        ]
        for other in seqs[1:]:
            pd.testing.assert_frame_equal(seqs[0], other)
    # P2P sequence numbers count per (op, peer): 0, 1, ... on each rank.
    for _, rows in ops[ops["peer"] >= 0].groupby(["rank", "op", "peer"]):
        assert rows["seq"].tolist() == list(range(len(rows)))


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_steps_table(traces4: dict, name: str) -> None:
    _check_steps_table(traces4[name]["steps"], WORLD4, STEPS4, pipelined=name in PIPELINED4)
    assert len(traces4[name]["train"]) == WORLD4 * STEPS4


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_every_op_has_a_completion_time(traces4: dict, name: str) -> None:
    ops = traces4[name]["ops"]
    missing = ops[ops["t_end_ns"].isna()]
    assert missing.empty, missing[["op", "source", "phase"]].value_counts().to_dict()
    assert (ops["t_end_ns"] >= ops["t_issue_ns"]).all()


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_every_op_records_the_training_threads_wait(traces4: dict, name: str) -> None:
    ops = traces4[name]["ops"]
    assert ops["wait_ns"].notna().all()
    waited = ops[ops["wait_ns"] > 0]
    assert (waited["t_wait_end_ns"] - waited["t_wait_start_ns"] == waited["wait_ns"]).all()
    assert (waited["t_wait_start_ns"] >= waited["t_issue_ns"]).all()
    assert ((waited["t_end_ns"] - waited["t_wait_end_ns"]) <= GIL_SLACK_NS).all()
    # Every functional collective is waited on before its result is used.
    functional = _in_steps(ops)[lambda o: o["source"] == "functional"]
    assert functional["t_wait_start_ns"].notna().all()


def _tp_counts(ops: pd.DataFrame) -> dict:
    tp = ops[(ops["op"] == "allreduce") & (ops["source"] == "functional")]
    return tp.groupby(["rank", "step", "phase"]).size().to_dict()


# ─────────────────────────────────────────────────────────── dp x tp


@pytest.mark.parametrize("name", ["dp-tp", "dp-tp-across"])
def test_dp_tp_allreduces_activations_in_tp_and_gradients_in_dp(traces4: dict, name: str) -> None:
    t = traces4[name]
    steps = _in_steps(t["ops"])
    plan = PLANS4[name]
    # TP: as in the pure-TP test, 2 all-reduces per layer forward and 4 backward, each of one
    # replica's activations (TP peers share the batch; each DP replica has its own B).
    tp = steps[steps["source"] == "functional"]
    assert set(tp["bytes"]) == {B * S * H * FP32}
    assert _tp_counts(steps) == {
        (r, s, phase): n * L4
        for r in range(WORLD4)
        for s in range(STEPS4)
        for phase, n in (("fwd", 2), ("bwd", 4))
    }
    # DP: each rank all-reduces its local, TP-sharded gradients once per step (one replicate
    # unit over the whole model) with its DP peer: the bytes of the shards, not the full model.
    dp = steps[steps["source"] == "c10d"]
    assert set(dp["op"]) == {"allreduce"} and (dp["phase"] == "bwd").all()
    local = TP2_FULL4 * FP32
    assert dp.groupby(["rank", "step"])["bytes"].sum().to_dict() == {
        (r, s): local for r in range(WORLD4) for s in range(STEPS4)
    }
    assert dp.groupby(["rank", "step"]).size().eq(1).all()
    assert local < (EMB_PARAMS + L4 * BLOCK_PARAMS + HEAD_PARAMS) * FP32
    for r in range(WORLD4):
        assert _groups(dp[dp["rank"] == r]) == {_group(plan, "dp", r)}
        assert _groups(tp[tp["rank"] == r]) == {_group(plan, "tp", r)}
    # Set-up distributes the TP shards inside the TP groups only.
    setup = t["ops"][(t["ops"]["step"] < 0) & t["ops"]["op"].isin(["scatter", "broadcast"])]
    assert _groups(setup) == {_group(plan, "tp", r) for r in range(WORLD4)}


def test_the_mapping_moves_tp_between_node_local_and_cross_node_pairs(traces4: dict) -> None:
    def tp_groups(name: str) -> set[str]:
        ops = _in_steps(traces4[name]["ops"])
        return _groups(ops[ops["source"] == "functional"])

    def dp_groups(name: str) -> set[str]:
        ops = _in_steps(traces4[name]["ops"])
        return _groups(ops[ops["source"] == "c10d"])

    assert tp_groups("dp-tp") == {"0,1", "2,3"} == dp_groups("dp-tp-across")
    assert tp_groups("dp-tp-across") == {"0,2", "1,3"} == dp_groups("dp-tp")


# ─────────────────────────────────────────────────────────── fsdp x tp


def test_fsdp_tp_shards_over_dp_and_splits_layers_over_tp(traces4: dict) -> None:
    t = traces4["fsdp-tp"]
    steps = _in_steps(t["ops"])
    plan = PLANS4["fsdp-tp"]
    tp_local = TP2_FULL4 * FP32  # what one TP rank holds before FSDP shards it
    shard = t["meta"][0]["grad_bytes_local"]
    assert shard * plan.dp == tp_local
    assert _tp_counts(steps) == {
        (r, s, phase): n * L4
        for r in range(WORLD4)
        for s in range(STEPS4)
        for phase, n in (("fwd", 2), ("bwd", 4))
    }
    for (rank, _step), rows in steps.groupby(["rank", "step"]):
        dp = rows[rows["source"] == "c10d"]
        assert _groups(dp) == {_group(plan, "dp", rank)}
        rs = dp[dp["op"] == "reduce_scatter"]
        assert (rs["phase"] == "bwd").all()
        assert len(rs) == L4 + 1  # each block and the root
        assert rs["bytes"].sum() == tp_local  # the TP-local gradients, reduced once
        assert rs["bytes_out"].sum() == shard
        ag_fwd = dp[(dp["op"] == "allgather") & (dp["phase"] == "fwd")]
        assert len(ag_fwd) == L4 + 1
        assert ag_fwd["bytes"].sum() == shard
        assert ag_fwd["bytes_out"].sum() == tp_local
        assert TP2_BLOCK_PARAMS * FP32 in set(dp[dp["phase"] == "bwd"]["bytes_out"])


def test_fsdp_tp_backward_regathers_the_blocks_and_the_root(traces4: dict) -> None:
    steps = _in_steps(traces4["fsdp-tp"]["ops"])
    ag_bwd = steps[(steps["op"] == "allgather") & (steps["phase"] == "bwd")]
    for (_rank, _step), rows in ag_bwd.groupby(["rank", "step"]):
        assert len(rows) == L4 + 1  # the blocks and the root (see the fsdp test above)
        assert sum(rows["bytes_out"] == TP2_BLOCK_PARAMS * FP32) == L4


# ─────────────────────────────────────────────────────────── tp x pp


def test_tp_pp_sends_microbatches_between_stages_and_allreduces_within_tp(traces4: dict) -> None:
    t = traces4["tp-pp"]
    plan = PLANS4["tp-pp"]
    measured = _measured("tp-pp", t["ops"])
    assert (measured["phase"] == "fwd_bwd").all()
    mb = B // MICROBATCHES
    p2p = measured[measured["peer"] >= 0]
    # 2 stages: per micro-batch, stage 0 sends its activation and receives its gradient;
    # every TP rank of a stage exchanges with the TP rank of the same index on the other stage.
    assert p2p.groupby(["rank", "step", "op"]).size().to_dict() == {
        (r, s, op): MICROBATCHES
        for r in range(WORLD4)
        for s in range(1, STEPS4)
        for op in ("send", "recv")
    }
    assert set(p2p["bytes"]) == {mb * S * H * FP32}
    for row in p2p.itertuples():
        assert plan.group_of("pp", row.rank) == sorted([row.rank, row.peer])
        assert plan.coords(row.peer)["tp"] == plan.coords(row.rank)["tp"]
    sent = p2p[p2p["op"] == "send"].groupby(["rank", "peer"])["bytes"].sum()
    recvd = p2p[p2p["op"] == "recv"].groupby(["peer", "rank"])["bytes"].sum()
    assert sent.to_dict() == recvd.to_dict()  # (src, dst) both ways
    # TP: every micro-batch runs the stage's L/pp layers forward (2 each) and backward (4 each),
    # on micro-batch activations.
    tp = measured[measured["source"] == "functional"]
    per_step = tp.groupby(["rank", "step"]).size().to_dict()
    assert per_step == {
        (r, s): MICROBATCHES * (L4 // plan.pp) * (2 + 4)
        for r in range(WORLD4)
        for s in range(1, STEPS4)
    }
    assert set(tp["bytes"]) == {mb * S * H * FP32}
    for r in range(WORLD4):
        assert _groups(tp[tp["rank"] == r]) == {_group(plan, "tp", r)}


# ─────────────────────────────────────────────────────────── interleaved 1F1B x dp


def test_interleaved_pipeline_p2p_counts_and_dp_sync(traces4: dict) -> None:
    t = traces4["pp-interleaved"]
    plan = PLANS4["pp-interleaved"]
    assert (plan.pp, plan.stages_per_rank, plan.microbatches, plan.dp) == (2, 2, 2, 2)
    measured = _measured("pp-interleaved", t["ops"])
    # pp=2 ranks x 2 stages each = 4 one-layer stages, placed round-robin: pp rank 0 runs stages
    # 0 and 2, pp rank 1 stages 1 and 3. The chain 0 -> 1 -> 2 -> 3 crosses between the two
    # ranks at each of its 3 boundaries. Per micro-batch, forward sends an activation across
    # each boundary (0->1 and 2->3 from rank 0, 1->2 from rank 1) and backward a gradient back
    # (3->2 and 1->0 from rank 1, 2->1 from rank 0): 3 sends and 3 receives per rank.
    # With 2 micro-batches: 6 sends and 6 receives per rank and step, whatever the order the
    # schedule interleaves them in.
    boundaries = plan.pp * plan.stages_per_rank - 1
    per_rank = boundaries * 2 * plan.microbatches // plan.pp
    assert per_rank == 6
    p2p = measured[measured["peer"] >= 0]
    assert p2p.groupby(["rank", "step", "op"]).size().to_dict() == {
        (r, s, op): per_rank
        for r in range(WORLD4)
        for s in range(1, STEPS4)
        for op in ("send", "recv")
    }
    assert set(p2p["bytes"]) == {(B // plan.microbatches) * S * H * FP32}
    for row in p2p.itertuples():
        assert plan.group_of("pp", row.rank) == sorted([row.rank, row.peer])
    # DP: one replicate unit per stage chunk, so 2 all-reduces per step that together carry
    # this rank's gradients (both its stages), inside its DP group.
    dp = _in_steps(t["ops"])
    dp = dp[dp["op"] == "allreduce"]
    assert (dp["source"] == "c10d").all() and (dp["phase"] == "fwd_bwd").all()
    assert dp.groupby(["rank", "step"]).size().eq(plan.stages_per_rank).all()
    expected = {
        (r, s): EXPECTED_LOCAL4["pp-interleaved"][r] * FP32
        for r in range(WORLD4)
        for s in range(STEPS4)
    }
    assert dp.groupby(["rank", "step"])["bytes"].sum().to_dict() == expected
    # Chunk by chunk: the embedding stage and one block; one block; one block and the head.
    sizes = {r: sorted(dp[(dp["rank"] == r) & (dp["step"] == 1)]["bytes"]) for r in range(4)}
    assert sizes[0] == sizes[1] == sorted([BLOCK_PARAMS * FP32, (EMB_PARAMS + BLOCK_PARAMS) * FP32])
    assert (
        sizes[2] == sizes[3] == sorted([BLOCK_PARAMS * FP32, (BLOCK_PARAMS + HEAD_PARAMS) * FP32])
    )
    for r in range(WORLD4):
        assert _groups(dp[dp["rank"] == r]) == {_group(plan, "dp", r)}


# ─────────────────────────────────────────────────────────── expert parallelism


def test_ep_all_to_all_per_moe_layer_and_dense_allreduce(traces4: dict) -> None:
    t = traces4["ep"]
    plan = PLANS4["ep"]
    assert plan.ep == WORLD4 and MOE["experts"] % plan.ep == 0
    steps = _in_steps(t["ops"])
    a2a = steps[steps["op"] == "alltoall"]
    # Per MoE layer (every block is one): forward exchanges the per-expert counts, dispatches
    # the tokens and combines the results (3); backward reverses combine and dispatch (2; the
    # counts carry no gradient).
    assert a2a.groupby(["rank", "step", "phase"]).size().to_dict() == {
        (r, s, phase): n * L4
        for r in range(WORLD4)
        for s in range(STEPS4)
        for phase, n in (("fwd", 3), ("bwd", 2))
    }
    for r in range(WORLD4):
        assert _groups(a2a[a2a["rank"] == r]) == {_group(plan, "ep", r)}
    counts = a2a[a2a["dtype"] == "int64"]
    assert (counts["phase"] == "fwd").all()
    assert set(counts["bytes"]) == {MOE["experts"] * INT64}
    assert len(counts) == WORLD4 * STEPS4 * L4
    # Dense part: DDP over every rank with exactly the non-expert parameters' gradients.
    ar = steps[steps["op"] == "allreduce"]
    assert (ar["phase"] == "bwd").all() and _groups(ar) == {ALL_RANKS}
    assert ar.groupby(["rank", "step"])["bytes"].sum().to_dict() == {
        (r, s): MOE_DENSE * FP32 for r in range(WORLD4) for s in range(STEPS4)
    }
    local_experts = L4 * (MOE["experts"] // plan.ep) * MOE_EXPERT * FP32
    assert all(m["grad_bytes_local"] - local_experts == MOE_DENSE * FP32 for m in t["meta"])
    # Otherwise only DDP's bucket rebuild at the first forward after step 0.
    other = steps[~steps["op"].isin(["alltoall", "allreduce"])]
    assert set(zip(other["op"], other["step"], other["phase"], strict=True)) == {
        ("broadcast", 1, "fwd")
    }


def test_ep_all_to_all_records_its_uneven_splits(traces4: dict) -> None:
    """Token all-to-alls carry per-destination bytes (group order) that add up to the op's
    bytes; the even per-expert count exchange carries none."""
    a2a = _in_steps(traces4["ep"]["ops"]).query("op == 'alltoall'")
    tokens = a2a[a2a["dtype"] != "int64"]
    assert (
        tokens["split_bytes"].notna().all()
        and a2a[a2a["dtype"] == "int64"]["split_bytes"].isna().all()
    )
    for split, nbytes, size in zip(
        tokens["split_bytes"], tokens["bytes"], tokens["group_size"], strict=True
    ):
        parts = [int(b) for b in split.split(",")]
        assert len(parts) == size and sum(parts) == nbytes


def test_ep_routing_table(traces4: dict) -> None:
    t = traces4["ep"]
    plan = PLANS4["ep"]
    moe = t["moe"]
    tokens = B * S
    layers = [f"layers.{i}.mlp" for i in range(L4)]
    capacity = math.ceil(1.25 * tokens * MOE["top_k"] / MOE["experts"])  # default cf 1.25
    # One row per destination EP rank, per rank, step and MoE layer.
    assert len(moe) == WORLD4 * STEPS4 * L4 * plan.ep
    for (rank, step, layer), rows in moe.groupby(["rank", "step", "layer"]):
        assert layer in layers and 0 <= step < STEPS4
        assert rows["dst_rank"].tolist() == plan.group_of("ep", rank)
        assert rows["dropped"].nunique() == 1
        dropped = int(rows["dropped"].iloc[0])
        assert 0 <= dropped < tokens * MOE["top_k"]
        # Every token's top_k choices are sent somewhere unless dropped for capacity.
        assert rows["tokens_sent"].sum() == tokens * MOE["top_k"] - dropped
        # One local expert per rank: a rank fills at most `capacity` of its slots per source.
        assert (rows["tokens_received"] <= capacity * MOE["experts"] // plan.ep).all()
    # What r sent d, d received from r.
    sent = moe.set_index(["step", "layer", "rank", "dst_rank"])["tokens_sent"]
    recvd = moe.set_index(["step", "layer", "dst_rank", "rank"])["tokens_received"]
    recvd.index = recvd.index.set_names(sent.index.names)  # (src, dst) like `sent`
    assert sent.sort_index().to_dict() == recvd.sort_index().to_dict()
    # The all-to-all bytes follow from the routing: forward sends the kept rows (dispatch) and
    # returns the received ones (combine), each a hidden-size float32 row; backward mirrors both.
    row_bytes = H * FP32
    a2a = _in_steps(t["ops"])
    a2a = a2a[a2a["op"] == "alltoall"].groupby(["rank", "step", "phase"])["bytes"].sum()
    moved = moe.groupby(["rank", "step"])[["tokens_sent", "tokens_received"]].sum().sum(axis=1)
    for (rank, step), rows_moved in moved.items():
        assert a2a[(rank, step, "bwd")] == rows_moved * row_bytes
        assert a2a[(rank, step, "fwd")] == rows_moved * row_bytes + L4 * MOE["experts"] * INT64


# ─────────────────────────────────────────────────────────── a cell on the netns cluster

# A DDP and a 1F1B cell of the small GPT over a 100 Mbit/s link between two emulated nodes: the
# waits go through the runner, the parse step (clock mapping) and the sync tables.
CELL_RUN = {"timeout_s": 120, "sample_hz": 200, "master_port": 29561}
CELL_STEPS = 5
CELL_WARMUP = 2


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["ddp", "pp"])
def test_exposed_communication_of_a_cell_comes_from_its_waits(
    netns_cluster: Any, tmp_path: Path, strategy: str
) -> None:
    from commscope.cell.parse import build_cell_tables, cell_table_paths
    from commscope.experiment.cell import run_cell
    from commscope.experiment.launch import training_workload
    from commscope.metrics import sync
    from commscope.spec.settings import CellSettings, RunSettings

    values = {
        "strategy": strategy,
        "model": "tiny",
        "nodes": 2,
        "ranks_per_node": 1,
        "bw": "100mbit",
        "delay": "0ms",
        "jitter": "0ms",
        "loss": "0pct",
        "steps": CELL_STEPS,
        "repeat": 0,
    }
    settings, run = CellSettings.from_mapping(values), RunSettings.from_mapping(CELL_RUN)
    workload = training_workload(settings, MODEL, PLANS[strategy], run)
    raw = run_cell(netns_cluster, settings, workload, run, tmp_path / "raw")
    paths = build_cell_tables(raw, settings, CELL_WARMUP, cell_table_paths(tmp_path / "trace"))
    ops, steps = pd.read_parquet(paths["ops"]), pd.read_parquet(paths["steps"])
    assert ops["wait_ns"].notna().all()
    plan = json.loads((raw / "node0" / "rank0.json").read_text())["plan"]
    tables = sync.sync_tables(ops, steps, plan, CELL_WARMUP)
    exposed = tables["exposed_comm"]
    assert len(exposed) == WORLD * CELL_STEPS
    assert set(exposed["exposed_source"]) == {"waits"}
    assert tables["sync_summary"].iloc[0]["exposed_source"] == "waits"
    # Blocked no longer than communication was in flight, and less than that somewhere: the
    # backward overlaps DDP's buckets, the schedule computes while its isends and irecvs fly.
    assert (exposed["exposed_comm_s"] <= exposed["comm_s"]).all()
    assert (exposed["exposed_comm_s"] < exposed["comm_s"]).any()
    # The same trace without its waits gives the upper bound of before: every op whole.
    old = sync.exposed_comm(
        ops.drop(columns=["t_wait_start_ns", "t_wait_end_ns", "wait_ns"]), steps
    )
    assert set(old["exposed_source"]) == {"upper_bound"}
    assert list(old["exposed_comm_s"]) == list(exposed["comm_s"])
