"""Rule run_cell: bring the cluster up if needed and run one training cell on it, trying again
what may be transient; a cell that still fails is recorded in raw/failed.json
(commscope.experiment.attempts) instead of failing the study. A replay cell runs in
run_replay_cell.py."""

from pathlib import Path

from commscope.experiment.attempts import run_attempts
from commscope.experiment.cell import provision_and_run
from commscope.experiment.launch import training_workload
from commscope.logs import log_to
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

with log_to(snakemake.log[0]):
    cell = CellSettings.from_mapping(snakemake.params.cell)
    run = RunSettings.from_mapping(snakemake.params.run)
    cluster = ClusterSettings.from_mapping(snakemake.params.cluster)
    out_dir = Path(snakemake.output[0])
    workload = training_workload(
        cell, dict(snakemake.params.model), dict(snakemake.params.strategy), run
    )
    run_attempts(
        lambda progress: provision_and_run(
            cluster_cfg=cluster,
            cell=cell,
            workload=workload,
            run=run,
            out_dir=out_dir,
            progress=progress,
        ),
        cell=snakemake.params.cell_id,
        out_dir=out_dir,
        log_path=snakemake.log[0],
        attempts=int(snakemake.config["run"]["attempts"]),
        nodes=[f"node{i}" for i in range(cell.nodes)],
    )
