"""The study configuration: sweep cells and the checks that run before anything touches a node.

The JSON schema (workflow/schemas/config.schema.yaml) catches unknown keys, wrong types and
malformed values; :func:`check_study` catches combinations the schema cannot express (a
strategy's degrees against the world size, a model that does not exist, delay on a kernel
without netem) and names the key and the fix.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from commscope.contracts import REPLAY_STRATEGY, SWEEP_AXES, is_replay
from commscope.spec.link import LINK_AXES, LINK_DEFAULTS, LinkSetting
from commscope.spec.models import MAX_MODEL_PARAMS, TRAIN_BYTES_PER_PARAM, param_count
from commscope.spec.plan import BUILTIN_STRATEGIES, ParallelPlan, mapping_problem, validate_cell
from commscope.spec.schema_errors import MAX_PROBLEMS, SchemaProblem, schema_problems
from commscope.spec.settings import ClusterSettings, subnet_problem
from commscope.spec.topology import Topology
from commscope.units import fmt_bytes

if TYPE_CHECKING:
    # pandas is imported where a study's cells are tabulated, not with this module: every node
    # program and cell job imports it (cell_id, the schema), and pandas costs them 0.6 s each.
    import pandas as pd

__all__ = [
    "AXIS_DEFAULTS",
    "SCHEMA_PATH",
    "ConfigError",
    "StudyEstimate",
    "cell_id",
    "cells_frame",
    "check_study",
    "estimate_study",
    "filled_cell",
    "load_config",
    "path_escapes",
    "read_yaml",
    "replay_source_cell",
    "strategy_names",
    "strategy_spec",
    "sweep_blocks",
    "validate_config",
]

# The schema is the workflow's, not the package's: the Snakefile passes its own path
# (relative to itself). This default, relative to the working directory like the CLI's
# default config/config.yaml, serves `commscope check` and tests run from the repository root.
SCHEMA_PATH = Path("workflow") / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration problem, with the key that causes it and how to fix it."""


def validate_config(
    config: dict[str, Any], schema_path: str | Path = SCHEMA_PATH, what: str = "config key"
) -> dict[str, Any]:
    """Validate against the schema with Snakemake's validator (fills defaults in place).

    ``schema_path`` is the workflow's schema; the Snakefile passes its own, the default is
    relative to the working directory (the repository root). On failure the message lists each
    problem on one line: the key's path (``sweep[2].bandwidth``), what is wrong, and for an
    unknown key the closest known one (:func:`commscope.spec.schema_errors.schema_problems`,
    which follows the branch of a ``oneOf`` the value was meant for instead of jsonschema's
    whole-instance "not valid under any of the given schemas"). ``what`` leads each line
    (another document validated the same way names itself).
    """
    import jsonschema
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema_path = Path(schema_path)
    if not schema_path.is_file():
        raise ConfigError(
            f"schema {schema_path} not found (from {Path.cwd()}): run in the repository root "
            "or pass the workflow's schema, workflow/schemas/config.schema.yaml"
        )
    # Our pass first, with the schema parsed once per process: it finds every problem and
    # words it; Snakemake's pass then fills the defaults (and re-reads the schema each time).
    schema = _load_schema(schema_path.resolve(), schema_path.stat().st_mtime_ns)
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    problems = schema_problems(errors, schema, AXIS_DEFAULTS)
    if problems:
        raise ConfigError(_problem_lines(problems, what, schema_path.name))
    try:
        validate(config, str(schema_path), set_default=True)
    except WorkflowError as err:  # what our pass let through (none known): Snakemake's words
        raise ConfigError(str(err)) from None
    return config


