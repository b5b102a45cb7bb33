"""``commscope predict``: per-rank traffic, node x node matrix and step time, analytically.

Examples::

    # Seed 002's GPT-3B on 32 GPUs, (p, t, d) = (4, 2, 4), DeepSpeed's default mapping
    # (a preset trains in fp16, as the paper: --dtype-bytes 4 for fp32)
    commscope predict --preset gpt-3b --pp 4 --tp 2 --dp 4 --gpus-per-node 8 \\
        --mapping pp-dp-tp --framework megatron --rank 0
    # ... and its customized mapping (DP across nodes), tables and heatmap written to a folder
    commscope predict --preset gpt-3b --pp 4 --tp 2 --dp 4 --mapping dp-pp-tp \\
        --framework megatron --out results/predictions/gpt-3b-custom
    # 16,384 GPUs: the node x node matrix is summarized (top pairs, inside vs across nodes)
    commscope predict --preset gpt-3b --pp 4 --tp 2 --dp 2048 --framework megatron
    # a named scenario of a study config's ``predictions:``
    commscope predict --config config/config.yaml --scenario gpt-3b-32gpu-default
    # a cell of a study config, as commscope's trainer would run it
    commscope predict --config config/config.yaml --cell-index 3

Nothing is launched: the prediction is pure arithmetic over the plan (see
:mod:`commscope.predict.ops`; one rank per role is emulated, :mod:`commscope.predict.roles`), so
clusters far larger than any we have take seconds. The flags make a scenario
(:mod:`commscope.predict.scenarios`). The terminal gets one rank's traffic, the whole job per
traffic type and the node x node matrix summarized: inside vs across nodes, the busiest node's
egress and the ``--top`` node pairs (the whole grid too up to 8 nodes). ``--out`` writes the
whole matrix and the same files as the workflow's ``predict_scenario`` and ``scenario_heatmap``
rules, plus the ops.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.config import cells_frame, load_config, read_yaml, strategy_spec
from commscope.predict.matrix import node_matrix_summary
from commscope.predict.ops import FP32_BYTES
from commscope.predict.scenarios import (
    PRESET_DTYPE_BYTES,
    PRESETS,
    ScenarioPrediction,
    predict_scenario,
    write_scenario,
)
from commscope.predict.timing import predict_step_time
from commscope.units import fmt_bytes, si_byte_unit

MODEL_KEYS = ("kind", "layers", "hidden", "heads", "seq", "vocab", "batch", "ffn_mult")
# Up to this many nodes the terminal gets the whole node x node grid as well as its summary.
GRID_MAX_NODES = 8


def _bytes_text(n: float) -> str:
    return fmt_bytes(n, digits=3)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="commscope predict",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group(
        "model (one of --preset, --model-json, --config or the shape; shape flags override)"
    )
    src.add_argument("--preset", choices=sorted(PRESETS))
    src.add_argument("--model-json", type=Path, help="a model entry as JSON (config keys)")
    src.add_argument("--config", type=Path, help="study config; with --cell-index or --scenario")
    src.add_argument("--cell-index", type=int, help="row of the config's sweep cells")
    src.add_argument("--scenario", help="name of an entry of the config's predictions:")
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
    plan.add_argument(
        "--bucket-cap-mb",
        type=float,
        help="DDP's bucket_cap_mb, capping every bucket; default: DDP built without it "
        "(PyTorch's 25 MiB buckets, the first 1 MiB)",
    )
    plan.add_argument("--no-reshard-after-forward", action="store_true")
    place = p.add_argument_group("placement")
    place.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node")
    place.add_argument("--nodes", type=int, help="default: world size / gpus per node")
    fw = p.add_argument_group("framework")
    fw.add_argument("--framework", choices=("torch", "megatron"), default="torch")
    for flag in ("recompute", "vocab-parallel", "tied-embeddings"):
        fw.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)
    fw.add_argument(
        "--dtype-bytes",
        type=int,
        help=f"bytes per element; default {PRESET_DTYPE_BYTES} (fp16, seed 002's precision) with "
        f"a --preset, else {FP32_BYTES} (fp32, as commscope's trainer); with --scenario it "
        "replaces the scenario's",
    )
    out = p.add_argument_group("output")
    out.add_argument("--rank", type=int, default=0, help="rank whose traffic is printed")
    out.add_argument(
        "--top", type=int, default=10, help="node pairs listed, most bytes across nodes first"
    )
    out.add_argument(
        "--out",
        type=Path,
        help="write traffic/node_matrix/rank_matrix/ops parquet, scenario.json and "
        "heatmap.png here",
    )
    tm = p.add_argument_group("alpha-beta timing (printed when --flops-per-s is given)")
    tm.add_argument("--flops-per-s", type=float, help="achieved compute rate per rank")
    tm.add_argument("--alpha-s", type=float, default=10e-6)
    tm.add_argument("--beta-inter", type=float, default=12.5e9, help="B/s across nodes")
    tm.add_argument("--beta-intra", type=float, default=100e9, help="B/s inside a node")
    return p


def _framework_spec(args: argparse.Namespace, default_dtype_bytes: int) -> dict[str, Any]:
    return {
        "framework": args.framework,
        "recompute": args.recompute,
        "vocab_parallel": args.vocab_parallel,
        "tied_embeddings": args.tied_embeddings,
        "dtype_bytes": default_dtype_bytes if args.dtype_bytes is None else args.dtype_bytes,
    }


def scenario_spec(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(name, scenario spec) from the command line: a config's named scenario, a config's
    sweep cell, or the model and plan flags."""
    if args.config is not None and args.scenario is not None:
        # Read as written: the scenario's keys are checked by resolve_scenario, and a config
        # whose schema predates predictions: still gives its scenarios to the CLI.
        scenarios = read_yaml(args.config).get("predictions") or {}
        if args.scenario not in scenarios:
            raise SystemExit(
                f"--scenario {args.scenario!r} is not in {args.config}'s predictions: "
                f"{sorted(scenarios)}"
            )
        spec = dict(scenarios[args.scenario])
        if args.dtype_bytes is not None:
            spec["dtype_bytes"] = args.dtype_bytes
        return args.scenario, spec
    if args.config is not None:
        config = load_config(args.config)
        cells = cells_frame(config)
        if args.cell_index is None or not 0 <= args.cell_index < len(cells):
            raise SystemExit(f"--cell-index must be in 0..{len(cells) - 1} (or use --scenario)")
        cell = cells.iloc[args.cell_index]
        return f"cell {args.cell_index}", {
            "model": dict(config["models"][cell["model"]]),
            **strategy_spec(config, cell["strategy"]),
            "nodes": int(cell["nodes"]),
            "gpus_per_node": int(cell["ranks_per_node"]),
            **_framework_spec(args, FP32_BYTES),  # the cells train in fp32
        }
    model: dict[str, Any] = json.loads(args.model_json.read_text()) if args.model_json else {}
    for key in MODEL_KEYS:
        value = getattr(args, key)
        if value is not None:
            model[key] = value
    spec = {
        "preset": args.preset,
        "model": model or None,
        "pp": args.pp,
        "tp": args.tp,
        "dp": args.dp,
        "ep": args.ep,
        "dp_kind": args.dp_kind,
        "mapping": args.mapping,
        "pp_schedule": args.schedule,
        "microbatches": args.microbatches,
        "stages_per_rank": args.stages_per_rank,
        "bucket_cap_mb": args.bucket_cap_mb,
        "reshard_after_forward": not args.no_reshard_after_forward,
        "gpus_per_node": args.gpus_per_node,
        "nodes": args.nodes,
        # A preset is one of seed 002's setups: its precision (fp16) unless told otherwise.
        **_framework_spec(args, PRESET_DTYPE_BYTES if args.preset else FP32_BYTES),
    }
    return args.preset or "cli", spec


