# Traces recorded elsewhere: loaded into the ops table and given the op-level metrics.


rule import_trace:
    input:
        lookup(dpath="imports/{name}/paths", within=config),
    output:
        ops="results/imports/{name}/ops.parquet",
        summary="results/imports/{name}/summary.parquet",
        op_volume="results/imports/{name}/op_volume.parquet",
        msg_sizes="results/imports/{name}/msg_sizes.parquet",
        comm_matrix="results/imports/{name}/comm_matrix.parquet",
    log:
        "results/logs/import_trace/{name}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/import_trace.py"
