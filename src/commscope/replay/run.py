"""``commscope replay``: one replay cell from the command line, outside a study. The same steps
as the workflow's (build_replay, run_cell, analyse_cell's parse and metrics, predict_cell's
comparison) into one output directory, on the study config's cluster (claimed for the duration
and taken down at the end), with a summary of what was replayed and how it measured."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cell.parse import build_cell_tables, cell_table_paths
from commscope.cluster.claim import claim_cluster
from commscope.cluster.provision import teardown
from commscope.config import filled_cell
from commscope.contracts import (
    CELL_TABLE_FILES,
    OPS_FILE,
    REPLAY_META_FILE,
    REPLAY_PROGRAM_FILE,
    REPLAY_STRATEGY,
    table_file,
)
from commscope.experiment.cell import provision_and_run
from commscope.metrics.imported import load_import
from commscope.metrics.io import compute_cell_metrics
from commscope.predict.cell import median_step_s
from commscope.replay.cell import build_cell_program, compare_program, replay_workload
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings


@dataclass(frozen=True)
class ReplayRun:
    """What one replay measured: the replay's description (replay.json), the op-by-op
    comparison with its program, its median steady step, and the wire's cross-check."""

    meta: dict[str, Any]
    compare: pd.DataFrame
    step_s: float
    crosscheck: pd.DataFrame
    out_dir: Path

    @property
    def exact(self) -> bool:
        """Every rank and steady step issued the program's messages, bytes and order."""
        return bool(
            len(self.compare)
            and self.compare[["match", "sizes_match", "sequence_match"]].all().all()
        )

    def describe(self) -> str:
        """A few lines for the terminal."""
        m = self.meta
        wire = (
            f"{int(self.crosscheck['passed'].sum())} of {len(self.crosscheck)} node directions"
            if "passed" in self.crosscheck
            else "not checked"
        )
        return "\n".join(
            [
                f"replay {m.get('replay')}: {m.get('source_text')}, {m.get('world')} ranks "
                f"on {m['placement']['nodes']} nodes x {m['placement']['ranks_per_node']}",
                f"  per step: {m.get('ops_per_step', 0):.0f} ops, "
                f"{m.get('bytes_per_step', 0) / 1e6:.3f} MB (scale {m.get('scale')}, "
                f"compute {m.get('compute')}, time scale {m.get('time_scale')})",
                f"  exact against the program: {'yes' if self.exact else 'NO'}; "
                f"median steady step {1e3 * self.step_s:.1f} ms; wire agrees with the ops on "
                f"{wire}",
                f"  not reproduced: {'; '.join(m.get('not_reproduced') or ['nothing'])}",
                f"  scaling: {m.get('scaling_rule', '')}",
                f"  files: {self.out_dir}",
            ]
        )


def replay_once(
    *,
    name: str,
    entry: Mapping[str, Any],
    cell: Mapping[str, Any],
    cluster: ClusterSettings,
    run: RunSettings,
    out_dir: Path,
    trace_files: Sequence[Path] = (),
    cell_dir: Path | None = None,
    scenario: Mapping[str, Any] | None = None,
    root: Path | None = None,
) -> ReplayRun:
    """Replay ``entry`` (a ``replays:`` entry: source, scale, ...; its source is replaced by
    the given files) as one cell with ``cell``'s placement, link axes and steps, into
    ``out_dir``: ``replay/`` (program, replay.json), ``raw/``, ``trace/``, ``metrics/``.

    The source is ``trace_files`` (imported as one trace, all ranks), a measured cell's
    directory ``cell_dir`` (its ``trace/`` tables), or a prediction's ``scenario`` entry.
    The cluster is claimed (netns), provisioned, and taken down at the end, whatever happens.
    """
    root = Path(root or Path.cwd())
    out_dir = Path(out_dir)
    params = filled_cell({**cell, "strategy": REPLAY_STRATEGY, "model": name})
    source: dict[str, Path] = {}
    entry = dict(entry)
    if trace_files:
        ops = load_import([Path(p) for p in trace_files], name)
        source["ops"] = out_dir / "source" / OPS_FILE
        source["ops"].parent.mkdir(parents=True, exist_ok=True)
        ops.to_parquet(source["ops"], index=False)
        entry["source"] = {"import": name}
    elif cell_dir is not None:
        trace = Path(cell_dir) / "trace"
        # build_replay's inputs for a measured source (workflow/rules/common.smk: replay_source).
        source = {table: trace / CELL_TABLE_FILES[table] for table in ("ops", "steps", "cell")}
        recorded = json.loads(source["cell"].read_text())
        entry["source"] = {"cell": filled_cell(recorded["params"])}
    elif scenario is None:
        raise ValueError("replay: give trace files, a measured cell's directory or a scenario")
    program = out_dir / "replay" / REPLAY_PROGRAM_FILE
    meta_path = out_dir / "replay" / REPLAY_META_FILE
    built = build_cell_program(
        cell=params,
        replay=entry,
        scenario=dict(scenario or {}),
        source=source,
        warmup_steps=run.warmup_steps,
        cluster={"backend": cluster.backend},
        out_program=program,
        out_meta=meta_path,
    )
    # Either backend: the claim is a lock on this machine that every run of commscope takes.
    claim = claim_cluster(cluster.name, f"pid {os.getpid()} (commscope replay in {root})")
    try:
        provision_and_run(
            cluster,
            CellSettings.from_mapping(params),
            replay_workload(program, meta_path, run),
            run,
            out_dir / "raw",
            root,
        )
    finally:
        try:
            teardown(cluster, root)
        finally:
            if claim is not None:
                claim.close()
    paths = cell_table_paths(out_dir / "trace")
    build_cell_tables(out_dir / "raw", CellSettings.from_mapping(params), run.warmup_steps, paths)
    compute_cell_metrics(out_dir / "trace", out_dir / "metrics")
    measured = pd.read_parquet(paths["ops"])
    compare = compare_program(built.table, measured, run.warmup_steps)
    check_path = out_dir / "metrics" / table_file("crosscheck")
    return ReplayRun(
        meta=built.meta,
        compare=compare,
        step_s=median_step_s(pd.read_parquet(paths["steps"]), run.warmup_steps),
        crosscheck=pd.read_parquet(check_path) if check_path.exists() else pd.DataFrame(),
        out_dir=out_dir,
    )
