"""How long `commscope predict` takes as the cluster grows: `python benchmarks/predict.py`.

Seed 002's GPT-3B under Megatron/DeepSpeed PTD-P (fp16, recomputation, vocab-parallel
embedding, m = 8 micro-batches) with (p, t) = (4, 2) and the data-parallel degree scaled, 8 GPUs
per node, DeepSpeed's default mapping (pp-dp-tp):

    GPUs     (p, t, d)     nodes
    32       (4, 2, 4)     4       the paper's Fig. 3 / Table 3 setting
    1,024    (4, 2, 128)   128
    16,384   (4, 2, 2048)  2,048

For each size, three fresh processes, so each peak memory is its own:

- ``function``: the in-process functions, best of ``--repeat``: ``plan``
  (:func:`~commscope.predict.scenarios.resolve_scenario`), ``ops`` (the per-rank op table,
  :func:`~commscope.predict.ops.predict_ops`, as cells and exports use it), ``scenario``
  (:func:`~commscope.predict.scenarios.predict_scenario`: ops, per-rank traffic, rank and node
  matrices; its own phase split where it records one), ``print`` (what ``commscope predict``
  in-process takes beyond the prediction it reports in its header: the terminal output);
- ``cli``: ``python -m commscope.cli predict ...`` as a user runs it (wall time, imports
  included);
- ``cli --out``: the same writing every table, the ops and the heatmap to a temporary folder.

Peak memory is the child's maximum resident set (``wait4``). ``--sizes 32,1024`` picks sizes,
``--timeout`` gives up on a child (reported as such). ``--json PATH`` keeps the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLANS = {32: (4, 2, 4), 1024: (4, 2, 128), 16384: (4, 2, 2048)}
GPUS_PER_NODE = 8


def cli_args(gpus: int) -> list[str]:
    """The `commscope predict` flags of one benchmark size."""
    p, t, d = PLANS[gpus]
    return [
        *("--preset", "gpt-3b", "--pp", str(p), "--tp", str(t), "--dp", str(d)),
        *("--gpus-per-node", str(GPUS_PER_NODE), "--mapping", "pp-dp-tp"),
        *("--framework", "megatron", "--dtype-bytes", "2"),
    ]


def scenario_spec(gpus: int) -> dict[str, Any]:
    """The same scenario as a spec of :func:`predict_scenario`."""
    p, t, d = PLANS[gpus]
    return {
        "preset": "gpt-3b",
        "pp": p,
        "tp": t,
        "dp": d,
        "gpus_per_node": GPUS_PER_NODE,
        "mapping": "pp-dp-tp",
        "framework": "megatron",
        "dtype_bytes": 2,
    }


def _best(times: list[dict[str, float]]) -> dict[str, float]:
    return {k: min(t[k] for t in times) for k in times[0]}


def run_functions(gpus: int, repeat: int) -> dict[str, Any]:
    """The in-process phases (child process): best of ``repeat`` each."""
    t0 = time.perf_counter()
    from commscope.predict import cli
    from commscope.predict.ops import predict_ops
    from commscope.predict.scenarios import predict_scenario, resolve_scenario

    imports = time.perf_counter() - t0
    spec = scenario_spec(gpus)
    runs = []
    phases: dict[str, float] = {}
    rows = 0
    for _ in range(repeat):
        t = {}
        t0 = time.perf_counter()
        sc = resolve_scenario(spec, "bench")
        t["plan"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ops = predict_ops(sc.model, sc.plan, sc.nodes, sc.gpus_per_node, sc.dtype_bytes, sc.options)
        t["ops"] = time.perf_counter() - t0
        rows = len(ops)
        del ops
        t0 = time.perf_counter()
        pred = predict_scenario(spec, "bench")
        t["scenario"] = time.perf_counter() - t0
        phases = dict(getattr(pred, "phases", None) or {})
        del pred
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            cli.main(cli_args(gpus))
        t["cli_in_process"] = time.perf_counter() - t0
        # What the command adds to its own prediction (its header says how long that took).
        predicted = re.search(r"predicted in ([0-9.]+) s", buf.getvalue())
        t["print"] = t["cli_in_process"] - float(predicted.group(1)) if predicted else math.nan
        runs.append(t)
    return {"imports": imports, **_best(runs), "ops_rows": rows, "scenario_phases": phases}


def _child(cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run ``cmd``: its wall time and stdout (where the child reports its own peak RSS:
    RUSAGE_CHILDREN would give the largest child so far, not this one), or ``timed_out``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"timed_out": True, "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return {"wall_s": wall, "stdout": out}


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(gpus: int, repeat: int, timeout: float) -> dict[str, Any]:
    """The three children of one size."""
    me = [sys.executable, str(Path(__file__).resolve())]
    got: dict[str, Any] = {"gpus": gpus, "plan": PLANS[gpus]}
    fn = _child([*me, "--child", "function", "--gpus", str(gpus), "--repeat", str(repeat)], timeout)
    got["function"] = json.loads(fn["stdout"]) if "stdout" in fn else fn
    for name, write in (("cli", False), ("cli --out", True)):
        walls, peaks, lines = [], [], 0
        for _ in range(repeat):
            with tempfile.TemporaryDirectory(prefix="predict-bench-") as tmp:
                out = ["--out", str(Path(tmp) / "p")] if write else []
                cmd = [*me, "--child", "cli", "--", *cli_args(gpus), *out]
                res = _child(cmd, timeout)
                if "stdout" not in res:
                    walls = []
                    break
                report = json.loads(res["stdout"].splitlines()[-1])
                walls.append(res["wall_s"])
                peaks.append(report["peak_mib"])
                lines = report["lines"]
        got[name] = (
            {"wall_s": min(walls), "peak_mib": max(peaks), "printed_lines": lines}
            if walls
            else {"timed_out": True}
        )
    return got


def _child_cli(argv: list[str]) -> None:
    """``commscope predict ARGV`` as the console script runs it, then one JSON line: how many
    lines it printed and this process's peak RSS."""
    buf = io.StringIO()
    from commscope import cli

    with contextlib.redirect_stdout(buf):
        rc = cli.main(["predict", *argv])
    if rc != 0:
        raise SystemExit(rc)
    print(json.dumps({"lines": buf.getvalue().count("\n"), "peak_mib": _peak_mib()}))


