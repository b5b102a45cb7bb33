"""``commscope predict``: per-rank traffic, node x node matrix and step time, analytically.

Examples::

    # Seed 002's GPT-3B on 32 GPUs, (p, t, d) = (4, 2, 4), DeepSpeed's default mapping
    commscope predict --preset gpt-3b --pp 4 --tp 2 --dp 4 --gpus-per-node 8 \\
        --mapping pp-dp-tp --framework megatron --dtype-bytes 2 --rank 0
    # a cell of a study config, as commscope's trainer would run it
    commscope predict --config config/config.yaml --cell-index 3

Nothing is launched: the prediction is pure arithmetic over the plan (see
:mod:`commscope.predict.model`), so clusters far larger than any we have take seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

# Seed 002 §4 (GPT under PTD-P): (l, h, s) = (48, 1600, 1024) and (54, 2000, 1024), micro-batch
# b = 32, m = 8 micro-batches per replica (gb = 512 on d = 2, gb = 1024 on d = 4), so the
# per-replica batch is b * m = 256. The paper names neither vocabulary nor heads: GPT-2's BPE
# vocabulary (50257) and 100-wide heads (16 and 20 heads, divisible by t = 2 and 4) are
# assumptions; heads change no traffic.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt-1.5b": dict(layers=48, hidden=1600, heads=16, seq=1024, vocab=50257, batch=256),
    "gpt-3b": dict(layers=54, hidden=2000, heads=20, seq=1024, vocab=50257, batch=256),
}
PRESET_MICROBATCHES = 8
MODEL_KEYS = ("kind", "layers", "hidden", "heads", "seq", "vocab", "batch", "ffn_mult")


def _bytes_text(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f} B"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="commscope predict",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("model (one of --preset, --model-json, --config or the shape)")
    src.add_argument("--preset", choices=sorted(PRESETS))
    src.add_argument("--model-json", type=Path, help="a model entry as JSON (config keys)")
    src.add_argument("--config", type=Path, help="study config; with --cell-index")
    src.add_argument("--cell-index", type=int, help="row of the config's sweep cells")
    for key in MODEL_KEYS:
        src.add_argument(f"--{key.replace('_', '-')}", type=str if key == "kind" else int)
    plan = p.add_argument_group("strategy (ParallelPlan; a degree of -1 takes the rest)")
    for dim in ("pp", "tp", "dp", "ep"):
        plan.add_argument(f"--{dim}", type=int, default=1)
    plan.add_argument("--dp-kind", choices=("ddp", "fsdp"), default="ddp")
    plan.add_argument("--mapping", default="pp-dp-ep-tp", help="mesh dims outer->inner")
    plan.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved-1f1b"), default="1f1b")
    plan.add_argument("--microbatches", type=int, help="default 8 with a preset, else 4")
    plan.add_argument("--stages-per-rank", type=int, default=1)
    plan.add_argument("--bucket-cap-mb", type=float, default=25.0)
    plan.add_argument("--no-reshard-after-forward", action="store_true")
    place = p.add_argument_group("placement")
    place.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node")
    place.add_argument("--nodes", type=int, help="default: world size / gpus per node")
    fw = p.add_argument_group("framework")
    fw.add_argument("--framework", choices=("torch", "megatron"), default="torch")
    for flag in ("recompute", "vocab-parallel", "tied-embeddings"):
        fw.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)
    fw.add_argument("--dtype-bytes", type=int, default=4, help="2 for fp16/bf16 training")
    out = p.add_argument_group("output")
    out.add_argument("--rank", type=int, default=0, help="rank whose traffic is printed")
    out.add_argument("--out", type=Path, help="write ops/summary/node_matrix parquet here")
    tm = p.add_argument_group("alpha-beta timing (printed when --flops-per-s is given)")
    tm.add_argument("--flops-per-s", type=float, help="achieved compute rate per rank")
    tm.add_argument("--alpha-s", type=float, default=10e-6)
    tm.add_argument("--beta-inter", type=float, default=12.5e9, help="B/s across nodes")
    tm.add_argument("--beta-intra", type=float, default=100e9, help="B/s inside a node")
    return p


def resolve_cell(args: argparse.Namespace) -> tuple[dict, dict, int, int]:
    """(model spec, plan spec, nodes, ranks per node) from the command line."""
    from commscope.workload.strategies import ParallelPlan

    if args.config is not None:
        from commscope.config import cells_frame, load_config, strategy_spec

        config = load_config(args.config)
        cells = cells_frame(config)
        if args.cell_index is None or not 0 <= args.cell_index < len(cells):
            raise SystemExit(f"--cell-index must be in 0..{len(cells) - 1}")
        cell = cells.iloc[args.cell_index]
        return (
            dict(config["models"][cell["model"]]),
            strategy_spec(config, cell["strategy"]),
            int(cell["nodes"]),
            int(cell["ranks_per_node"]),
        )
    if args.preset:
        model = dict(PRESETS[args.preset])
    elif args.model_json:
        model = json.loads(args.model_json.read_text())
    else:
        model = {}
    for key in MODEL_KEYS:
        value = getattr(args, key)
        if value is not None:
            model[key] = value
    plan = {
        "pp": args.pp,
        "tp": args.tp,
        "dp": args.dp,
        "ep": args.ep,
        "dp_kind": args.dp_kind,
        "mapping": args.mapping,
        "pp_schedule": args.schedule,
        "microbatches": args.microbatches
        or (PRESET_MICROBATCHES if args.preset else ParallelPlan.microbatches),
        "stages_per_rank": args.stages_per_rank,
        "bucket_cap_mb": args.bucket_cap_mb,
        "reshard_after_forward": not args.no_reshard_after_forward,
    }
    rpn = args.gpus_per_node
    if args.nodes is not None:
        nodes = args.nodes
    else:
        degrees = [args.pp, args.tp, args.dp, args.ep]
        if -1 in degrees:
            raise SystemExit("a degree of -1 needs --nodes to fix the world size")
        world = 1
        for d in degrees:
            world *= d
        if world % rpn:
            raise SystemExit(f"world size {world} is not a multiple of --gpus-per-node {rpn}")
        nodes = world // rpn
    return model, plan, nodes, rpn


def main(argv: list[str] | None = None) -> int:
    from commscope.predict.model import PredictOptions, node_matrix, predict_ops, summarize
    from commscope.predict.timing import predict_step_time

    args = build_parser().parse_args(argv)
    model, plan, nodes, rpn = resolve_cell(args)
    options = PredictOptions(
        framework=args.framework,
        recompute=args.recompute,
        vocab_parallel=args.vocab_parallel,
        tied_embeddings=args.tied_embeddings,
    )
    try:
        pred = predict_ops(model, plan, nodes, rpn, args.dtype_bytes, options)
    except ValueError as err:
        print(f"commscope predict: {err}", file=sys.stderr)
        return 2
    meta = pred.attrs["predict"]
    resolved = meta["plan"]
    world = nodes * rpn
    print(
        f"model {json.dumps(model)}\n"
        f"plan pp={resolved['pp']} tp={resolved['tp']} dp={resolved['dp']} ep={resolved['ep']} "
        f"({resolved['dp_kind']}) mapping={resolved['mapping']} "
        f"schedule={resolved['pp_schedule']} m={meta['microbatches']} on {world} ranks = "
        f"{nodes} nodes x {rpn}; framework {args.framework}, {args.dtype_bytes}-byte dtype"
    )
    summary = summarize(pred)
    mine = summary[summary["rank"] == args.rank]
    if mine.empty:
        print(f"rank {args.rank}: no communication")
    else:
        print(f"\nrank {args.rank} (node {args.rank // rpn}), one step:")
        table = pd.DataFrame(
            {
                "traffic": mine["traffic"],
                "volume": [_bytes_text(b) for b in mine["bytes"]],
                "messages": mine["messages"],
                "sent (ring)": [_bytes_text(b) for b in mine["sent_bytes"]],
                "message sizes (B x count)": mine["sizes"],
            }
        )
        print(table.to_string(index=False))
    nodes_long = node_matrix(pred)
    mat = nodes_long.pivot(index="src_node", columns="dst_node", values="bytes")
    top = float(mat.to_numpy().max()) if mat.size else 0.0
    unit, scale = next(
        ((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if top >= s), ("B", 1.0)
    )
    print(f"\nnode x node bytes sent per step, {unit} (row = source; diagonal: inside a node):")
    print(mat.div(scale).round(3).to_string())
    if args.flops_per_s:
        t = predict_step_time(
            pred, args.flops_per_s, args.alpha_s, args.beta_inter, args.beta_intra
        )
        comm = ", ".join(f"{k} {v:.4g}" for k, v in t["comm_by_traffic_s"].items() if v)
        print(
            f"\nstep time {t['step_time_s']:.4g} s (slowest rank {t['critical_rank']}): "
            f"compute {t['compute_s']:.4g} s, communication {t['comm_s']:.4g} s ({comm}), "
            f"bubble {t['bubble_s']:.4g} s\ncommunication ratio {t['comm_ratio']:.3f}, "
            f"bubble ratio {t['bubble_ratio']:.3f} (analytical "
            f"{t['bubble_ratio_analytical']:.3f})"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        pred.attrs = {}  # parquet stores attrs as JSON, and the FLOPs dict has int keys
        pred.to_parquet(args.out / "ops.parquet", index=False)
        summary.to_parquet(args.out / "summary.parquet", index=False)
        nodes_long.to_parquet(args.out / "node_matrix.parquet", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
