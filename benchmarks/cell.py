"""A cell's fixed cost, phase by phase: `python benchmarks/cell.py` (as root).

Runs the default study's 2-node DDP cell (config/config.yaml: gpt-tiny, 2 nodes x 1 rank,
unshaped, 6 steps of which run.warmup_steps are warm-up) ``--repeats`` times, the way the
``run_cell`` rule runs it (``provision_and_run``: cluster check, lock, SSH, prepare, shape,
probes, training, stop, unshape, fetch), on a throwaway netns cluster of its own (csbn, on
subnets no study uses). The first run brings the cluster up and is not counted.

Every phase is read from the marks the run leaves (run.json ``timeline_ns`` on the orchestrator,
rank{R}.json ``timeline_ns`` and the steps table on the ranks), so the phases add up to the
cell's wall time:

- job start: a fresh interpreter importing what the run_cell script imports (measured apart;
  Snakemake's own dispatch of a job is not in it);
- provision check, SSH: ``provision_and_run`` up to ``_measure`` (cluster up? connections);
- prepare (run dirs, spec upload, wire object check), shape, probe start (samplers, BPF,
  clock probes);
- process start and imports: launch until the last rank entered its training code;
- rendezvous (init_process_group), model build (Trainer + barrier), warm-up steps,
  measured steps, wrap-up (barrier, traces written, process group destroyed);
- exit: the last rank's end until every node's launcher returned;
- probe stop (+ clock probes), unshape, fetch, cleanup (kill by tag, close SSH).

Fixed cost = everything but the measured steps. Beside each phase: the SSH commands the
orchestrator ran in it (count and their summed wall time, over all nodes; the clock probe's
channel is not counted). ``--json PATH`` writes every run's phases.
docs/performance.md has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from commscope.cluster.hosts import Host
from commscope.cluster.provision import state_dir
from commscope.config import load_config, strategy_spec
from commscope.experiment.cell import provision_and_run
from commscope.experiment.launch import training_workload
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {
    "backend": "netns",
    "name": "csbn",
    "mgmt_subnet": "198.18.210.0/24",
    "exp_subnet": "198.19.210.0/24",
}
# What workflow/scripts/run_cell.py imports before it runs anything.
SCRIPT_IMPORTS = (
    "import commscope.experiment.cell, commscope.experiment.launch, commscope.logs, "
    "commscope.spec.settings"
)
PHASES = (
    "job start",
    "provision check, SSH",
    "prepare",
    "shape",
    "probe start",
    "process start, imports",
    "rendezvous",
    "model build",
    "warm-up steps",
    "measured steps",
    "wrap-up",
    "exit",
    "probe stop",
    "unshape",
    "fetch",
    "cleanup",
)


SSH_CALLS: list[tuple[int, int]] = []  # (start, end) in ns of every Host.run/put/get/fetch_tree


def _count_ssh() -> None:
    """Wrap Host's SSH calls to record when each ran."""
    for name in ("run", "put", "get", "fetch_tree"):
        inner = getattr(Host, name)

        def timed(self: Host, *a: object, _inner=inner, **kw: object) -> object:
            t0 = time.time_ns()
            try:
                return _inner(self, *a, **kw)
            finally:
                SSH_CALLS.append((t0, time.time_ns()))

        setattr(Host, name, timed)


