# The final self-contained HTML report.
from commscope.contracts import REPLAY_META_FILE, table_file


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
        # Exports are part of a study's results: `report` makes them too; its export section
        # reads each cell's ASTRA-sim input set (export/chakra/export_summary.json).
        exports=expand(
            f"{RUNS}/{{cell}}/export/trace.json", cell=cellspace.instance_patterns
        ),
        chakra=expand(
            f"{RUNS}/{{cell}}/export/chakra", cell=cellspace.instance_patterns
        ),
        # Each replay cell's description (source, scale, scaling rule) for its section.
        replays=expand(
            f"{RUNS}/{{cell}}/replay/{REPLAY_META_FILE}",
            cell=[
                c
                for c in cellspace.instance_patterns
                if c.startswith(f"strategy~{REPLAY_STRATEGY}/")
            ],
        ),
        compare=expand(
            f"{RUNS}/{{cell}}/predict/compare.parquet",
            cell=cellspace.instance_patterns,
        ),
        timing=expand(
            f"{RUNS}/{{cell}}/predict/timing.parquet", cell=cellspace.instance_patterns
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
        cell_figures=expand(
            f"{RUNS}/{{cell}}/figures/throughput.png", cell=cellspace.instance_patterns
        ),
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
        cells=list(cellspace.instance_patterns),
    script:
        "../scripts/report.py"
