"""Named prediction scenarios: configurations far larger than the cluster, predicted in seconds.

A *scenario* is one training job described by a flat mapping (the ``predictions:`` entries of a
study config, or what ``commscope predict`` builds from its flags): a model (a preset such as
seed 002's ``gpt-3b``, an inline model shape, or a preset with some keys overridden), a parallel
plan (``pp``/``tp``/``dp``/``ep`` degrees, the ``mapping`` of mesh dims to nodes, the pipeline
schedule and micro-batches, ...), the placement (``gpus_per_node``, ``nodes``) and the
framework (``megatron`` or ``torch``, recomputation, vocab-parallel embedding, dtype size). See
:data:`SCENARIO_DEFAULTS` for every key.

:func:`predict_scenario` lists the ops of one steady step on every rank
(:func:`commscope.predict.ops.predict_ops`) and turns them into the tables a network
researcher asks for, all from the single traffic model
:func:`commscope.collectives.traffic.op_destinations` (ring/chain algorithms):

* ``traffic``: per rank and traffic type (tp, pp, dp, ep, emb): messages, payload bytes (the
  ops table's ``bytes`` summed, receives included, as seed 002's Table 3 counts them), bytes the
  rank transmits (``sent_bytes``) split into ``intra_node_bytes`` and ``inter_node_bytes``, and
  the message sizes;
* ``node_matrix``: node x node bytes per traffic type (complete grid; diagonal: inside a node);
* ``rank_matrix``: rank x rank bytes per traffic type (sparse).

Default vs customized mapping differ exactly in the intra/inter split: the same bytes, on
different links. Every table repeats the scenario's parameters
(:data:`SCENARIO_PARAM_COLUMNS`), so tables of several scenarios concatenate;
:func:`scenario_tables` makes the compact report table from written scenario directories.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commscope.collectives.traffic import DEFAULT_BACKEND
from commscope.contracts import SCENARIO_FILES, with_params
from commscope.predict.compare import summarize
from commscope.predict.matrix import node_grid, node_pairs, step_rank_matrix
from commscope.predict.ops import TRAFFIC_TYPES, predict_step
from commscope.predict.options import PredictOptions
from commscope.predict.roles import RoleOps
from commscope.spec.plan import ParallelPlan

# Seed 002 §4 (GPT under PTD-P): (l, h, s) = (48, 1600, 1024) and (54, 2000, 1024), micro-batch
# b = 32, m = 8 micro-batches per replica (gb = 512 on d = 2, gb = 1024 on d = 4), so the
# per-replica batch is b * m = 256. The paper names neither vocabulary nor heads: GPT-2's BPE
# vocabulary (50257) and 100-wide heads (16 and 20 heads, divisible by t = 2 and 4) are
# assumptions; heads change no traffic.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt-1.5b": dict(layers=48, hidden=1600, heads=16, seq=1024, vocab=50257, batch=256),
    "gpt-3b": dict(layers=54, hidden=2000, heads=20, seq=1024, vocab=50257, batch=256),
}
PRESET_MICROBATCHES = 8
# Seed 002 §5.1: "mixed-precision training, utilizing 16-bit precision for model parameters,
# activations, and gradients": a preset's messages are fp16 unless the scenario says otherwise.
PRESET_DTYPE_BYTES = 2
PLAN_KEYS = (
    "pp",
    "tp",
    "dp",
    "ep",
    "dp_kind",
    "mapping",
    "pp_schedule",
    "microbatches",
    "stages_per_rank",
    "bucket_cap_mb",
    "reshard_after_forward",
    "sequence_parallel",
)
# Every key a scenario may set, with its default (None: see the key's note).
SCENARIO_DEFAULTS: dict[str, Any] = {
    "description": "",  # free text for the report
    "preset": None,  # a key of PRESETS; ``model`` keys override the preset's
    "model": None,  # model shape as in the config's ``models:`` (layers, hidden, ...)
    "pp": 1,
    "tp": 1,
    "dp": 1,
    "ep": 1,
    "dp_kind": "ddp",
    "mapping": ParallelPlan.mapping,
    "pp_schedule": ParallelPlan.pp_schedule,
    "microbatches": None,  # PRESET_MICROBATCHES with a preset, else ParallelPlan's default
    "stages_per_rank": ParallelPlan.stages_per_rank,
    "bucket_cap_mb": ParallelPlan.bucket_cap_mb,  # None: DDP's default (first bucket 1 MiB)
    "reshard_after_forward": ParallelPlan.reshard_after_forward,
    "sequence_parallel": ParallelPlan.sequence_parallel,
    "gpus_per_node": 8,
    "nodes": None,  # world size / gpus_per_node; needed when a degree is -1
    "framework": "megatron",
    "recompute": None,  # None: the framework's default (megatron: on)
    "vocab_parallel": None,
    "tied_embeddings": None,
    "dtype_bytes": PRESET_DTYPE_BYTES,  # fp16/bf16 training, as seed 002
}
# The scenario's parameters repeated in every table it writes (not the sweep cells'
# contracts.PARAM_COLUMNS: a scenario is no cell).
SCENARIO_PARAM_COLUMNS = [
    "scenario",
    "model",
    "pp",
    "tp",
    "dp",
    "ep",
    "mapping",
    "microbatches",
    "nodes",
    "gpus_per_node",
    "world_size",
    "framework",
]
TRAFFIC_COLUMNS = [
    *SCENARIO_PARAM_COLUMNS,
    "rank",
    "node",
    "traffic",
    "messages",
    "bytes",
    "sent_bytes",
    "intra_node_bytes",
    "inter_node_bytes",
    "msg_min",
    "msg_mean",
    "msg_max",
    "sizes",
]
TABLE_COLUMNS = [
    *SCENARIO_PARAM_COLUMNS,
    "traffic",
    "rank0_messages",
    "rank0_bytes",
    "rank0_sizes",
    "messages",
    "bytes",
    "sent_bytes",
    "intra_node_bytes",
    "inter_node_bytes",
    "inter_node_share",
    "predict_seconds",
]
ALL_TRAFFIC = "all"  # the scenario table's row summing every traffic type


@dataclass(frozen=True)
class Scenario:
    """A scenario spec resolved to what :func:`predict_ops` takes."""

    name: str
    model_name: str
    model: dict[str, Any]
    plan: ParallelPlan
    nodes: int
    gpus_per_node: int
    dtype_bytes: int
    options: PredictOptions
    description: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def params(self) -> dict[str, Any]:
        """The values of :data:`SCENARIO_PARAM_COLUMNS`."""
        return {
            "scenario": self.name,
            "model": self.model_name,
            "pp": self.plan.pp,
            "tp": self.plan.tp,
            "dp": self.plan.dp,
            "ep": self.plan.ep,
            "mapping": self.plan.mapping,
            "microbatches": self.plan.microbatches if self.plan.pp > 1 else 1,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "world_size": self.world_size,
            "framework": self.options.framework,
        }


def resolve_scenario(spec: dict[str, Any], name: str = "") -> Scenario:
    """Check a scenario spec and fill its defaults; raises ValueError naming the problem.

    The model is the preset's shape updated with ``model``; the plan's -1 degree (if any) takes
    the rest of ``nodes x gpus_per_node``; ``nodes`` defaults to the product of the degrees
    over ``gpus_per_node``, which must divide it.
    """
    unknown = set(spec) - set(SCENARIO_DEFAULTS)
    if unknown:
        raise ValueError(
            f"scenario {name!r}: unknown keys {sorted(unknown)}; known: {sorted(SCENARIO_DEFAULTS)}"
        )
    s = {**SCENARIO_DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    preset = s["preset"]
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"scenario {name!r}: preset {preset!r}: use one of {sorted(PRESETS)}")
    if preset is None and not s["model"]:
        raise ValueError(f"scenario {name!r}: give a preset or a model")
    model = {**PRESETS.get(preset, {}), **dict(s["model"] or {})}
    if s["microbatches"] is None:
        s["microbatches"] = PRESET_MICROBATCHES if preset else ParallelPlan.microbatches
    plan = ParallelPlan.from_dict({k: s[k] for k in PLAN_KEYS})
    rpn = int(s["gpus_per_node"])
    if rpn < 1:
        raise ValueError(f"scenario {name!r}: gpus_per_node must be >= 1")
    if s["nodes"] is not None:
        nodes = int(s["nodes"])
    else:
        degrees = [plan.pp, plan.tp, plan.dp, plan.ep]
        if -1 in degrees:
            raise ValueError(f"scenario {name!r}: a degree of -1 needs nodes to fix the world")
        world = plan.pp * plan.tp * plan.dp * plan.ep
        if world % rpn:
            raise ValueError(
                f"scenario {name!r}: pp x tp x dp x ep = {world} ranks is not a multiple of "
                f"gpus_per_node = {rpn}; set nodes or change the degrees"
            )
        nodes = world // rpn
    options = PredictOptions(
        framework=s["framework"],
        recompute=s["recompute"],
        vocab_parallel=s["vocab_parallel"],
        tied_embeddings=s["tied_embeddings"],
    ).resolve()
    model_name = preset or str(model.get("kind", "gpt"))
    if preset and s["model"]:
        model_name += " (modified)"
    return Scenario(
        name=name,
        model_name=model_name,
        model=model,
        plan=plan.resolve(nodes * rpn),
        nodes=nodes,
        gpus_per_node=rpn,
        dtype_bytes=int(s["dtype_bytes"]),
        options=options,
        description=str(s["description"] or ""),
    )


@dataclass
class ScenarioPrediction:
    """One scenario's predicted step: per-rank traffic and matrices (see the module docstring
    for the columns), the ops (built on first use of :attr:`ops`: at thousands of GPUs the
    table has millions of rows that the other tables do not need), how long the prediction
    took (``seconds``) and where that time went (``phases``: plan, roles, tables)."""

    scenario: Scenario
    step: RoleOps
    traffic: pd.DataFrame
    rank_matrix: pd.DataFrame
    seconds: float
    meta: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    @cached_property
    def ops(self) -> pd.DataFrame:
        """Every rank's ops (:func:`commscope.predict.ops.predict_ops`' table)."""
        return self.step.frame()

    @cached_property
    def node_matrix(self) -> pd.DataFrame:
        """Node x node bytes per traffic type, the complete grid (16.8 M rows at 2,048 nodes,
        so built on first use; :meth:`node_pairs` has the pairs that carry bytes)."""
        grid = node_grid(self.rank_matrix, self.scenario.nodes, by=["traffic"])
        return _with_params(self.scenario.params(), grid)

    def node_pairs(self) -> pd.DataFrame:
        """The node pairs (and traffic types) that exchange bytes: the non-zero rows of
        :attr:`node_matrix`, without the scenario's parameters."""
        return node_pairs(self.rank_matrix)

    def per_node(self) -> pd.DataFrame:
        """Per node and traffic type: the traffic table summed over the node's ranks."""
        return _sum_traffic(self.traffic, ["node", "traffic"])

    def totals(self) -> pd.DataFrame:
        """Per traffic type: the traffic table summed over every rank of the job."""
        return _sum_traffic(self.traffic, ["traffic"])

    def table(self) -> pd.DataFrame:
        """This scenario's rows of :func:`scenario_tables`."""
        return traffic_table(self.traffic, self.seconds)


