"""The largest replay this machine runs: `python benchmarks/replay.py` (root: it builds its own
netns cluster, ``csd5b`` on 198.18.251.0/24 and 198.19.251.0/24 unless told).

A predicted seed-002 scenario (default: GPT-3B on 32 GPUs, (p, t, d) = (4, 2, 4), DeepSpeed's
default mapping, config/config.yaml's ``gpt-3b-32gpu-default``) scaled by ``--scale`` and
replayed on the scenario's own placement (``--nodes`` x ``--ranks-per-node``, 4 x 8 by default)
as the workflow runs a replay cell: the program built (replay.cell.build_cell_program), the
cell run (experiment.cell.run_cell, unshaped), parsed and its metrics computed. Printed: ranks,
ops and bytes per step (the program's payload, and on the wire between nodes: matrix_check's
payload less framing per measured step), the wire's node x node matrix against the
prediction's (gloo's algorithms) x scale (less the bytes of a neighbouring step's ops that the
cross-validation window holds), the median step, and the wall time of each phase
(build, the cell from launch to fetched traces, parse, metrics). ``--json PATH`` keeps the
numbers; ``--keep DIR`` keeps the cell's files.

Heavy: 32 ranks on this 2-core machine; the cell's wall time is most of the run. Run nothing
else meanwhile.

Measured here (2026-11-24, 2 cores, unshaped; ops and payload per step over all ranks, wire:
frames between nodes; every run op for op as its program, crosscheck and matrix_check passing,
each node pair within 0.7 % of the prediction x scale):

    ranks  nodes  scenario            scale  ops/step  payload/step  wire/step  step    cell
    32     4 x 8  GPT-3B (4, 2, 4)    1e-4   21,872    0.29 GB       5.9 MB     11.5 s  34 s
    32     4 x 8  GPT-3B (4, 2, 4)    1e-3   21,872    2.86 GB       57 MB      12.8 s  36 s
    32     4 x 8  GPT-3B (4, 2, 4)    1e-2   21,872    28.6 GB       552 MB     31.7 s  74 s
    64     8 x 8  GPT-3B (4, 2, 8)    1e-4   43,744    0.57 GB       13.8 MB    39.8 s  102 s

(``--set dp=8 --nodes 8`` for the last.) The step is per-op latency bound up to 1e-3 (some 680
ops a rank, most of them on loopback inside a node); the 64-rank cell loads the machine to a
load average of ~75.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cell.parse import build_cell_tables, cell_table_paths
from commscope.cluster.netns import provision_netns
from commscope.cluster.teardown import teardown_netns
from commscope.collectives.traffic import op_sends
from commscope.config import filled_cell, read_yaml
from commscope.experiment.cell import run_cell
from commscope.metrics import step_times
from commscope.metrics.crosscheck import CROSSCHECK_FLOOR_BYTES_PER_STEP, CROSSCHECK_TOLERANCE
from commscope.metrics.io import compute_cell_metrics
from commscope.predict.matrix import step_rank_matrix
from commscope.predict.ops import predict_step
from commscope.predict.scenarios import resolve_scenario
from commscope.replay import program_bytes
from commscope.replay.cell import build_cell_program, compare_program, replay_workload
from commscope.spec.settings import CellSettings, RunSettings

ROOT = Path(__file__).resolve().parents[1]


def predicted_node_matrix(spec: dict[str, Any], name: str) -> pd.Series:
    """Bytes per (src_node, dst_node), src != dst, of the scenario's step under gloo."""
    sc = resolve_scenario(spec, name)
    step = predict_step(
        sc.model, sc.plan, sc.nodes, sc.gpus_per_node, sc.dtype_bytes, sc.options, "gloo"
    )
    ranks = step_rank_matrix(step)
    between = ranks[ranks["src_node"] != ranks["dst_node"]]
    return between.groupby(["src_node", "dst_node"])["bytes"].sum()


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build, run, parse and check one replay cell in ``work``; returns the numbers."""
    config = read_yaml(ROOT / "config" / "config.yaml")
    spec = {**config["predictions"][args.scenario], **dict(args.set)}
    name = f"{args.scenario}-x{args.scale:g}"
    values = filled_cell(
        {"strategy": "replay", "model": name, "nodes": args.nodes,
         "ranks_per_node": args.ranks_per_node, "bw": "none", "steps": args.steps}
    )  # fmt: skip
    entry = {"source": {"prediction": args.scenario}, "scale": args.scale}
    run_settings = RunSettings.from_mapping(
        {**config["run"], "warmup_steps": args.warmup, "timeout_s": args.timeout,
         "master_port": 29591}
    )  # fmt: skip
    out: dict[str, Any] = {
        "scenario": args.scenario, "overrides": dict(args.set), "scale": args.scale,
        "steps": args.steps,
    }  # fmt: skip
    t0 = time.perf_counter()
    program = build_cell_program(
        cell=values, replay=entry, scenario=spec, source={}, warmup_steps=args.warmup,
        cluster={"backend": "netns"}, out_program=work / "program.parquet",
        out_meta=work / "replay.json",
    ).table  # fmt: skip
    out["build_s"] = time.perf_counter() - t0
    per = program_bytes(program)
    out["ranks"] = int(program["rank"].nunique())
    out["ops_per_step"] = int(per[per["step"] == 0]["ops"].sum())
    out["program_bytes_per_step"] = int(per[per["step"] == 0]["bytes"].sum())

    t0 = time.perf_counter()
    cluster = provision_netns(
        args.cluster, args.nodes, work / "cluster",
        mgmt_subnet=f"198.18.{args.octet}.0/24", exp_subnet=f"198.19.{args.octet}.0/24",
    )  # fmt: skip
    out["provision_s"] = time.perf_counter() - t0
    try:
        cell = CellSettings.from_mapping(values)
        workload = replay_workload(work / "program.parquet", work / "replay.json", run_settings)
        t0 = time.perf_counter()
        raw = run_cell(cluster, cell, workload, run_settings, work / "raw")
        out["cell_wall_s"] = time.perf_counter() - t0
    finally:
        if not args.keep_cluster:
            teardown_netns(args.cluster, work / "cluster")
    t0 = time.perf_counter()
    tables = build_cell_tables(raw, cell, args.warmup, cell_table_paths(work / "trace"))
    out["parse_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compute_cell_metrics(work / "trace", work / "metrics")
    out["metrics_s"] = time.perf_counter() - t0

    ops = pd.read_parquet(tables["ops"])
    compare = compare_program(program, ops, args.warmup)
    out["exact"] = bool((compare["match"] & compare["sizes_match"]).all())
    steps = step_times(pd.read_parquet(tables["steps"]), args.warmup)
    out["step_s"] = float(steps[~steps["warmup"].astype(bool)]["duration_s"].median())
    check = pd.read_parquet(work / "metrics" / "crosscheck.parquet")
    out["crosscheck_passed"] = f"{int(check['passed'].sum())}/{len(check)}"
    matrix = pd.read_parquet(work / "metrics" / "matrix_check.parquet")
    n = int(matrix["measured_steps"].iloc[0])
    pairs = matrix.set_index(["src_node", "dst_node"])
    # The window also holds a neighbouring step's last ops whose last member issued them
    # inside it (the embedding all-reduces that end a step): their modelled bytes (the
    # window's framework bytes less the measured steps' own) are taken off the wire's.
    steady = ops[ops["step"] >= args.warmup]
    sends = op_sends(steady, backend="gloo")
    sends = sends.assign(
        src_node=sends["rank"] // args.ranks_per_node,
        dst_node=sends["dst_rank"] // args.ranks_per_node,
    )
    own = sends.groupby(["src_node", "dst_node"])["bytes"].sum().reindex(pairs.index).fillna(0)
    edge = pairs["framework_bytes"] - own
    out["window_edge_bytes"] = float(edge.sum())
    wire = (pairs["wire_payload_bytes"] - pairs["protocol_bytes"] - edge) / n
    want = predicted_node_matrix(spec, args.scenario).reindex(wire.index).fillna(0) * args.scale
    allowed = (CROSSCHECK_TOLERANCE * want).clip(lower=CROSSCHECK_FLOOR_BYTES_PER_STEP)
    out["wire_bytes_per_step"] = float(pairs["wire_bytes"].sum() / n)
    out["wire_payload_per_step"] = float(wire.sum())
    out["predicted_internode_per_step"] = float(want.sum())
    out["matrix"] = [
        {"src": int(s), "dst": int(d), "predicted": float(want[(s, d)]), "wire": float(w),
         "within_tolerance": bool(abs(w - want[(s, d)]) <= allowed[(s, d)])}
        for (s, d), w in wire.items()
    ]  # fmt: skip
    out["matrix_check_passed"] = f"{int(matrix['passed'].sum())}/{len(matrix)}"
    return out


def _override(text: str) -> tuple[str, int]:
    key, _, value = text.partition("=")
    return key.strip(), int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="gpt-3b-32gpu-default")
    parser.add_argument(
        "--set", type=_override, action="append", default=[], metavar="KEY=INT",
        help="override a scenario key, e.g. --set dp=8 (with --nodes 8: GPT-3B on 64 ranks)",
    )  # fmt: skip
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--scale", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--cluster", default="csd5b")
    parser.add_argument("--octet", type=int, default=251)
    parser.add_argument("--keep", type=Path, help="keep the cell's files here")
    parser.add_argument("--keep-cluster", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    try:
        out = run(args, work)
    finally:
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    m = out.pop("matrix")
    print(json.dumps(out, indent=1))
    for row in m:
        err = row["wire"] / row["predicted"] - 1 if row["predicted"] else float("nan")
        flag = "" if row["within_tolerance"] else " OUTSIDE the tolerance"
        print(f"node {row['src']} -> {row['dst']}: predicted x scale {row['predicted']:.0f} B, "
              f"wire {row['wire']:.0f} B/step ({err:+.2%}){flag}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({**out, "matrix": m}, indent=1))


if __name__ == "__main__":
    main()
