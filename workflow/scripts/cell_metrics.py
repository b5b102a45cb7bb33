"""Rule cell_metrics: one cell's metric tables, from its declared trace files to its declared
metric files."""

from pathlib import Path

from commscope.contracts import METRIC_TABLES
from commscope.logs import log_to
from commscope.metrics.io import write_cell_metrics

with log_to(snakemake.log[0]):
    write_cell_metrics(
        cell=Path(snakemake.input.cell),
        ops=Path(snakemake.input.ops),
        steps=Path(snakemake.input.steps),
        outputs={table: Path(snakemake.output[table]) for table in METRIC_TABLES},
        counters=Path(snakemake.input.counters),
        routing=Path(snakemake.input.moe),
        sockets=Path(snakemake.input.sockets),
        wire_flows=Path(snakemake.input.wire_flows),
        host=Path(snakemake.input.host),
        raw=Path(snakemake.input.raw),
    )
