"""MoE GPT: routing, capacity, aux loss and the offline stdlib corpus its learning runs train on
(expert parallelism over 2 gloo ranks: tests/integration/test_moe_gloo.py)."""

from __future__ import annotations

import math
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from commscope.spec.models import MoEConfig, expert_capacity, validate_moe
from commscope.workload.corpus import CharDataset, load_stdlib_corpus, stdlib_source_files
from commscope.workload.models import MLP, Block, lm_loss, synthetic_batch
from commscope.workload.moe import MoEBlock, MoEGPT, MoELayer, moe_layers, route

CFG = MoEConfig(
    layers=2, hidden=16, heads=2, seq=8, vocab=32, batch=4, experts=4, top_k=1, capacity_factor=1.0
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_forward_shapes_parameters_and_block_layout() -> None:
    cfg = replace(CFG, layers=4, moe_every=2, top_k=2)
    torch.manual_seed(0)
    model = MoEGPT(cfg)
    x, y = synthetic_batch(cfg, cfg.batch, seed=1)
    logits, aux = model(x)
    assert logits.shape == (cfg.batch, cfg.seq, cfg.vocab)
    assert aux.shape == ()
    # moe_every=2: blocks 1 and 3 are MoE blocks, 0 and 2 dense.
    kinds = [type(b) for b in model.layers.values()]
    assert kinds == [Block, MoEBlock, Block, MoEBlock]
    assert list(moe_layers(model)) == ["layers.1.mlp", "layers.3.mlp"]
    # Each MoE layer: a bias-free router plus `experts` dense MLPs with the dense names.
    h, f = cfg.hidden, cfg.ffn_mult * cfg.hidden
    layer = model.layers["1"].mlp
    assert layer.router.weight.shape == (cfg.experts, h)
    assert layer.router.bias is None
    assert all(isinstance(e, MLP) for e in layer.experts.values())
    mlp = h * f + f + f * h + h
    assert sum(p.numel() for p in layer.parameters()) == cfg.experts * h + cfg.experts * mlp
    # Loss backpropagates into router and experts.
    (lm_loss(logits, y) + aux).backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0
    assert layer.experts["0"].fc1.weight.grad is not None


def test_aux_loss_is_one_at_uniform_routing_and_grows_with_collapse() -> None:
    tokens, experts = 64, 4
    # Equal logits: P_i = 1/E exactly, so E * sum f_i P_i = sum f_i = 1 whatever the ties pick.
    uniform = route(torch.zeros(tokens, experts), top_k=1, capacity=tokens)
    assert uniform.aux_loss.item() == pytest.approx(1.0, abs=1e-6)
    # A freshly initialised layer routes near-uniformly: aux close to 1.
    torch.manual_seed(0)
    layer = MoELayer(replace(CFG, experts=experts))
    _, aux = layer(torch.randn(tokens, CFG.hidden))
    assert 0.9 < aux.item() < 1.3
    # Everything on expert 0 with confidence: aux -> E.
    collapsed = torch.zeros(tokens, experts)
    collapsed[:, 0] = 20.0
    assert route(collapsed, 1, tokens).aux_loss.item() == pytest.approx(experts, rel=1e-3)


def test_capacity_drops_tokens_past_each_experts_slots() -> None:
    cfg = replace(CFG, experts=4, capacity_factor=1.0)
    tokens = 32
    cap = expert_capacity(cfg, tokens)
    assert cap == math.ceil(1.0 * 32 * 1 / 4) == 8
    layer = MoELayer(cfg)
    with torch.no_grad():
        # Positive inputs and a router that only scores expert 0: every token picks expert 0.
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0
    x = torch.rand(tokens, cfg.hidden) + 0.1
    y, _ = layer(x)
    assert layer.last_dropped == tokens - cap == 24
    assert layer.last_split_sizes == [cap]
    assert layer.split_history[-1]["expert_counts"] == [cap, 0, 0, 0]
    # The first `cap` tokens (in token order) are kept; the rest contribute exactly zero, so the
    # block's residual passes them through.
    nonzero = (y.abs().sum(-1) > 0).nonzero().flatten().tolist()
    assert nonzero == list(range(cap))
    # Kept rows equal gate * expert(x).
    gate = torch.softmax(layer.router(x), -1)[:cap, 0:1]
    torch.testing.assert_close(y[:cap], gate * layer.experts["0"](x[:cap]))


def test_top2_sends_each_token_to_two_distinct_experts_with_normalised_gates() -> None:
    torch.manual_seed(0)
    logits = torch.randn(50, 4)
    plan = route(logits, top_k=2, capacity=1000)  # no dropping
    assert plan.dropped == 0
    assert plan.token_idx.numel() == 100
    assert torch.bincount(plan.token_idx, minlength=50).tolist() == [2] * 50
    pairs = {(int(t), int(e)) for t, e in zip(plan.token_idx, plan.expert_idx, strict=True)}
    assert len(pairs) == 100  # the two experts of a token differ
    expected = set()
    for t, top in enumerate(logits.topk(2, -1).indices.tolist()):
        expected |= {(t, top[0]), (t, top[1])}
    assert pairs == expected
    gate_sum = torch.zeros(50).index_add(0, plan.token_idx, plan.gate)
    torch.testing.assert_close(gate_sum, torch.ones(50))
    # Expert runs are contiguous and counted.
    assert torch.equal(plan.expert_idx, plan.expert_idx.sort().values)
    assert plan.expert_counts.sum().item() == 100


def test_top2_capacity_gives_first_choices_priority() -> None:
    # 4 tokens all preferring expert 0 first and expert 1 second; capacity 2 per expert.
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]]).repeat(4, 1)
    plan = route(logits, top_k=2, capacity=2)
    kept = sorted(zip(plan.token_idx.tolist(), plan.expert_idx.tolist(), strict=True))
    # Tokens 0, 1 take expert 0's slots; tokens 0, 1 also fill expert 1 (second choices in token
    # order); tokens 2, 3 lose both.
    assert kept == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert plan.dropped == 4


