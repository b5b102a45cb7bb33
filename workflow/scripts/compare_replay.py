"""Rule compare_replay: a replay cell against its program, op by op, and against its source's
step time (predict_cell's tables)."""

from pathlib import Path

from commscope.logs import log_to
from commscope.replay.cell import compare_replay

with log_to(snakemake.log[0]):
    compare_replay(
        program=Path(snakemake.input.program),
        replay_meta=Path(snakemake.input.meta),
        cell_json=Path(snakemake.input.cell),
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        warmup_steps=snakemake.params.warmup_steps,
        out_ops=Path(snakemake.output.ops),
        out_compare=Path(snakemake.output.compare),
        out_timing=Path(snakemake.output.timing),
    )
