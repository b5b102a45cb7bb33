"""The GPT model, pipeline stage splitting and the strategy/degree checks (no processes)."""

from __future__ import annotations

import math

import pytest
import torch

from commscope.workload.models import GPT, GPTConfig, lm_loss, split_layers, synthetic_batch
from commscope.workload.strategies import make_strategy, validate_degrees

CFG = GPTConfig(layers=5, hidden=32, heads=2, seq=16, vocab=64, batch=4)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [
        (5, 2, [[0, 1, 2], [3, 4]]),
        (4, 4, [[0], [1], [2], [3]]),
        (4, 2, [[0, 1], [2, 3]]),
        (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
        (3, 1, [[0, 1, 2]]),
        (2, 3, [[0], [1], []]),  # more stages than layers: the last stage gets nothing
    ],
)
def test_split_layers(layers: int, stages: int, expected: list[list[int]]) -> None:
    ranges = split_layers(layers, stages)
    assert [list(r) for r in ranges] == expected
    # Contiguous, covering every layer exactly once.
    assert [i for r in ranges for i in r] == list(range(layers))


def test_gpt_forward_shapes_and_parameter_count() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    x, y = synthetic_batch(CFG, CFG.batch, seed=1)
    assert x.shape == y.shape == (CFG.batch, CFG.seq)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert int(x.min()) >= 0 and int(x.max()) < CFG.vocab
    logits = model(x)
    assert logits.shape == (CFG.batch, CFG.seq, CFG.vocab)
    loss = lm_loss(logits, y)
    assert loss.shape == ()
    # Untrained: close to the uniform cross-entropy ln(vocab).
    assert abs(loss.item() - math.log(CFG.vocab)) < 0.5
    h, v, s = CFG.hidden, CFG.vocab, CFG.seq
    block = 2 * 2 * h + 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert (
        sum(p.numel() for p in model.parameters())
        == v * h + s * h + CFG.layers * block + 2 * h + h * v
    )
    # Layers are keyed by their global index.
    assert list(model.layers.keys()) == ["0", "1", "2", "3", "4"]


def test_synthetic_batch_is_reproducible() -> None:
    a, _ = synthetic_batch(CFG, 2, seed=7)
    b, _ = synthetic_batch(CFG, 2, seed=7)
    c, _ = synthetic_batch(CFG, 2, seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("stages", [2, 3])
def test_pipeline_stages_chain_to_the_full_model(stages: int) -> None:
    torch.manual_seed(0)
    full = GPT(CFG).eval()
    state = full.state_dict()
    ranges = split_layers(CFG.layers, stages)
    parts = []
    for i, ids in enumerate(ranges):
        stage = GPT(CFG, ids, has_embedding=i == 0, has_head=i == stages - 1).eval()
        assert (stage.tok_emb is not None) == (i == 0)
        assert (stage.pos_emb is not None) == (i == 0)
        assert (stage.head is not None) == (i == stages - 1)
        assert (stage.norm is not None) == (i == stages - 1)
        # Parameter names are stable across stages: each stage's names are a subset of the
        # full model's, so the full weights load without renaming.
        own = stage.state_dict().keys()
        assert set(own) <= set(state)
        stage.load_state_dict({k: state[k] for k in own})
        parts.append(stage)
    # Together the stages hold every parameter exactly once.
    names = [n for p in parts for n in p.state_dict()]
    assert sorted(names) == sorted(state)

    x, _ = synthetic_batch(CFG, 2, seed=3)
    with torch.no_grad():
        expected = full(x)
        h = x
        for i, stage in enumerate(parts):
            h = stage(h)
            if i < stages - 1:
                assert h.shape == (2, CFG.seq, CFG.hidden)  # activations between stages
                assert h.dtype == torch.float32
    assert h.shape == expected.shape == (2, CFG.seq, CFG.vocab)
    torch.testing.assert_close(h, expected)


def test_a_middle_stage_is_blocks_only() -> None:
    stage = GPT(CFG, range(2, 4), has_embedding=False, has_head=False)
    assert list(stage.layers.keys()) == ["2", "3"]
    h = torch.randn(2, CFG.seq, CFG.hidden)
    assert stage(h).shape == h.shape


# ─────────────────────────────────────────────────────────── validate_degrees


def _cfg(**kw: int) -> GPTConfig:
    base = {"layers": 4, "hidden": 32, "heads": 4, "seq": 16, "vocab": 64, "batch": 8}
    return GPTConfig(**(base | kw))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp", "pp"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_validate_degrees_accepts_a_fitting_model(strategy: str, world: int) -> None:
    assert validate_degrees(strategy, _cfg(), world, microbatches=4) == []


@pytest.mark.parametrize(
    ("strategy", "cfg", "world", "microbatches", "fragments"),
    [
        ("ddp", _cfg(hidden=30), 2, 4, ["model.hidden=30", "model.heads=4"]),
        ("tp", _cfg(heads=4), 3, 4, ["tp over 3 ranks", "model.heads (4) divisible by 3"]),
        ("tp", _cfg(heads=2, hidden=2, ffn_mult=1), 4, 4, ["heads (2)", "MLP width"]),
        ("pp", _cfg(layers=2), 4, 4, ["pp over 4 ranks", "model.layers (2) >= 4 stages"]),
        ("pp", _cfg(batch=6), 2, 4, ["model.batch (6) divisible by microbatches (4)"]),
    ],
)
def test_validate_degrees_names_the_problem(
    strategy: str, cfg: GPTConfig, world: int, microbatches: int, fragments: list[str]
) -> None:
    problems = validate_degrees(strategy, cfg, world, microbatches)
    text = "\n".join(problems)
    for fragment in fragments:
        assert fragment in text


def test_validate_degrees_only_checks_what_the_strategy_needs() -> None:
    # Heads not divisible by the world matter to tp only; too few layers to pp only.
    assert validate_degrees("ddp", _cfg(heads=4), 3, 4) == []
    assert validate_degrees("fsdp", _cfg(layers=1), 4, 4) == []
    assert validate_degrees("tp", _cfg(layers=1, batch=3), 2, 4) == []
    assert len(validate_degrees("pp", _cfg(layers=1, batch=6), 2, 4)) == 2


def test_make_strategy_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="strategy 'zero' unknown"):
        make_strategy("zero", _cfg(), None, None)  # type: ignore[arg-type]
