"""Rule predict_cell: analytical prediction of one cell and its comparison with the trace (a
replay cell: its program, op by op, and its source's step time)."""

from pathlib import Path

from commscope.logs import log_to
from commscope.predict.cell import predict_cell
from commscope.replay.cell import compare_replay

with log_to(snakemake.log[0]):
    tables = dict(
        cell_json=Path(snakemake.input.cell),
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        warmup_steps=snakemake.params.warmup_steps,
        out_ops=Path(snakemake.output.ops),
        out_compare=Path(snakemake.output.compare),
        out_timing=Path(snakemake.output.timing),
    )
    if hasattr(snakemake.input, "program"):
        compare_replay(
            program=Path(snakemake.input.program),
            replay_meta=Path(snakemake.input.replay_meta),
            **tables,
        )
    else:
        predict_cell(
            model_spec=dict(snakemake.params.model),
            plan_spec=dict(snakemake.params.strategy),
            fit_paths=[Path(p) for p in snakemake.input.fits],
            **tables,
        )
