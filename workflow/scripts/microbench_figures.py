"""Rule microbench_figures: busbw vs size and time vs size (with the fits) per op."""

from pathlib import Path

from commscope.contracts import BENCH_FIGURES
from commscope.logs import log_to
from commscope.plots.bench import bench_figures_from

with log_to(snakemake.log[0]):
    bench_figures_from(
        summary=Path(snakemake.input.summary),
        fit=Path(snakemake.input.fit),
        figures={name: Path(snakemake.output[name]) for name in BENCH_FIGURES},
    )
