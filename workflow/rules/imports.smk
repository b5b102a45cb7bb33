# Traces recorded elsewhere: loaded into the ops table and given the op-level metrics. The
# tables' names come from the data contract.
from commscope.contracts import IMPORT_TABLES, table_file


rule import_trace:
    input:
        lookup(dpath="imports/{name}/paths", within=config),
    output:
        **{
            table: f"results/imports/{{name}}/{table_file(table)}"
            for table in IMPORT_TABLES
        },
    log:
        "results/logs/import_trace/{name}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/import_trace.py"