def _fmt(x: Any, unit: str = "s") -> str:
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:.2f} {unit}" if unit == "s" else f"{x:,.0f} {unit}"


def report(results: list[dict[str, Any]]) -> str:
    """The table the docs quote."""
    head = (
        "GPUs    (p,t,d)      ops rows     plan     ops      scenario  print    "
        "peak(fn)   cli      peak(cli)  cli --out  peak(--out)"
    )
    lines = [head]
    for r in results:
        f, c, o = r["function"], r["cli"], r["cli --out"]
        lines.append(
            f"{r['gpus']:<7} {str(tuple(r['plan'])):<12} {f.get('ops_rows', 0):>11,}  "
            f"{_fmt(f.get('plan')):>7}  {_fmt(f.get('ops')):>7}  {_fmt(f.get('scenario')):>8}  "
            f"{_fmt(f.get('print')):>7}  {_fmt(f.get('peak_mib'), 'MiB'):>9}  "
            f"{_fmt(c.get('wall_s')):>7}  {_fmt(c.get('peak_mib'), 'MiB'):>9}  "
            f"{_fmt(o.get('wall_s')):>9}  {_fmt(o.get('peak_mib'), 'MiB'):>9}"
        )
        phases = f.get("scenario_phases") or {}
        if phases:
            lines.append(
                "        predict_scenario phases: "
                + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,1024,16384", help="GPU counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--child", choices=("function", "cli"), help=argparse.SUPPRESS)
    parser.add_argument("--gpus", type=int, help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "function":
        got = run_functions(args.gpus, args.repeat)
        print(json.dumps({**got, "peak_mib": _peak_mib()}))
        return
    if args.child == "cli":
        _child_cli(args.rest)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in PLANS]
    if unknown:
        parser.error(f"sizes {unknown}: use some of {sorted(PLANS)}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; best of {args.repeat}")
    results = []
    for gpus in sizes:
        results.append(measure(gpus, args.repeat, args.timeout))
        print("\n".join(report(results[-1:]).splitlines()[1:]), flush=True)
    print()
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