def _print_header(result: ScenarioPrediction) -> None:
    sc, plan = result.scenario, result.scenario.plan
    meta = result.step.meta
    print(
        f"model {json.dumps(sc.model)}\n"
        f"plan pp={plan.pp} tp={plan.tp} dp={plan.dp} ep={plan.ep} ({plan.dp_kind}) "
        f"mapping={plan.mapping} schedule={plan.pp_schedule} m={meta['microbatches']} on "
        f"{sc.world_size} ranks = {sc.nodes} nodes x {sc.gpus_per_node}; framework "
        f"{sc.options.framework}, {sc.dtype_bytes}-byte dtype; predicted in "
        f"{result.seconds:.2f} s"
    )


def _print_rank(result: ScenarioPrediction, rank: int) -> None:
    """One rank's traffic per type: volume, messages, ring-model bytes sent, message sizes."""
    mine = result.traffic[result.traffic["rank"] == rank]
    if mine.empty:
        print(f"rank {rank}: no communication")
        return
    print(f"\nrank {rank} (node {rank // result.scenario.gpus_per_node}), one step:")
    table = pd.DataFrame(
        {
            "traffic": mine["traffic"],
            "volume": [_bytes_text(b) for b in mine["bytes"]],
            "messages": mine["messages"],
            "sent (ring)": [_bytes_text(b) for b in mine["sent_bytes"]],
            "of which inter-node": [_bytes_text(b) for b in mine["inter_node_bytes"]],
            "message sizes (B x count)": mine["sizes"],
        }
    )
    print(table.to_string(index=False))


def _print_job(result: ScenarioPrediction, top: int) -> None:
    """The whole job per traffic type, then the node x node matrix (:func:`_print_nodes`)."""
    job = result.table()
    print("\nwhole job, one step (sent = ring-model bytes on the links):")
    print(
        pd.DataFrame(
            {
                "traffic": job["traffic"],
                "messages": job["messages"],
                "volume": [_bytes_text(b) for b in job["bytes"]],
                "sent": [_bytes_text(b) for b in job["sent_bytes"]],
                "intra-node": [_bytes_text(b) for b in job["intra_node_bytes"]],
                "inter-node": [_bytes_text(b) for b in job["inter_node_bytes"]],
                "inter share": [f"{x:.1%}" if x == x else "-" for x in job["inter_node_share"]],
            }
        ).to_string(index=False)
    )
    _print_nodes(result, top)


