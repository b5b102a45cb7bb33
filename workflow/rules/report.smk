# The final self-contained HTML report. Every input is named once: the script hands them, by
# these names, to commscope.report.StudyResults, which every section and finding reads.
from commscope.contracts import table_file


rule report:
    input:
        # The microbenchmark's tables and figures, when the stage is on.
        **(
            {
                "microbench_summary": rules.microbench_tables.output.summary,
                "microbench_fit": rules.microbench_tables.output.fit,
                "microbench_figures": rules.microbench_figures.output,
            }
            if config["microbench"]["enabled"]
            else {}
        ),
        summary=f"results/aggregate/{table_file('summary')}",
        crosscheck=f"results/aggregate/{table_file('crosscheck')}",
        matrix_check=f"results/aggregate/{table_file('matrix_check')}",
        # The sensitivity section's table (the aggregate job's; its figure is among figures).
        slowdown=f"results/aggregate/{table_file('slowdown')}",
        # Synchronization and temporal structure per cell (docs/sync.md, docs/temporal.md).
        sync_summary=f"results/aggregate/{table_file('sync_summary')}",
        temporal_onoff=f"results/aggregate/{table_file('temporal_onoff')}",
        temporal_bursts=f"results/aggregate/{table_file('temporal_bursts')}",
        figures=rules.study_figures.output,
        learning_figures=rules.learning.output.figures,
        learning_loss=rules.learning.output.loss,
        learning_routing=rules.learning.output.routing,
        imports=expand(
            "results/imports/{name}/summary.parquet", name=sorted(config["imports"])
        ),
        predictions=rules.predictions_table.output[0],
        prediction_heatmaps=rules.predictions_heatmaps.output[0],
        # Every cell's status: what the cells that ran made (exports are part of a study's
        # results: `report` makes them too; its export section reads each cell's ASTRA-sim
        # input set; each replay cell's description, its predicted vs measured tables, its
        # throughput figure), and the failure records of those that did not, listed first.
        status=STATUSES,
        # Rewritten when failed cells are released: the next invocation runs them again.
        failed_cells=FAILED_CELLS,
        # The page's template and the figure captions (editing either remakes the report),
        # beside the Snakefile: a study may run in another working directory.
        template=str(Path(workflow.basedir) / "report" / "templates" / "report.html.j2"),
        captions=str(Path(workflow.basedir) / "report" / "captions.yaml"),
    output:
        html="results/report/index.html",
        # The findings as data (question, source, sentence, section): what a user quotes.
        findings="results/report/findings.json",
    log:
        "results/logs/report.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        config=config,
    script:
        "../scripts/report.py"
