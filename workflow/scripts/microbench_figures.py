"""Rule microbench_figures: busbw vs size and time vs size (with the fits) per op."""

from pathlib import Path

from commscope.bench.figures import bench_figures_from
from commscope.logs import log_to

with log_to(snakemake.log[0]):
    bench_figures_from(
        table_dir=Path(snakemake.input.fit).parent,
        out_dir=Path(snakemake.output[0]),
    )