def _print_nodes(result: ScenarioPrediction, top: int) -> None:
    """The node x node matrix in a few lines: inside vs across nodes, the busiest egress, the
    ``top`` pairs across nodes per traffic type; the whole grid too when it is small."""
    nodes = result.scenario.nodes
    summary = node_matrix_summary(result.node_pairs(), top)
    every = summary.split.set_index("traffic").loc["all"]
    share = every["inter_node_share"]
    print(
        f"\nnode x node bytes sent per step: {nodes} nodes x {result.scenario.gpus_per_node} "
        f"GPUs; {summary.pairs:,} of {nodes * (nodes - 1):,} ordered node pairs exchange "
        f"bytes across the network\n  inside nodes {_bytes_text(every['intra_node_bytes'])}, "
        f"across nodes {_bytes_text(every['inter_node_bytes'])}"
        + (f" ({share:.2%} of the sent bytes)" if share == share else "")
    )
    if summary.busiest_node >= 0:
        print(
            f"  busiest node across the network: node {summary.busiest_node} sends "
            f"{_bytes_text(summary.busiest_egress)} to other nodes"
        )
        pairs = summary.top_pairs
        kinds = [c for c in pairs.columns if c not in ("src_node", "dst_node", "all")]
        table = pd.DataFrame(
            {
                "src node": pairs["src_node"],
                "dst node": pairs["dst_node"],
                "bytes": [_bytes_text(b) for b in pairs["all"]],
                **{k: [_bytes_text(b) if b else "-" for b in pairs[k]] for k in kinds},
            }
        )
        shown = "all" if len(pairs) == summary.pairs else f"top {len(pairs)}"
        print(f"  node pairs across nodes, {shown} by bytes:")
        print("  " + table.to_string(index=False).replace("\n", "\n  "))
    if nodes <= GRID_MAX_NODES:
        mat = result.node_matrix.pivot_table(
            index="src_node", columns="dst_node", values="bytes", aggfunc="sum"
        )
        unit, scale = si_byte_unit(float(mat.to_numpy().max()) if mat.size else 0.0)
        print(f"\nnode x node, {unit} (row = source; diagonal: inside a node):")
        print(mat.div(scale).round(3).to_string())


def _print_step_time(pred: pd.DataFrame, args: argparse.Namespace) -> None:
    """The alpha-beta step time at the flags' compute rate and bandwidths."""
    t = predict_step_time(pred, args.flops_per_s, args.alpha_s, args.beta_inter, args.beta_intra)
    comm = ", ".join(f"{k} {v:.4g}" for k, v in t["comm_by_traffic_s"].items() if v)
    print(
        f"\nstep time {t['step_time_s']:.4g} s (slowest rank {t['critical_rank']}): "
        f"compute {t['compute_s']:.4g} s, communication {t['comm_s']:.4g} s ({comm}), "
        f"bubble {t['bubble_s']:.4g} s\ncommunication ratio {t['comm_ratio']:.3f}, "
        f"bubble ratio {t['bubble_ratio']:.3f} (analytical "
        f"{t['bubble_ratio_analytical']:.3f})"
    )


HeatmapWriter = Callable[[pd.DataFrame, Path], Any]


def _write_out(result: ScenarioPrediction, out: Path, draw_heatmap: HeatmapWriter | None) -> None:
    """The scenario's tables, its ops and (with ``draw_heatmap``) the node x node heatmap,
    into ``out``."""
    write_scenario(result, out)
    ops = result.ops.copy()
    ops.attrs = {}  # parquet stores attrs as JSON, and the FLOPs dict has int keys
    ops.to_parquet(out / "ops.parquet", index=False)
    written = "tables, ops and scenario.json"
    if draw_heatmap is not None:
        draw_heatmap(result.node_matrix, out / "heatmap.png")
        written = "tables, ops, scenario.json and heatmap.png"
    print(f"\nwrote {out}/: {written}")


def main(argv: list[str] | None = None, draw_heatmap: HeatmapWriter | None = None) -> int:
    """``commscope predict``: print the prediction of one scenario; with ``--out`` write its
    tables there, and the node x node heatmap when the caller passes ``draw_heatmap`` (plots
    sit above predict in the layers, so the top-level ``commscope`` command hands it in)."""
    args = build_parser().parse_args(argv)
    name, spec = scenario_spec(args)
    try:
        result = predict_scenario(spec, name)
    except ValueError as err:
        print(f"commscope predict: {err}", file=sys.stderr)
        return 2
    _print_header(result)
    _print_rank(result, args.rank)
    _print_job(result, args.top)
    if args.flops_per_s:
        _print_step_time(result.ops, args)
    if args.out is not None:
        _write_out(result, args.out, draw_heatmap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
