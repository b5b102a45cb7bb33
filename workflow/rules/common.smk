# Shared helpers: the sweep cells (Paramspace, one directory level per axis) and their settings.
import functools
import json
import logging
import os
import re
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import Paramspace

from commscope.cluster.provision import teardown
from commscope.config import cell_axes, cell_id, replay_source_cell, strategy_spec
from commscope.cell.status import read_failure
from commscope.contracts import (
    CELL_FAILED_FILE,
    CELL_STATUS_FILE,
    CELL_TABLE_FILES,
    METRIC_TABLES,
    REPLAY_META_FILE,
    REPLAY_STRATEGY,
    is_replay,
    table_file,
)
from commscope.bench.analysis import BENCH_FILES, fit_links, link_settings
from commscope.spec.link import LINK_AXES, LinkSetting
from commscope.spec.settings import MICROBENCH_SCOPE_KEYS, ClusterSettings
from commscope.study import study_checks

# Impossible combinations stop the workflow here, before any node is touched: the same
# checks as `commscope check` (commscope.study.study_checks).
CELLS = study_checks(config)
cellspace = Paramspace(CELLS)
CELL = cellspace.wildcard_pattern
RUNS = "results/runs"


# Wildcards never climb out of results/: a value is one path component that starts with a
# letter or digit ('..' and '.hidden' cannot match), as the schema asks of names and values.
SAFE_COMPONENT = "[A-Za-z0-9][A-Za-z0-9._-]*"


# Every wildcard a rule's output may use, each limited to one safe component (the Snakefile
# checks that no output uses another).
WILDCARD_NAMES = {*CELLS.columns, "name"}


wildcard_constraints:
    **{axis: SAFE_COMPONENT for axis in CELLS.columns},
    name=SAFE_COMPONENT,


# A replay cell has rules of its own (run_replay_cell, compare_replay): their strategy is the
# replay sentinel, and the training cell's rules (run_cell, predict_cell) take any other. The
# two never overlap, so a replay whose program cannot be made stops on that missing input
# instead of Snakemake falling back to the training rule (as it would behind a ruleorder).
REPLAY_CELL = re.escape(REPLAY_STRATEGY)
TRAINING_CELL = f"(?!{REPLAY_CELL}(?![A-Za-z0-9._-])){SAFE_COMPONENT}"


# The run: settings a job runs with. How often a failed cell is tried is not one of them:
# changing it reruns nothing (run_cell's script reads it from the config).
RUN_SETTINGS = {k: v for k, v in config["run"].items() if k != "attempts"}


# Paramspace.instance builds a pandas Series per axis (~10 ms a cell). Snakemake evaluates every
# job's params again after each checkpoint (run_cell) when it collects the jobs' conda
# environments: uncached, that was 1.6 s of each of the ~80 updates of a study, between cells.
@functools.cache
def _cell_instance(items):
    return cellspace.instance(dict(items))


def cell_params(wildcards):
    """The cell's own sweep values (typed), and nothing else: reruns follow only them."""
    # The wildcards' own order, as Paramspace gives it (the params' hash follows it).
    return dict(_cell_instance(tuple(wildcards.items())))


def model_params(wildcards):
    """The cell's model, or for a replay cell its entry under replays: (source, scale, ...)."""
    if is_replay(wildcards.strategy):
        return config["replays"][wildcards.model]
    return config["models"][wildcards.model]


def strategy_params(wildcards):
    """Only this cell's strategy definition: editing another strategy reruns nothing here."""
    if is_replay(wildcards.strategy):
        return {}
    return strategy_spec(config, wildcards.strategy)


def all_cells(pattern):
    return expand(pattern, cell=cellspace.instance_patterns)


# Cells that still fail after their attempts (commscope.experiment.attempts) are recorded, not
# fatal: run_cell is a checkpoint, each cell's status (rule cell_status) names what the cell
# made or why it failed, and the study-wide rules read the statuses. When the workflow ends,
# each failed cell's record moves out of its raw/ (release_failed_cells): the next invocation
# runs the cell again.
def failed_record(raw):
    return Path(raw) / CELL_FAILED_FILE


