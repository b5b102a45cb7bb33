# Replays (docs/replay.md): a replay cell re-issues a source trace's communication on the
# cluster. Its program is built here from the source (a measured cell, an imported trace or a
# predicted scenario) for the cell's placement, before the cell runs; every check on the trace
# (its ranks against the placement, ops the backend cannot run, memory) fails this rule, so
# nothing is launched. Built per cell (it takes a second): each link setting of a replay is
# its own cell, and changing one reruns only that cell.
from commscope.contracts import REPLAY_META_FILE, REPLAY_PROGRAM_FILE


rule build_replay:
    input:
        unpack(replay_source),
    output:
        program=f"{RUNS}/{CELL}/replay/{REPLAY_PROGRAM_FILE}",
        meta=f"{RUNS}/{CELL}/replay/{REPLAY_META_FILE}",
    log:
        f"results/logs/build_replay/{CELL}.log",
    conda:
        "../../envs/commscope.yaml"
    params:
        cell=cell_params,
        replay=model_params,
        scenario=replay_scenario,
        warmup_steps=config["run"]["warmup_steps"],
        cluster=config["cluster"],
    script:
        "../scripts/build_replay.py"
