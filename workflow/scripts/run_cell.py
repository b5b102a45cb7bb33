"""Rule run_cell: bring the cluster up if needed and run one training cell on it, trying again
what may be transient; a cell that still fails is recorded in raw/failed.json
(commscope.experiment.attempts) instead of failing the study. A replay cell runs in
run_replay_cell.py."""

from pathlib import Path

from commscope.experiment.attempts import measure_cell
from commscope.experiment.launch import training_workload
from commscope.logs import log_to
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

with log_to(snakemake.log[0]):
    cell = CellSettings.from_mapping(snakemake.params.cell)
    run = RunSettings.from_mapping(snakemake.params.run)
    measure_cell(
        ClusterSettings.from_mapping(snakemake.params.cluster),
        cell,
        training_workload(cell, dict(snakemake.params.model), dict(snakemake.params.strategy), run),
        run,
        cell_id=snakemake.params.cell_id,
        out_dir=Path(snakemake.output[0]),
        attempts=int(snakemake.config["run"]["attempts"]),
        log_path=snakemake.log[0],
    )