def cell_raw(axes):
    """The cell's raw directory once its checkpoint (run_cell, or run_replay_cell for a replay
    cell) has run; raises Snakemake's IncompleteCheckpointException before it has."""
    run = (
        checkpoints.run_replay_cell
        if is_replay(axes["strategy"])
        else checkpoints.run_cell
    )
    return run.get(**axes).output[0]


def cell_ran(cell):
    """Whether the cell ran (raises Snakemake's IncompleteCheckpointException before it has)."""
    return not failed_record(cell_raw(cell_axes(cell))).exists()


# Every cell's status: what the study-wide rules read (static inputs: a rule whose inputs come
# from a checkpoint is never remade while its output exists, and a failed cell must be).
STATUSES = all_cells(f"{RUNS}/{{cell}}/{CELL_STATUS_FILE}")


# The cells released when the last workflow ended (rule failed_cells makes it empty at first).
FAILED_CELLS = "results/failed_cells.json"


def release_failed_cells():
    """When the workflow ends: the records of the cells that failed after their attempts,
    each moved from its raw/ to attempts/failed.json beside it (raw/ and the cell's status
    removed, so the next invocation, its dry run too, runs the cell again; the report already
    written names it)."""
    failed = []
    for cell in cellspace.instance_patterns:
        raw = Path(f"{RUNS}/{cell}/raw")
        record = read_failure(raw)
        if record is not None:
            failed.append((cell, record))
            kept = raw.parent / "attempts" / CELL_FAILED_FILE
            kept.parent.mkdir(parents=True, exist_ok=True)
            failed_record(raw).replace(kept)
            shutil.rmtree(raw)
            Path(f"{RUNS}/{cell}/{CELL_STATUS_FILE}").unlink(missing_ok=True)
    if failed:
        # Snakemake does not remake a missing intermediate file (the status, raw/) whose
        # consumers are up to date: the report reads this list, and rewriting it makes the
        # report out of date, so the next invocation remakes what it reads.
        Path(FAILED_CELLS).write_text(
            json.dumps([cell for cell, _ in failed], indent=2)
        )
    return failed


def node_words(rec):
    return f" on {rec['node']}" if rec.get("node") else ""


def fail_on_failed_cells(failed):
    """Raise naming each failed cell (``release_failed_cells``), so the command exits
    non-zero once the report is written."""
    if failed:
        lines = [
            f"{cell}: {rec['phase']}{node_words(rec)}: {rec['reason']} (log {rec['log']})"
            for cell, rec in failed
        ]
        raise WorkflowError(
            f"{len(failed)} cell(s) failed after their attempts; the report "
            "(results/report/index.html) lists them and leaves them out of its findings. "
            "`snakemake --cores 8 report` runs them again:\n  " + "\n  ".join(lines)
        )


def cell_products(wildcards):
    """What the study reads of one cell once it ran, by name (nothing when it failed):
    requested per cell, so a cell's analysis runs as soon as the cell has. Its status lists
    them (commscope.cell.status.write_status) for the study-wide rules."""
    cell = CELL.format(**wildcards)
    if failed_record(cell_raw(wildcards)).exists():
        return {}
    base = f"{RUNS}/{cell}"
    products = {
        **{f"metrics_{t}": f"{base}/metrics/{table_file(t)}" for t in METRIC_TABLES},
        **{f"trace_{t}": f"{base}/trace/{CELL_TABLE_FILES[t]}" for t in TRACE_PRODUCTS},
        "figure": f"{base}/figures/throughput.png",
        "export_trace": f"{base}/export/trace.json",
        "export_chakra": f"{base}/export/chakra",
        "predict_compare": f"{base}/predict/compare.parquet",
        "predict_timing": f"{base}/predict/timing.parquet",
    }
    if is_replay(wildcards.strategy):
        products["replay_meta"] = f"{base}/replay/{REPLAY_META_FILE}"
    return products


# The trace tables the study-wide rules read (the op timeline, the learning curves).
TRACE_PRODUCTS = ("ops", "steps", "cell", "train", "moe")


# The claim on the cluster's name while this run lives (see preflight).
CLUSTER_CLAIM = []


