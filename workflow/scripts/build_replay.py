"""Rule build_replay: a replay cell's program, built from its source trace for its placement."""

from pathlib import Path

from commscope.logs import log_to
from commscope.replay.cell import build_cell_program

with log_to(snakemake.log[0]):
    build_cell_program(
        cell=dict(snakemake.params.cell),
        replay=dict(snakemake.params.replay),
        scenario=dict(snakemake.params.scenario),
        source={key: Path(path) for key, path in snakemake.input.items()},
        warmup_steps=snakemake.params.warmup_steps,
        cluster=dict(snakemake.params.cluster),
        out_program=Path(snakemake.output.program),
        out_meta=Path(snakemake.output.meta),
    )
