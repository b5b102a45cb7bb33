# The final self-contained HTML report.
from commscope.contracts import table_file


rule report:
    input:
        summary=f"results/aggregate/{table_file('summary')}",
        crosscheck=f"results/aggregate/{table_file('crosscheck')}",
        matrix_check=f"results/aggregate/{table_file('matrix_check')}",
        # The sensitivity section's table (the aggregate job's; its figure is among figures).
        slowdown=f"results/aggregate/{table_file('slowdown')}",
        # Synchronization and temporal structure per cell (docs/sync.md, docs/temporal.md).
        sync_summary=f"results/aggregate/{table_file('sync_summary')}",
        temporal_onoff=f"results/aggregate/{table_file('temporal_onoff')}",
        figures=rules.study_figures.output,
        learning=rules.learning.output.figures,
        learning_tables=[rules.learning.output.loss, rules.learning.output.routing],
        imports=expand(
            "results/imports/{name}/summary.parquet", name=sorted(config["imports"])
        ),
        microbench=(
            [
                rules.microbench_tables.output.summary,
                rules.microbench_tables.output.fit,
            ]
            if config["microbench"]["enabled"]
            else []
        ),
        microbench_figures=(
            rules.microbench_figures.output if config["microbench"]["enabled"] else []
        ),
        predictions=rules.predictions_table.output,
        prediction_heatmaps=rules.predictions_heatmaps.output,
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
        "results/report/index.html",
    log:
        "results/logs/report.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        config=config,
    script:
        "../scripts/report.py"