def preflight():
    """Before any job runs (not on dry runs): can this machine host the configured cluster,
    and is its name free? The run then holds the name until it ends (either backend: the
    claim is a lock on this machine), so another checkout's run, `commscope check --nodes` or
    `commscope cleanup` cannot tear its nodes down or reshape them mid-cell."""
    from commscope.cluster.claim import ClusterBusy, claim_cluster
    from commscope.cluster.machine import preflight_problems

    if config["cluster"]["backend"] == "netns":
        problems = preflight_problems()
        if problems:
            raise WorkflowError(
                "the netns cluster cannot run here:\n  - "
                + "\n  - ".join(problems)
                + "\nUse cluster.backend: ssh with real hosts (config/cluster.example.yaml)."
            )
    name = config["cluster"]["name"]
    try:
        CLUSTER_CLAIM.append(
            claim_cluster(name, f"pid {os.getpid()} (snakemake in {Path.cwd()})")
        )
    except ClusterBusy as busy:
        raise WorkflowError(
            f"cluster.name: {busy}. Wait for that run to end, or give this study its "
            "own cluster.name (and subnets)."
        ) from None


def teardown_cluster():
    try:
        teardown(ClusterSettings.from_mapping(config["cluster"]), Path.cwd())
    except Exception as err:  # never mask the workflow's own result
        logging.getLogger("commscope").warning("cluster teardown failed: %s", err)


# Collective microbenchmarks: the link settings they run on (docs/microbench.md).
MICROBENCH = config["microbench"]
BENCH = "results/microbench"
# One link setting's directory, with a wildcard per axis.
LINK = LinkSetting(*(f"{{{axis}}}" for axis in LINK_AXES)).id
BENCH_LINKS = link_settings(MICROBENCH["links"], CELLS)
# The benchmark's own settings (plain config values: params compare as written): editing
# which links to run reruns no benchmark.
BENCH_SETTINGS = {k: v for k, v in MICROBENCH.items() if k not in MICROBENCH_SCOPE_KEYS}


def bench_outputs(directory):
    """The analysis tables under ``directory``, by name (one link's or all links')."""
    return {table: f"{directory}/{file}" for table, file in BENCH_FILES.items()}


def link_of(wildcards):
    """The link setting named by a job's bw/delay/jitter/loss wildcards (a plain dict)."""
    return LinkSetting.from_wildcards(wildcards).as_dict()


def microbench_fits(wildcards):
    """Fits predict_cell reads (its link's, and the unshaped one's for intra-node ops)."""
    return expand(
        f"{BENCH}/{{link}}/{BENCH_FILES['fit']}",
        link=fit_links(
            LinkSetting.from_wildcards(wildcards),
            BENCH_LINKS["link"],
            MICROBENCH["enabled"],
        ),
    )


# Replays (replay.smk): the files a replay cell's program is built from, and the program.
def replay_source(wildcards):
    """The source trace's files: a measured cell's parsed tables, or an import's ops table;
    a predicted scenario needs none (it is predicted from its config entry)."""
    kind, ref = next(iter(config["replays"][wildcards.model]["source"].items()))
    if kind == "cell":
        trace = f"{RUNS}/{cell_id(replay_source_cell(config, wildcards.model))}/trace"
        return {
            table: f"{trace}/{CELL_TABLE_FILES[table]}"
            for table in ("ops", "steps", "cell")
        }
    if kind == "import":
        return {"ops": f"results/imports/{ref}/ops.parquet"}
    return {}


def replay_scenario(wildcards):
    """A prediction source's scenario entry ({} for other sources)."""
    kind, ref = next(iter(config["replays"][wildcards.model]["source"].items()))
    return config["predictions"][ref] if kind == "prediction" else {}


def replay_program(wildcards):
    """What run_replay_cell replays: the cell's program and its description, or, when the
    measured cell it replays failed, that cell's failure record (nothing to replay)."""
    kind, _ = next(iter(config["replays"][wildcards.model]["source"].items()))
    if kind == "cell":
        source = cell_id(replay_source_cell(config, wildcards.model))
        if not cell_ran(source):
            # Nothing to replay: run_cell records the failure (the source's record named).
            return {"source_failed": str(failed_record(f"{RUNS}/{source}/raw"))}
    out = rules.build_replay.output
    return {
        "program": out.program.format(**wildcards),
        "meta": out.meta.format(**wildcards),
    }
