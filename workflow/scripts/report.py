"""Rule report: the self-contained HTML report, from the rule's inputs by name."""

from commscope.logs import log_to
from commscope.report import StudyResults, render_report

with log_to(snakemake.log[0]):
    render_report(
        StudyResults(dict(snakemake.input.items())),
        snakemake.output.html,
        config=snakemake.params.config,
        template=snakemake.input.template,
        captions=snakemake.input.captions,
        out_findings=snakemake.output.findings,
    )
