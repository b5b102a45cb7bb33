"""Rule run_replay_cell: bring the cluster up if needed and replay one cell's program on it,
with run_cell's attempts and failure record (commscope.experiment.attempts). A replay of a
measured cell that failed records that instead: there is nothing to replay."""

from pathlib import Path

from commscope.experiment.attempts import measure_cell, record_failure
from commscope.logs import log_to
from commscope.replay.cell import replay_workload
from commscope.spec.settings import CellSettings, ClusterSettings, RunSettings

with log_to(snakemake.log[0]):
    cell = CellSettings.from_mapping(snakemake.params.cell)
    run = RunSettings.from_mapping(snakemake.params.run)
    out_dir = Path(snakemake.output[0])
    if hasattr(snakemake.input, "source_failed"):
        record_failure(
            cell=snakemake.params.cell_id,
            out_dir=out_dir,
            log_path=snakemake.log[0],
            phase="prepare",
            reason=f"its source cell failed (see {snakemake.input.source_failed})",
        )
    else:
        measure_cell(
            ClusterSettings.from_mapping(snakemake.params.cluster),
            cell,
            replay_workload(Path(snakemake.input.program), Path(snakemake.input.meta), run),
            run,
            cell_id=snakemake.params.cell_id,
            out_dir=out_dir,
            attempts=int(snakemake.config["run"]["attempts"]),
            log_path=snakemake.log[0],
        )