def job_start_s() -> float:
    """Wall time of a fresh interpreter importing the run_cell script's modules."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", SCRIPT_IMPORTS], check=True)
    return time.perf_counter() - t0


def phases(raw: Path, t_call_ns: int, t_return_ns: int, warmup: int) -> dict[str, float]:
    """The phases of one run (seconds) from its raw directory's marks."""
    run = json.loads((raw / "run.json").read_text())
    m = run["timeline_ns"]
    ranks = [json.loads(p.read_text()) for p in raw.glob("node*/rank*.json")]
    r = {k: [x["timeline_ns"][k] for x in ranks] for k in ranks[0]["timeline_ns"]}
    steps = pd.concat(pd.read_parquet(p) for p in raw.glob("node*/steps_rank*.parquet"))
    steps = steps[steps["phase"] == "step"]
    warm_end = int(steps[steps["step"] < warmup]["t_end_ns"].max()) if warmup else max(r["built"])
    last_step = int(steps["t_end_ns"].max())
    marks = [
        ("provision check, SSH", t_call_ns, m["begun"]),
        ("prepare", m["begun"], m["prepared"]),
        ("shape", m["prepared"], m["shaped"]),
        ("probe start", m["shaped"], m["launched"]),
        ("process start, imports", m["launched"], max(r["started"])),
        ("rendezvous", max(r["started"]), max(r["joined"])),
        ("model build", max(r["joined"]), max(r["built"])),
        ("warm-up steps", max(r["built"]), warm_end),
        ("measured steps", warm_end, last_step),
        ("wrap-up", last_step, max(r["closed"])),
        ("exit", max(r["closed"]), m["ended"]),
        ("probe stop", m["ended"], m["probes_stopped"]),
        ("unshape", m["probes_stopped"], m["unshaped"]),
        ("fetch", m["unshaped"], m["fetched"]),
        ("cleanup", m["fetched"], t_return_ns),
    ]
    out = {name: (b - a) / 1e9 for name, a, b in marks}
    for name, a, b in marks:
        calls = [(t0, t1) for t0, t1 in SSH_CALLS if a <= t0 < b]
        out[f"{name} ssh"] = len(calls)
        out[f"{name} ssh_s"] = sum(t1 - t0 for t0, t1 in calls) / 1e9
    return out


def main() -> None:
    """Run the cell, print the phase table (median over the counted runs)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="counted runs (after one warm-up run)")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--launcher", choices=("warm", "torchrun"), default=None,
                    help="run.launcher (default: the config's)")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="leave the cluster up afterwards")
    ap.add_argument("--json", type=Path, help="write every run's phases here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, one sshd per node)")
    cfg = load_config(args.config)
    run = RunSettings.from_mapping(
        {**cfg["run"], **({"launcher": args.launcher} if args.launcher else {})}
    )
    cell = CellSettings(
        strategy=args.strategy, model="gpt-tiny", nodes=2, ranks_per_node=1, bw="none",
        delay="0ms", jitter="0ms", loss="0pct", cc="cubic", steps=6, repeat=0,
    )  # fmt: skip
    workload = training_workload(
        cell, cfg["models"]["gpt-tiny"], strategy_spec(cfg, args.strategy), run
    )
    cluster_cfg = ClusterSettings.from_mapping({**cfg["cluster"], **CLUSTER})
    _count_ssh()
    rows = []
    with tempfile.TemporaryDirectory(prefix="csbench-") as tmp:
        root = Path(tmp)
        try:
            for i in range(args.repeats + 1):
                raw = root / f"run{i}" / "raw"
                t0 = time.time_ns()
                provision_and_run(cluster_cfg, cell, workload, run, raw, root=root)
                t1 = time.time_ns()
                row = {"job start": job_start_s(), **phases(raw, t0, t1, run.warmup_steps)}
                SSH_CALLS.clear()
                row["cell wall"] = (t1 - t0) / 1e9 + row["job start"]
                print(f"run {i}{' (cluster start, not counted)' if i == 0 else ''}: "
                      f"{row['cell wall']:.2f} s", flush=True)  # fmt: skip
                if i:
                    rows.append(row)
        finally:
            if not args.keep:
                from commscope.cluster.teardown import teardown_netns

                teardown_netns(CLUSTER["name"], state_dir(cluster_cfg, root))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(
        f"\n{cell.strategy} cell, launcher {run.launcher}, {len(rows)} runs, median seconds per "
        f"phase (load average {os.getloadavg()[0]:.2f}):"
    )
    print(f"  {'phase':24s} {'s':>7s}   SSH commands (all nodes), their summed s")
    for name in PHASES:
        n, t = med.get(f"{name} ssh"), med.get(f"{name} ssh_s")
        ssh = f"{n:5.0f}  {t:6.3f}" if n is not None else ""
        print(f"  {name:24s} {med[name]:7.3f}   {ssh}")
    fixed = sum(med[p] for p in PHASES if p != "measured steps")
    print(f"  {'cell wall (sum)':24s} {sum(med[p] for p in PHASES):7.3f}")
    print(f"  {'fixed cost':24s} {fixed:7.3f}   (all but the measured steps)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
