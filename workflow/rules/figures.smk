# Figures per cell and across cells, and the learning-run tables and figures.
from commscope.contracts import table_file


rule cell_figure:
    input:
        throughput=f"{RUNS}/{CELL}/metrics/{table_file('throughput')}",
        step_times=f"{RUNS}/{CELL}/metrics/{table_file('step_times')}",
        summary=f"{RUNS}/{CELL}/metrics/{table_file('summary')}",
    output:
        f"{RUNS}/{CELL}/figures/throughput.png",
    log:
        f"results/logs/cell_figure/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/cell_figure.py"


rule study_figures:
    # The tables commscope.plots.study.plot_study draws (STUDY_TABLES) and its figures
    # (STUDY_FIGURES), by name.
    input:
        msg_sizes=f"results/aggregate/{table_file('msg_sizes')}",
        summary=f"results/aggregate/{table_file('summary')}",
        op_volume=f"results/aggregate/{table_file('op_volume')}",
        step_times=f"results/aggregate/{table_file('step_times')}",
        node_matrix=f"results/aggregate/{table_file('node_matrix')}",
        comm_matrix=f"results/aggregate/{table_file('comm_matrix')}",
    output:
        msg_size_cdf="results/figures/msg_size_cdf.png",
        step_time_vs_bw="results/figures/step_time_vs_bw.png",
        bytes_per_step_by_op="results/figures/bytes_per_step_by_op.png",
        comm_matrix_nodes="results/figures/comm_matrix_nodes.png",
        comm_matrix_ranks="results/figures/comm_matrix_ranks.png",
    log:
        "results/logs/study_figures.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/study_figures.py"


rule learning:
    input:
        train=expand(
            f"{RUNS}/{{cell}}/trace/train.parquet", cell=cellspace.instance_patterns
        ),
        moe=expand(
            f"{RUNS}/{{cell}}/trace/moe.parquet", cell=cellspace.instance_patterns
        ),
    output:
        loss="results/learning/loss.parquet",
        routing="results/learning/routing.parquet",
        # Which figures exist depends on the data (no MoE cell: no routing figure).
        figures=directory("results/learning/figures"),
    log:
        "results/logs/learning.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/learning.py"