def _sum_traffic(traffic: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    cols = ["messages", "bytes", "sent_bytes", "intra_node_bytes", "inter_node_bytes"]
    params = [c for c in SCENARIO_PARAM_COLUMNS if c in traffic.columns]
    out = traffic.groupby([*params, *keys], as_index=False, sort=True)[cols].sum()
    return out[[*params, *keys, *cols]]


def step_summary(step: RoleOps) -> pd.DataFrame:
    """:func:`commscope.predict.compare.summarize` of ``step.frame()``, from one rank per
    group of ranks whose summaries agree (:meth:`RoleOps.sent_classes`), repeated onto the
    others.

    The representatives are summarized together, in one table: pandas sums a group with
    ``np.add.reduceat`` when the rows are already in group order and with its compensated
    loop when they are not, and a table of one rank of every role is in group order exactly
    when the whole step's is, so each float comes out as the whole table's would.
    """
    classes = step.sent_classes(step.meta.get("backend") or DEFAULT_BACKEND)
    firsts = [int(ranks[0]) for ranks in classes]
    reps = summarize(step.frame(firsts))
    if reps.empty:
        return reps
    at = {r: np.flatnonzero(reps["rank"].to_numpy() == r) for r in firsts}
    rows = np.concatenate([np.tile(at[int(c[0])], len(c)) for c in classes])
    ranks = np.concatenate([np.repeat(c, len(at[int(c[0])])) for c in classes])
    out = reps.iloc[rows].reset_index(drop=True)
    out["rank"] = ranks
    out["node"] = ranks // step.ranks_per_node
    # summarize's order: rank, node, then traffic (each rank's rows are in traffic order).
    return out.sort_values("rank", kind="stable").reset_index(drop=True)


def predict_scenario(spec: dict[str, Any], name: str = "") -> ScenarioPrediction:
    """Predict one scenario (a spec as in :data:`SCENARIO_DEFAULTS`) on every rank.

    ``traffic`` has one row per rank and traffic type the rank takes part in;
    ``intra_node_bytes + inter_node_bytes == sent_bytes`` on every row, and the node matrix
    sums to the job's ``sent_bytes``. Pure arithmetic over one emulated rank per role
    (:mod:`commscope.predict.roles`): GPT-3B takes well under a second on 32 GPUs and seconds
    on 16,384 (benchmarks/predict.py).
    """
    t0 = time.perf_counter()
    sc = resolve_scenario(spec, name)
    t_plan = time.perf_counter()
    step = predict_step(sc.model, sc.plan, sc.nodes, sc.gpus_per_node, sc.dtype_bytes, sc.options)
    t_roles = time.perf_counter()
    params = sc.params()
    ranks = step_rank_matrix(step)
    summary = step_summary(step)
    # The ring model's transmitted bytes of each (rank, traffic), by where they go.
    local = ranks["src_node"] == ranks["dst_node"]
    split = (
        ranks.assign(
            intra_node_bytes=ranks["bytes"].where(local, 0.0),
            inter_node_bytes=ranks["bytes"].where(~local, 0.0),
        )
        .groupby(["src_rank", "traffic"], as_index=False)[["intra_node_bytes", "inter_node_bytes"]]
        .sum()
        .rename(columns={"src_rank": "rank"})
    )
    traffic = summary.merge(split, on=["rank", "traffic"], how="left").fillna(
        {"intra_node_bytes": 0.0, "inter_node_bytes": 0.0}
    )
    traffic["traffic"] = pd.Categorical(traffic["traffic"], categories=TRAFFIC_TYPES)
    traffic = traffic.sort_values(["rank", "traffic"]).reset_index(drop=True)
    traffic["traffic"] = traffic["traffic"].astype(str)
    traffic = with_params(params, traffic)[TRAFFIC_COLUMNS]
    ranks = _with_params(params, ranks)
    meta = {
        "scenario": name,
        "description": sc.description,
        "model": sc.model,
        "plan": asdict(sc.plan),
        "options": asdict(sc.options),
        "nodes": sc.nodes,
        "gpus_per_node": sc.gpus_per_node,
        "dtype_bytes": sc.dtype_bytes,
        "ops": step.n_ops(),
    }
    t_end = time.perf_counter()
    seconds = t_end - t0
    meta["predict_seconds"] = seconds
    phases = {"plan": t_plan - t0, "roles": t_roles - t_plan, "tables": t_end - t_roles}
    return ScenarioPrediction(sc, step, traffic, ranks, seconds, meta, phases)


def _with_params(params: dict[str, Any], frame: pd.DataFrame) -> pd.DataFrame:
    """:func:`commscope.contracts.with_params` (the same columns and dtypes) with each
    constant column taken from a one-row table instead of broadcast from a scalar, which
    for the strings of pandas' ``str`` dtype is several times cheaper at millions of rows."""
    one = pd.DataFrame(dict(params), index=[0])
    zeros = np.zeros(len(frame), dtype=np.intp)
    lead = {
        c: np.full(len(frame), one[c].iloc[0], dtype=one[c].dtype)
        if isinstance(one[c].dtype, np.dtype)
        else one[c].array.take(zeros)
        for c in one.columns
    }
    rest = frame.drop(columns=list(params), errors="ignore")
    out = pd.DataFrame({**lead, **{c: rest[c].array for c in rest.columns}}, index=frame.index)
    return out


def traffic_table(traffic: pd.DataFrame, seconds: float | None = None) -> pd.DataFrame:
    """One scenario's report rows from its traffic table: per traffic type (and ``all``),
    rank 0's messages, payload bytes and message sizes, the job's messages, payload and
    transmitted bytes, the intra/inter-node split and the inter-node share of transmitted
    bytes (NaN when nothing is transmitted)."""
    params = {
        c: traffic[c].iloc[0]
        for c in SCENARIO_PARAM_COLUMNS
        if c in traffic.columns and len(traffic)
    }
    per = _sum_traffic(traffic, ["traffic"]).drop(columns=list(params))
    order = {t: i for i, t in enumerate(TRAFFIC_TYPES)}
    per = per.sort_values("traffic", key=lambda t: t.map(order).fillna(len(order)))
    every = per.drop(columns="traffic").sum().to_frame().T.assign(traffic=ALL_TRAFFIC)
    job = pd.concat([per, every[per.columns]], ignore_index=True)
    r0 = traffic[traffic["rank"] == 0].set_index("traffic")
    job["rank0_messages"] = job["traffic"].map(r0["messages"]).fillna(0).astype("int64")
    job["rank0_bytes"] = job["traffic"].map(r0["bytes"]).fillna(0).astype("int64")
    job.loc[job["traffic"] == ALL_TRAFFIC, ["rank0_messages", "rank0_bytes"]] = [
        int(r0["messages"].sum()),
        int(r0["bytes"].sum()),
    ]
    job["rank0_sizes"] = job["traffic"].map(r0["sizes"]).fillna("")
    sent = job["sent_bytes"].astype("float64")
    job["inter_node_share"] = (job["inter_node_bytes"] / sent).where(sent > 0)
    job["messages"] = job["messages"].astype("int64")
    job["bytes"] = job["bytes"].astype("int64")
    job["predict_seconds"] = float("nan") if seconds is None else float(seconds)
    job = with_params(params, job)
    return job[[c for c in TABLE_COLUMNS if c in job.columns]]


@dataclass(frozen=True)
class ScenarioFiles:
    """Where one scenario's tables go: the traffic table, the node and rank matrices (parquet)
    and ``meta``, the resolved spec and the prediction time (JSON)."""

    traffic: Path
    node_matrix: Path
    rank_matrix: Path
    meta: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> ScenarioFiles:
        """The files of :data:`commscope.contracts.SCENARIO_FILES` inside ``out_dir`` (a
        directory of ``commscope predict --out``; the workflow declares its own paths)."""
        return cls(**{name: Path(out_dir) / file for name, file in SCENARIO_FILES.items()})

    def paths(self) -> list[Path]:
        return [self.traffic, self.node_matrix, self.rank_matrix, self.meta]


def write_scenario(pred: ScenarioPrediction, out: Path | ScenarioFiles) -> list[Path]:
    """Write the traffic table, node and rank matrices and the scenario's JSON (the resolved
    spec and the prediction time) to ``out``: its files, or
    :data:`commscope.contracts.SCENARIO_FILES` in a directory."""
    files = out if isinstance(out, ScenarioFiles) else ScenarioFiles.in_dir(out)
    for path in files.paths():
        path.parent.mkdir(parents=True, exist_ok=True)
    pred.traffic.to_parquet(files.traffic, index=False)
    pred.node_matrix.to_parquet(files.node_matrix, index=False)
    pred.rank_matrix.to_parquet(files.rank_matrix, index=False)
    files.meta.write_text(json.dumps(pred.meta, indent=1, sort_keys=True, default=str) + "\n")
    return files.paths()


def run_scenario(name: str, spec: dict[str, Any], out: Path | ScenarioFiles) -> ScenarioPrediction:
    """Predict scenario ``name`` and write its tables (:func:`write_scenario`); logs the time."""
    pred = predict_scenario(spec, name)
    write_scenario(pred, out)
    sc = pred.scenario
    logging.getLogger("commscope").info(
        "scenario %s: %s (p, t, d) = (%d, %d, %d) mapping %s on %d nodes x %d GPUs: %d ops "
        "predicted in %.2f s",
        name,
        sc.model_name,
        sc.plan.pp,
        sc.plan.tp,
        sc.plan.dp,
        sc.plan.mapping,
        sc.nodes,
        sc.gpus_per_node,
        pred.meta["ops"],
        pred.seconds,
    )
    return pred


def scenario_tables(dirs: Sequence[Path]) -> pd.DataFrame:
    """The compact report table of scenarios written into directories (:func:`write_scenario`
    with a directory), in the order the directories are given (:func:`scenario_files_table`)."""
    files = [ScenarioFiles.in_dir(d) for d in dirs]
    return scenario_files_table([f.traffic for f in files], [f.meta for f in files])


def scenario_files_table(traffic: Sequence[Path], meta: Sequence[Path]) -> pd.DataFrame:
    """The compact report table of written scenarios, from each one's traffic table and JSON
    (``meta[i]`` belongs to ``traffic[i]``; a missing one leaves ``predict_seconds`` NaN): one
    row per scenario and traffic type (plus ``all``), columns :data:`TABLE_COLUMNS`, in the
    order given."""
    frames = []
    for traffic_path, meta_path in zip(map(Path, traffic), map(Path, meta), strict=True):
        table = pd.read_parquet(traffic_path)
        if table.empty:
            continue
        info = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        frames.append(traffic_table(table, info.get("predict_seconds")))
    if not frames:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def write_scenario_table(
    traffic: Sequence[Path], meta: Sequence[Path], out_parquet: Path
) -> pd.DataFrame:
    """:func:`scenario_files_table` written to ``out_parquet``."""
    table = scenario_files_table(traffic, meta)
    Path(out_parquet).parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out_parquet, index=False)
    return table
