# Simulator-ready exports per cell: Perfetto/Chrome trace, flow list, ASTRA-sim text workload, and
# in chakra/ a ready-to-run ASTRA-sim input set (Chakra ET per rank, comm groups, network, system
# and memory configs, run_astra.sh, export_summary.json; docs/export.md).


rule export_cell:
    input:
        ops=rules.parse_cell.output.ops,
        steps=rules.parse_cell.output.steps,
        cell=rules.parse_cell.output.cell,
    output:
        perfetto=f"{RUNS}/{CELL}/export/trace.json",
        astra=f"{RUNS}/{CELL}/export/astra_workload.txt",
        flows=f"{RUNS}/{CELL}/export/flows.csv",
        chakra=directory(f"{RUNS}/{CELL}/export/chakra"),
    log:
        f"results/logs/export_cell/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    script:
        "../scripts/export_cell.py"