@functools.lru_cache(maxsize=8)
def _load_schema(path: Path, mtime_ns: int) -> dict[str, Any]:
    """The schema at ``path`` as of ``mtime_ns`` (its modification time: an edit reloads it).
    Callers only read it."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _problem_lines(problems: list[SchemaProblem], what: str, schema_name: str) -> str:
    """One line for one problem; a count and one line each (at most MAX_PROBLEMS) for more."""
    if len(problems) == 1:
        return f"{problems[0].line(what)} (schema: {schema_name})"
    lines = [p.line(what) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        lines.append(f"... and {len(problems) - MAX_PROBLEMS} more")
    return f"{len(problems)} problems (schema: {schema_name}):\n  - " + "\n  - ".join(lines)


class _StrictLoader(yaml.SafeLoader):
    """YAML as a config should be: no anchors or aliases (a 5 kB alias bomb expands to
    gigabytes), no duplicate keys (PyYAML keeps the last one silently)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "anchors and aliases (&name, *name) are not allowed in a study config: write "
                "the values out",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1}): YAML would "
                    "keep only the last; remove one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's YAML, strictly: UTF-8, no anchors, aliases, duplicate keys or Python
    tags, a mapping at the top. Any problem is a :class:`ConfigError` that names the file, line
    and column and says what to change (never a traceback)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}, line {line}: byte 0x{raw[err.start]:02x} is not UTF-8; save the file as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no Python objects
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = err.problem or err.context or "not valid YAML"
        if "'\\t'" in problem:  # PyYAML names the character, not the habit
            problem += " (indent with spaces, not tabs)"
        raise ConfigError(f"{path}{where}: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a config is a mapping of keys (cluster:, sweep:, ...), got a "
            f"{type(data).__name__}"
        )
    return data


def load_config(path: Path, schema_path: str | Path = SCHEMA_PATH) -> dict[str, Any]:
    """Read a YAML config strictly (:func:`read_yaml`) and validate it; semantic checks are
    separate (:func:`check_study`)."""
    return validate_config(read_yaml(path), schema_path)


# Axes a sweep block may leave out (the schema's defaults, also inside a list of blocks).
AXIS_DEFAULTS: dict[str, list[Any]] = {
    **{axis: [value] for axis, value in LINK_DEFAULTS.items()},
    "repeat": [0],
}


