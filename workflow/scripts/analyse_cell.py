"""Rule analyse_cell: one training cell's raw files to its trace tables, metric tables,
throughput figure and exports (commscope.analysis), then the analytical prediction of its step
with its link's microbenchmark fits, compared with the trace; every file declared by the rule."""

from pathlib import Path

from commscope.analysis import analyse_cell
from commscope.logs import log_to
from commscope.predict.cell import predict_cell
from commscope.spec.settings import CellSettings

out = snakemake.output

with log_to(snakemake.log[0]):
    trace = analyse_cell(
        raw=Path(snakemake.input.raw),
        cell=CellSettings.from_mapping(snakemake.params.cell),
        warmup_steps=snakemake.params.warmup_steps,
        outputs=dict(out.items()),
    )
    predict_cell(
        model_spec=dict(snakemake.params.model),
        plan_spec=dict(snakemake.params.strategy),
        fit_paths=[Path(p) for p in snakemake.input.fits],
        cell_json=trace["cell"],
        ops=trace["ops"],
        steps=trace["steps"],
        warmup_steps=snakemake.params.warmup_steps,
        out_ops=Path(out.predict_ops),
        out_compare=Path(out.predict_compare),
        out_timing=Path(out.predict_timing),
    )
