"""MoE expert parallelism over 2 spawned gloo ranks: the EP model against the full model."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from commscope.spec.models import MoEConfig
from commscope.workload.models import lm_loss, synthetic_batch
from commscope.workload.moe import MoEGPT, moe_layers

from .gloo import free_port, run_ranks

CFG = MoEConfig(
    layers=2, hidden=16, heads=2, seq=8, vocab=32, batch=4, experts=4, top_k=1, capacity_factor=1.0
)
EP_WORLD = 2
JOIN_TIMEOUT_S = 180  # ~10 s on 2 busy cores; a hang fails instead of blocking


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _ep_worker(rank: int, port: int, out: str) -> None:
    """One EP rank: compare the EP model with the full model on this rank's tokens, top-1/2."""
    os.environ.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from commscope.workload import capture
    from commscope.workload.moe import apply_expert_parallel

    torch.set_num_threads(1)
    capture.install()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=EP_WORLD,
        timeout=timedelta(seconds=60),
    )
    summary: dict[str, object] = {}
    for top_k in (1, 2):
        cfg = replace(CFG, top_k=top_k)
        torch.manual_seed(0)  # identical full weights on both ranks: the reference
        ref = MoEGPT(cfg)
        ep = copy.deepcopy(ref)
        names = apply_expert_parallel(ep, dist.group.WORLD)
        local = range(rank * cfg.experts // 2, (rank + 1) * cfg.experts // 2)
        for layer in moe_layers(ep).values():
            assert list(layer.experts) == [str(e) for e in local]
        assert names == [
            f"layers.{i}.mlp.experts.{e}.{p}"
            for i in range(cfg.layers)
            for e in local
            for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
        ]
        ep_params = dict(ep.named_parameters())
        assert set(names) <= set(ep_params)
        assert not any(".experts." in n for n in set(ep_params) - set(names))

        x, y = synthetic_batch(cfg, cfg.batch, seed=100 + rank)  # each rank its own tokens
        logits_ref, aux_ref = ref(x)
        (lm_loss(logits_ref, y) + aux_ref).backward()
        capture.reset()
        capture.enable(True)
        capture.set_phase("fwd")
        logits_ep, aux_ep = ep(x)
        capture.set_phase("bwd")
        (lm_loss(logits_ep, y) + aux_ep).backward()
        capture.enable(False)
        torch.testing.assert_close(logits_ep, logits_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(aux_ep, aux_ref)

        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        # An expert sees every rank's tokens: its gradient is the sum of the references'. Reduce
        # every expert of the full model, in the same order on both ranks.
        for n, g in ref_grads.items():
            if ".experts." in n:
                dist.all_reduce(g)
        for n, p in ep.named_parameters():
            g = ref_grads[n]
            torch.testing.assert_close(
                p.grad, g, rtol=1e-4, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}"
            )

        kept_total, dropped_total = 0, 0
        for name, layer in moe_layers(ep).items():
            ref_layer = moe_layers(ref)[name]
            hist, ref_hist = layer.split_history[-1], ref_layer.split_history[-1]
            tokens = cfg.batch * cfg.seq
            assert sum(layer.last_split_sizes) == tokens * top_k - layer.last_dropped
            assert layer.last_split_sizes == hist["input_splits"]
            assert layer.last_dropped == ref_layer.last_dropped
            assert hist["expert_counts"] == ref_hist["expert_counts"]
            # Rank r sends rank j the tokens of j's experts.
            counts = hist["expert_counts"]
            half = cfg.experts // 2
            assert hist["input_splits"] == [sum(counts[:half]), sum(counts[half:])]
            # What a rank receives is what the others sent it.
            gathered: list[object] = [None] * EP_WORLD
            dist.all_gather_object(gathered, hist["input_splits"])
            assert hist["output_splits"] == [g[rank] for g in gathered]  # type: ignore[index]
            kept_total += sum(hist["input_splits"])
            dropped_total += layer.last_dropped

        ops = [(r.op, r.phase) for r in capture.records()]
        summary[f"top{top_k}"] = {
            "kept": kept_total,
            "dropped": dropped_total,
            "splits": [layer.last_split_sizes for layer in moe_layers(ep).values()],
            "alltoall_fwd": ops.count(("alltoall", "fwd")),
            "alltoall_bwd": ops.count(("alltoall", "bwd")),
            "ops": sorted({op for op, _ in ops}),
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(summary))
    # As train.py does: release the Works the capture holds before the group goes, or a gloo
    # Work destroyed at interpreter exit aborts the worker.
    capture.finish()
    dist.destroy_process_group()


def test_expert_parallel_matches_the_full_model(tmp_path: Path) -> None:
    run_ranks(_ep_worker, (free_port(), str(tmp_path)), EP_WORLD, JOIN_TIMEOUT_S, "2-rank EP run")
    tokens = CFG.batch * CFG.seq
    for rank in range(EP_WORLD):
        summary = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for top_k in (1, 2):
            s = summary[f"top{top_k}"]
            # Kept + dropped assignments account for every token's k choices in both layers.
            assert s["kept"] + s["dropped"] == CFG.layers * tokens * top_k
            assert s["dropped"] > 0  # capacity_factor 1.0: the drop path runs under EP too
            assert s["ops"] == ["alltoall"]
            # Per MoE layer: counts, dispatch, combine forward; reversed combine and dispatch
            # backward (the counts exchange carries no gradient).
            assert s["alltoall_fwd"] == 3 * CFG.layers
            assert s["alltoall_bwd"] == 2 * CFG.layers