def sweep_blocks(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep as a list of blocks (a single block is a list of one)."""
    sweep = config["sweep"]
    return list(sweep) if isinstance(sweep, list) else [sweep]


def cells_frame(config: dict[str, Any]) -> pd.DataFrame:
    """All sweep cells: the union of each block's cartesian product, axes in a fixed order."""
    import pandas as pd

    frames = []
    for i, block in enumerate(sweep_blocks(config)):
        axes = [block.get(axis, AXIS_DEFAULTS.get(axis)) for axis in SWEEP_AXES]
        frame = pd.DataFrame(list(itertools.product(*axes)), columns=list(SWEEP_AXES))
        duplicated = frame.duplicated()
        if duplicated.any():
            raise ConfigError(
                f"sweep block {i}: duplicate values in an axis produce the same cell twice "
                f"(e.g. {frame[duplicated].iloc[0].to_dict()}); list each value once"
            )
        frames.append(frame)
    # Blocks may overlap on purpose (a baseline cell in two comparisons): run it once.
    return pd.concat(frames, ignore_index=True).drop_duplicates(ignore_index=True)


def _uncapped(bw: str) -> bool:
    """Whether the sweep's ``bw`` value means no cap (a value that does not parse is not
    this check's to report)."""
    try:
        return LinkSetting(bw).shape().rate_bps is None
    except ValueError:
        return False


def _node_override_problems(topology: Topology, cells: pd.DataFrame) -> list[str]:
    """Node overrides no cell runs on (silently unused), and overrides that do not hold with a
    cell's own shape (a node's jitter above the cell's delay)."""
    problems = []
    used: set[int] = set()
    axes = ["nodes", *LINK_AXES]
    for values in cells[axes].drop_duplicates().itertuples(index=False):
        row = dict(zip(axes, values, strict=True))
        placed = topology.place(int(row.pop("nodes")))
        used.update(placed)
        try:
            shape = LinkSetting.from_mapping({k: str(v) for k, v in row.items()}).shape()
        except ValueError:
            continue  # the link axes' own check names it
        for node in placed:
            if f"node{node}" not in topology.links:
                continue
            try:
                topology.node_shape(node, shape)
            except ValueError as err:
                problems.append(
                    f"cluster.topology.links.node{node}: with the cell's link "
                    f"({shape.describe()}): {err}"
                )
    for name in sorted(topology.links):
        if name.startswith("node") and int(name.removeprefix("node")) not in used:
            problems.append(
                f"cluster.topology.links.{name}: no cell runs on {name} (placement "
                f"{topology.placement}, at most {int(cells['nodes'].max())} nodes a cell): "
                "remove it, raise sweep.nodes or use placement: spread"
            )
    return problems


def _topology_problems(config: dict[str, Any], cells: pd.DataFrame) -> list[str]:
    """Cells the configured topology cannot carry: more nodes than its racks hold, an
    oversubscription with no node rate to derive the uplinks from, real hosts."""
    try:
        cluster = ClusterSettings.from_mapping(config.get("cluster", {}))
    except ValueError as err:
        return [str(err)]
    topology = cluster.topology
    if not topology.leaf_spine:
        return []
    problems = []
    if cluster.backend != "netns":
        problems.append(
            "cluster.topology: kind leaf-spine is built on the netns backend only so far; "
            "remove cluster.topology or use backend: netns"
        )
    most = int(cells["nodes"].max())
    if topology.capacity is not None and most > topology.capacity:
        problems.append(
            f"cluster.topology: {topology.racks} racks x {topology.nodes_per_rack} nodes hold "
            f"{topology.capacity} nodes, the sweep asks for {most} (sweep.nodes): raise racks "
            "or nodes_per_rack, or lower sweep.nodes"
        )
    problems += _node_override_problems(topology, cells)
    if topology.oversubscription is not None:
        uncapped = sorted({str(b) for b in set(cells["bw"]) if _uncapped(str(b))})
        if uncapped:
            problems.append(
                f"cluster.topology.oversubscription: the uplink rate follows from the nodes' "
                f"rate, and sweep.bw has uncapped values {uncapped}: cap every cell (e.g. "
                "bw: [1gbit]) or set cluster.topology.uplink_bw instead"
            )
    return problems


def check_study(
    config: dict[str, Any],
    max_nodes: int | None = None,
    engine_problem: Callable[[str], str] | None = None,
    memory_bytes: int | None = None,
) -> pd.DataFrame:
    """Check every cell for impossible combinations; return the cells frame if all are fine.

    ``max_nodes`` is how many nodes the cluster can have (the inventory size for ssh);
    ``engine_problem`` is asked, with ``run.link_engine``, only if some cell has delay, jitter
    or loss: why that engine cannot run on the nodes ('' when it can). ``memory_bytes`` is the
    memory every rank of a cell shares (this machine's, for the netns cluster; None: unknown):
    a cell whose model's training state alone would not fit is refused.
    """
    cells = cells_frame(config)
    if len(cells) > MAX_CELLS:
        raise ConfigError(
            f"sweep: {len(cells)} cells, more than {MAX_CELLS}; check the axes for a value "
            "pasted too often, or split the study into several configs"
        )
    problems: list[str] = []
    models = config["models"]
    replay = is_replay(cells)
    for name in sorted(set(cells.loc[~replay, "model"]) - set(models)):
        problems.append(
            f"sweep.model: {name!r} is not defined under models: (defined: {sorted(models)})"
        )
    problems += _replay_problems(config, cells)
    too_large = _model_size_problems(models)
    problems += list(too_large.values())
    bad_plans = _mapping_problems(config)
    problems += list(bad_plans.values())
    if max_nodes is not None and cells["nodes"].max() > max_nodes:
        problems.append(
            f"sweep.nodes: {int(cells['nodes'].max())} nodes asked for but the cluster has "
            f"{max_nodes}; lower sweep.nodes or add hosts to the inventory"
        )
    problems += _topology_problems(config, cells)
    for name in sorted(set(cells["strategy"]) - set(strategy_names(config)) - {REPLAY_STRATEGY}):
        problems.append(
            f"sweep.strategy: {name!r} is neither built in nor defined under strategies: "
            f"(available: {sorted(strategy_names(config))})"
        )
    seen: set[tuple] = set()
    # model -> (most bytes one of its cells needs, that cell, how many cells do not fit)
    short_of_memory: dict[str, tuple[int, str, int]] = {}
    for cell in cells[~replay].itertuples(index=False):
        world = int(cell.nodes * cell.ranks_per_node)
        key = (cell.strategy, cell.model, world)
        if (
            cell.model not in models
            or cell.strategy not in strategy_names(config)
            or f"strategies.{cell.strategy}" in bad_plans  # named once, by its key
            or key in seen
        ):
            continue
        seen.add(key)
        where = (
            f"cell strategy={cell.strategy} model={cell.model} nodes={cell.nodes} "
            f"ranks_per_node={cell.ranks_per_node} (world {world})"
        )
        plan = strategy_spec(config, cell.strategy)
        msgs = validate_cell(models[cell.model], plan, world)
        problems += [f"{where}: {msg}" for msg in msgs]
        if not msgs and memory_bytes is not None and cell.model not in too_large:
            need = _state_bytes(models[cell.model], plan, world)
            most, most_where, count = short_of_memory.get(cell.model, (0, "", 0))
            if need > memory_bytes:
                short_of_memory[cell.model] = (
                    max(need, most),
                    where if need > most else most_where,
                    count + 1,
                )
    for name, (need, where, count) in sorted(short_of_memory.items()):
        problems.append(
            f"models.{name}: {param_count(models[name]):.2g} parameters do not fit {count} "
            f"cell(s): {where} needs at least {_size(need)} of weights, gradients and AdamW "
            f"state ({TRAIN_BYTES_PER_PARAM} B a parameter, a copy per DDP replica), more than "
            f"the {_size(memory_bytes)} of memory its ranks share; use a smaller model or fewer "
            "data-parallel replicas"
        )
    cluster = config.get("cluster") or {}
    if cluster.get("backend", "netns") == "netns":
        nets = {}
        for field in ("mgmt_subnet", "exp_subnet"):
            value = str(cluster.get(field, getattr(ClusterSettings, field)))
            why = subnet_problem(value, f"cluster.{field}")
            if why:
                problems.append(why)
            else:
                nets[field] = ipaddress.ip_network(value)
        if len(nets) == 2 and nets["mgmt_subnet"].overlaps(nets["exp_subnet"]):
            problems.append(
                f"cluster.mgmt_subnet={nets['mgmt_subnet']} and cluster.exp_subnet="
                f"{nets['exp_subnet']} overlap; give each its own subnet"
            )
    shapes = {}
    for cell in cells[list(LINK_AXES)].drop_duplicates().itertuples(index=False):
        try:
            shapes[cell] = LinkSetting(*cell).shape()
        except ValueError as err:
            problems.append(f"{_block_of(config, dict(zip(LINK_AXES, cell, strict=True)))}: {err}")
    if engine_problem is not None and any(s.impaired for s in shapes.values()):
        why = engine_problem(str((config.get("run") or {}).get("link_engine", "auto")))
        if why:
            problems.append(why)
    if problems:
        raise ConfigError("invalid study configuration:\n  - " + "\n  - ".join(problems))
    return cells


def _block_of(config: dict[str, Any], values: dict[str, Any]) -> str:
    """The key of the first sweep block whose axes hold ``values`` (``sweep[2]``, or ``sweep``
    for a single block), so a problem of one link setting names where it is written."""
    blocks = sweep_blocks(config)
    for i, block in enumerate(blocks):
        if all(v in block.get(a, AXIS_DEFAULTS.get(a, [])) for a, v in values.items()):
            return f"sweep[{i}]" if isinstance(config["sweep"], list) else "sweep"
    return "sweep"


def _mapping_problems(config: dict[str, Any]) -> dict[str, str]:
    """Plans whose ``mapping`` names a dimension twice (``dp-dp-tp``; the schema's pattern
    admits it), by the key that holds them: ``{"strategies.NAME": problem}``, and so for
    ``predictions``. The problem names the key and says how to write a mapping."""
    out = {}
    for section in ("strategies", "predictions"):
        for name, entry in sorted((config.get(section) or {}).items()):
            why = mapping_problem(str((entry or {}).get("mapping", "")))
            if why:
                out[f"{section}.{name}"] = f"{section}.{name}.mapping: {why}"
    return out


# The shape keys that make a model large, named when it is too large.
_SIZE_KEYS = ("layers", "hidden", "ffn_mult", "vocab", "seq", "experts", "num_classes")


def _model_size_problems(models: dict[str, Any]) -> dict[str, str]:
    """Models with more than :data:`MAX_MODEL_PARAMS` parameters, by name, naming the shape."""
    problems = {}
    for name, spec in sorted(models.items()):
        try:
            params = param_count(spec)
        except (TypeError, ValueError, KeyError):
            continue  # a shape the schema or validate_cell refuses with its own message
        if params > MAX_MODEL_PARAMS:
            shape = ", ".join(f"{k}={spec[k]}" for k in _SIZE_KEYS if k in spec)
            problems[name] = (
                f"models.{name}: {params:.2g} parameters ({shape}), "
                f"{_size(params * TRAIN_BYTES_PER_PARAM)} of weights, gradients and AdamW state; "
                f"a model may have at most {MAX_MODEL_PARAMS:.0e} parameters: lower hidden, "
                "layers or vocab"
            )
    return problems


def _state_bytes(model: dict[str, Any], plan_spec: dict[str, Any], world: int) -> int:
    """The least training state a cell's ranks hold together: one copy of the model per DDP
    replica (TP, PP, EP and FSDP shard it, so one copy is the least any plan holds), at
    :data:`TRAIN_BYTES_PER_PARAM` a parameter; 0 where the plan or model does not resolve."""
    try:
        plan = ParallelPlan.from_dict(plan_spec).resolve(world)
        params = param_count(model)
    except (TypeError, ValueError, KeyError):
        return 0
    return params * TRAIN_BYTES_PER_PARAM * (plan.dp if plan.dp_kind == "ddp" else 1)


def _size(nbytes: float) -> str:
    """Bytes for a config message: TB past a thousand GB (a typo's model reaches petabytes)."""
    return f"{nbytes / 1e12:,.0f} TB" if nbytes >= 1e12 else fmt_bytes(nbytes, 1)


def replay_source_cell(config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The sweep values of the measured cell replay ``name`` replays, link axes and repeat
    filled with their defaults; None when its source is not a cell."""
    source = config["replays"][name]["source"]
    return filled_cell(source["cell"]) if "cell" in source else None


def filled_cell(values: dict[str, Any]) -> dict[str, Any]:
    """A cell's sweep values with the axes a sweep block may leave out (link axes, repeat)
    given their defaults, in :data:`SWEEP_AXES` order."""
    filled = {axis: default[0] for axis, default in AXIS_DEFAULTS.items()}
    return {axis: {**filled, **values}[axis] for axis in SWEEP_AXES}


def _replay_problems(config: dict[str, Any], cells: pd.DataFrame) -> list[str]:
    """Replays named by the sweep but not defined, sources that do not exist in this study,
    placements that do not fit the cells that run them, and a strategy that takes the
    reserved name. The trace's own checks (its ranks against the placement, ops the backend
    cannot run, memory) run when each cell's program is built, before the cell runs."""
    import pandas as pd

    problems = []
    replays = config.get("replays") or {}
    if REPLAY_STRATEGY in (config.get("strategies") or {}):
        problems.append(
            f"strategies.{REPLAY_STRATEGY}: the name is reserved for replay cells; rename it"
        )
    used = cells[is_replay(cells)]
    for name in sorted(set(used["model"]) - set(replays)):
        problems.append(
            f"sweep.model: {name!r} (strategy replay) is not defined under replays: "
            f"(defined: {sorted(replays)})"
        )
    measured = {tuple(c) for c in cells[list(SWEEP_AXES)].itertuples(index=False)}
    # Only the replays the sweep runs: a study merged over another (config/full.yaml) keeps
    # the other's entries without running them.
    for name, entry in sorted((n, e) for n, e in replays.items() if n in set(used["model"])):
        source = entry["source"]
        kind, ref = next(iter(source.items()))
        where = f"replays.{name}.source.{kind}"
        if kind == "import" and ref not in (config.get("imports") or {}):
            problems.append(f"{where}: {ref!r} is not defined under imports:")
        elif kind == "prediction" and ref not in (config.get("predictions") or {}):
            problems.append(f"{where}: {ref!r} is not defined under predictions:")
        elif kind == "cell":
            cell = replay_source_cell(config, name)
            if is_replay(cell):
                problems.append(f"{where}: a replay cell cannot be a replay's source")
            elif tuple(cell[a] for a in SWEEP_AXES) not in measured:
                problems.append(
                    f"{where}: {cell_id(cell)} is not a cell of this study's sweep; add it "
                    "to a sweep block (or give the axes it was run with)"
                )
        for cell in used[used["model"] == name].itertuples(index=False):
            ranks = entry.get("ranks")
            if ranks is None:
                continue
            per_node = pd.Series(ranks).value_counts()
            if max(ranks) >= cell.nodes or (per_node != cell.ranks_per_node).any():
                problems.append(
                    f"replays.{name}.ranks: {ranks} does not put ranks_per_node="
                    f"{cell.ranks_per_node} ranks on each of the cell's nodes={cell.nodes}; "
                    "list the node of every trace rank, each node as often as ranks_per_node"
                )
    return problems


def path_escapes(pattern: str, constrained: set[str], root: str = "results") -> str | None:
    """Why a rule's output (or log) path ``pattern`` could land outside ``root/``, or None.

    It must be relative, start with ``root/``, have no ``..`` component, and use only
    wildcards in ``constrained`` (those limited to one safe path component, so no value can
    add a ``/`` or be ``..``); then every path the rule writes resolves under ``root/``.
    """
    parts = Path(pattern).parts
    if Path(pattern).is_absolute() or not parts or parts[0] != root:
        return f"{pattern}: not under {root}/"
    if ".." in parts:
        return f"{pattern}: has a '..' component"
    loose = sorted(set(re.findall(r"{(\w+)[^}]*}", pattern)) - constrained)
    if loose:
        return f"{pattern}: wildcards {loose} are not limited to one path component"
    return None


# A sweep larger than this is refused: it is a typo (an axis pasted twice) more often than a
# study, and each cell is a directory tree of ~40 files.
MAX_CELLS = 5000
# Cluster seconds per cell and per microbenchmark link when no earlier run of this checkout
# measured any: this machine's default study (session 7: median 7.6 s a cell, ~35 s a link).
DEFAULT_CELL_S = 8.0
DEFAULT_LINK_S = 35.0
# Host seconds of each cell's analysis (analyse_cell, prediction, status),
# which runs between measurements, never beside one (issue 25, isolation): measured on this
# 2-core machine's default study (docs/measurements.md), wall time of the whole study less its
# measurements, per cell: 16 s with 103 cells, 10.5 s with 76 after each status stopped starting
# a Snakemake of its own and the scheduler stopped re-running every second, 8 s (7.6 and 8.3 in
# two studies) once the per-cell jobs stopped importing seaborn, SSH and pandas they do not use,
# 6.5 s (6.2 and 6.6) with parse, metrics, figure and export in one job a cell (analyse_cell),
# which since session 15 also predicts the cell (predict_cell's own job is gone): 5.7 and
# 5.9 s (387 and 402 s over 68 cells, study-wide jobs included).
ANALYSIS_CELL_S = 5.8


@dataclass(frozen=True)
class StudyEstimate:
    """How much of a study is left and roughly how long its cluster work takes."""

    cells: int
    done: int
    cell_s: float  # cluster seconds of the cells still to run
    links: int
    links_done: int
    link_s: float  # and of the microbenchmark links still to run
    measured: bool  # the per-cell times come from an earlier run here, not the default

    @property
    def analysis_s(self) -> float:
        """Host seconds of the analysis of the cells still to run (:data:`ANALYSIS_CELL_S`
        each): it runs between measurements, so it adds to their time."""
        return (self.cells - self.done) * ANALYSIS_CELL_S

    def describe(self) -> str:
        """One line for ``commscope check``."""
        basis = "this checkout's earlier run times" if self.measured else "default times"
        cluster = (self.cell_s + self.link_s) / 60
        return (
            f"{self.cells} cells ({self.done} already done), {self.links} microbenchmark links "
            f"({self.links_done} done): about {cluster:.0f} min of cluster time left, from "
            f"{basis}, and about {self.analysis_s / 60:.0f} min of analysis, which runs "
            "between the measurements, never beside one"
        )


def _benchmark_s(path: Path) -> float | None:
    """Wall seconds a Snakemake ``benchmark:`` file recorded (its ``s`` column), if any."""
    try:
        lines = path.read_text().splitlines()
        return float(lines[1].split("\t")[0])
    except (OSError, IndexError, ValueError):
        return None


def _run_rule(cell: Mapping[str, Any]) -> str:
    """The workflow rule that runs ``cell`` (workflow/rules/run.smk)."""
    return "run_replay_cell" if is_replay(cell) else "run_cell"


def estimate_study(cells: pd.DataFrame, links: list[str], results: Path) -> StudyEstimate:
    """Cells and microbenchmark ``links`` (link ids) still to run below ``results`` (a cell is
    done when its ``runs/<cell>/raw/run.json`` exists, a link when its ``fit.parquet`` does),
    and their cluster time: each one's own earlier time from ``benchmarks/`` where recorded,
    else the median of those recorded, else :data:`DEFAULT_CELL_S` / :data:`DEFAULT_LINK_S`."""
    import pandas as pd

    records = cells.to_dict("records")
    ids = [cell_id(row) for row in records]
    # Each cell's own rule's benchmark (run_cell, or run_replay_cell for a replay cell).
    times = {
        c: _benchmark_s(results / "benchmarks" / _run_rule(row) / f"{c}.tsv")
        for c, row in zip(ids, records, strict=True)
    }
    known = [t for t in times.values() if t is not None]
    typical = float(pd.Series(known).median()) if known else DEFAULT_CELL_S
    todo = [c for c in ids if not (results / "runs" / c / "raw" / "run.json").exists()]
    cell_s = sum(times[c] if times[c] is not None else typical for c in todo)
    link_times = {
        lid: _benchmark_s(results / "benchmarks" / "microbench_run" / f"{lid}.tsv") for lid in links
    }
    link_known = [t for t in link_times.values() if t is not None]
    link_typical = float(pd.Series(link_known).median()) if link_known else DEFAULT_LINK_S
    links_todo = [
        lid for lid in links if not (results / "microbench" / lid / "fit.parquet").exists()
    ]
    link_s = sum(
        link_times[lid] if link_times[lid] is not None else link_typical for lid in links_todo
    )
    return StudyEstimate(
        cells=len(ids),
        done=len(ids) - len(todo),
        cell_s=cell_s,
        links=len(links),
        links_done=len(links) - len(links_todo),
        link_s=link_s,
        measured=bool(known),
    )


def strategy_names(config: dict[str, Any]) -> set[str]:
    """Strategy names a sweep may use: the built-ins plus the config's own."""
    return set(BUILTIN_STRATEGIES) | set(config.get("strategies") or {})


def strategy_spec(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The definition of strategy ``name``: the config's entry, else the built-in."""
    own = (config.get("strategies") or {}).get(name)
    return dict(own if own is not None else BUILTIN_STRATEGIES[name])


def cell_id(cell: dict[str, Any]) -> str:
    """Path of a cell below results/runs/: one ``axis~value`` directory per axis, in order."""
    return "/".join(f"{axis}~{cell[axis]}" for axis in SWEEP_AXES)


def cell_axes(cell: str) -> dict[str, str]:
    """A cell's axis values (as written) from its path below results/runs/: :func:`cell_id`'s
    inverse."""
    return dict(part.split("~", 1) for part in cell.split("/") if "~" in part)
