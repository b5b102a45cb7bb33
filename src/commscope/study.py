"""Every check the workflow runs on a study's configuration before any job starts, in one
place: the Snakefile and ``commscope check`` both call :func:`study_checks`, so they accept and
refuse the same configs with the same messages."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from commscope.cluster.provision import load_inventory
from commscope.config import ConfigError, check_study
from commscope.experiment.readiness import local_engine_problem
from commscope.predict.scenarios import resolve_scenario
from commscope.spec.link import LINK_AXES, LinkSetting, ReferenceLink
from commscope.spec.settings import MICROBENCH_SCOPE_KEYS, MicrobenchSettings


def study_checks(config: dict[str, Any], root: Path | None = None) -> pd.DataFrame:
    """Check a schema-validated config as the workflow does; return its cells.

    The sweep's combinations (:func:`commscope.config.check_study`), with the cluster's size
    from the ssh inventory (loaded and validated by its schema) or, for the netns backend,
    whether the link engine can run here and whether each cell's training state fits this
    machine's memory; the microbenchmark's settings and listed links; every prediction
    scenario; and that every imported trace's files exist under ``root`` (the working
    directory). Raises :class:`~commscope.config.ConfigError` naming the key and the fix.
    """
    root = Path(root or Path.cwd())
    cluster = config.get("cluster") or {}
    if cluster.get("backend", "netns") == "ssh":
        try:
            nodes = load_inventory(root / cluster["inventory"])
        except (ValueError, FileNotFoundError) as err:
            raise ConfigError(f"cluster.inventory: {err}") from None
        cells = check_study(config, max_nodes=len(nodes))
    else:
        # Every node of the netns cluster is this machine: a cell's ranks share its memory.
        cells = check_study(
            config, engine_problem=local_engine_problem, memory_bytes=machine_memory_bytes()
        )
    problems = []
    bench = config.get("microbench") or {}
    links = bench.get("links", "sweep")
    for i, link in enumerate(links if isinstance(links, list) else []):
        try:
            LinkSetting.from_mapping(link).shape()
        except ValueError as err:
            problems.append(f"microbench.links[{i}]: {err}")
    try:
        MicrobenchSettings.from_mapping(
            {k: v for k, v in bench.items() if k not in MICROBENCH_SCOPE_KEYS}
        )
    except ValueError as err:
        problems.append(f"microbench: {err}")
    problems.extend(reference_link_problems(config.get("reference_link"), cells))
    for name, spec in sorted((config.get("predictions") or {}).items()):
        try:
            resolve_scenario(dict(spec), name)
        except ValueError as err:
            problems.append(f"predictions.{name}: {err}")
    for name, entry in sorted((config.get("imports") or {}).items()):
        for i, path in enumerate(entry.get("paths") or []):
            if not (root / path).is_file():
                problems.append(
                    f"imports.{name}.paths[{i}]: {path} does not exist (paths are relative to "
                    f"{root})"
                )
    if problems:
        raise ConfigError("invalid study configuration:\n  - " + "\n  - ".join(problems))
    return cells


def reference_link_problems(entry: dict[str, Any] | None, cells: pd.DataFrame) -> list[str]:
    """What is wrong with the config's ``reference_link`` (none when absent): a value the link
    model refuses, or a sweep with no cell on it (every slowdown would lack its baseline). A
    cell is on it when its link parses to the same shape (``0ms`` and ``0us`` alike)."""
    try:
        reference = ReferenceLink.from_config(entry)
    except ValueError as err:
        return [str(err)]
    if reference is None or cells.empty or not set(LINK_AXES) <= set(cells.columns):
        return []
    # The congestion control belongs to the setup, not the link: a BBR cell on the cap is on it.
    target = reference.shape()
    cc = target.cc
    links = cells[list(LINK_AXES)].drop_duplicates()
    if any(
        replace(LinkSetting.from_wildcards(dict(zip(LINK_AXES, row, strict=True))).shape(), cc=cc)
        == target
        for row in links.itertuples(index=False, name=None)
    ):
        return []
    link = {k: v for k, v in reference.setting.as_dict().items() if k != "cc"}
    return [
        f"reference_link: no sweep cell runs on {link} ({reference.name}), so no setting "
        "would have a baseline; add a sweep block on that link (e.g. its bw in a block's bw "
        "list) or remove reference_link to measure against the unshaped link"
    ]


def machine_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """This machine's memory (``MemTotal``), or None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