def test_validate_moe() -> None:
    assert validate_moe(CFG, 2) == []
    assert validate_moe(CFG, 4) == []
    assert any("divisible by the expert-parallel size" in p for p in validate_moe(CFG, 3))
    assert any("top_k" in p for p in validate_moe(replace(CFG, top_k=3), 1))
    assert any(
        "exceeds model.experts" in p for p in validate_moe(replace(CFG, experts=1, top_k=2), 1)
    )
    assert any("capacity_factor" in p for p in validate_moe(replace(CFG, capacity_factor=0), 1))
    assert any("moe_every" in p for p in validate_moe(replace(CFG, moe_every=3), 1))


# --------------------------------------------------------------------------- corpus for learning


@pytest.fixture(scope="module")
def corpus() -> bytes:
    return load_stdlib_corpus(200_000)


def test_stdlib_corpus_is_real_deterministic_python_source(corpus: bytes) -> None:
    assert len(corpus) == 200_000
    assert load_stdlib_corpus(200_000) == corpus
    assert load_stdlib_corpus(1_000) == corpus[:1_000]  # a prefix, not a different sample
    base = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_source_files()
    rel = [p.relative_to(base).as_posix() for p in files]
    assert rel == sorted(rel)
    assert len(files) > 100
    assert "os.py" in rel and "json/__init__.py" in rel
    assert all("site-packages" not in p.parts for p in files)
    assert b"def " in corpus and b"import " in corpus


def test_char_dataset_batches(corpus: bytes) -> None:
    ds = CharDataset(corpus, seq=32)
    assert ds.vocab == 256
    assert len(ds) == len(corpus) - 32
    x, y = ds.batch(step=3, batch_size=4, seed=0)
    assert x.shape == y.shape == (4, 32)
    assert x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 256
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one byte
    # Each row is a contiguous window of the corpus.
    row = bytes(x[0].tolist()) + bytes([int(y[0, -1])])
    assert row in corpus
    # Deterministic per (seed, step, rank); different steps, seeds and ranks differ.
    assert torch.equal(ds.batch(3, 4, 0)[0], x)
    assert not torch.equal(ds.batch(4, 4, 0)[0], x)
    assert not torch.equal(ds.batch(3, 4, 1)[0], x)
    r0, _ = ds.batch(3, 4, 0, rank=0, world=2)
    r1, _ = ds.batch(3, 4, 0, rank=1, world=2)
    assert not torch.equal(r0, r1)
    # The ranks' slices tile the step's global batch.
    full, _ = ds.batch(3, 8, 0)
    assert torch.equal(torch.cat([r0, r1]), full)
    with pytest.raises(ValueError):
        CharDataset(b"abc", seq=8)


def test_moe_gpt_learns_on_the_corpus(corpus: bytes) -> None:
    cfg = MoEConfig(
        layers=1, hidden=32, heads=2, seq=32, vocab=256, batch=8, experts=4, top_k=2,
        capacity_factor=1.5, aux_loss_coef=0.01,
    )  # fmt: skip
    ds = CharDataset(corpus, cfg.seq)
    torch.manual_seed(0)
    model = MoEGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        x, y = ds.batch(step, cfg.batch, seed=0)
        logits, aux = model(x)
        loss = lm_loss(logits, y)
        (loss + aux).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    # Starts near ln(256) = 5.55 and falls well below it as byte statistics are learned.
    assert abs(losses[0] - math.log(256)) < 0.5
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    layer = model.layers["0"].mlp
    assert len(layer.split_history) == 30  # one routing record per forward
    tokens = cfg.batch * cfg.seq
    for rec in layer.split_history:
        assert sum(rec["expert_counts"]) + rec["dropped"] == tokens * cfg.top_k
