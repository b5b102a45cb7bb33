"""The report's abstract: what ran on what, computed from the summary and the config, in plain
words (hardware, emulation, models, strategies, what was swept and how often). Nothing here is
typed by hand: a study with other models, links or repeats reads differently."""

from __future__ import annotations

import platform
from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.metrics.study import host_limited_mask, link_number_columns
from commscope.report.results import StudyResults
from commscope.report.sections._base import baseline_link
from commscope.spec.link import LINK_NUMBER_COLUMNS
from commscope.units import fmt_count, is_missing


def _join(words: list[str]) -> str:
    if len(words) <= 2:
        return " and ".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def _values(numbers: pd.Series, unit: str, scale: float = 1.0) -> str:
    vals = sorted({float(v) * scale for v in numbers.dropna() if float(v) > 0})
    return ", ".join(f"{v:g}" for v in vals) + f" {unit}" if vals else ""


def model_words(name: str, spec: dict[str, Any]) -> str:
    """One model in words from its config entry: ``"gpt-tiny (a 4-layer transformer, hidden
    128)"``."""
    kind = spec.get("kind", "gpt")
    if kind == "resnet50":
        return f"{name} (ResNet-50 on {spec.get('image', '?')}-pixel images)"
    if kind == "moe":
        return (
            f"{name} (a {spec.get('layers', '?')}-layer mixture of experts, "
            f"{spec.get('experts', '?')} experts, top-{spec.get('top_k', '?')})"
        )
    layers, hidden = spec.get("layers", "?"), spec.get("hidden", "?")
    return f"{name} (a {layers}-layer transformer, hidden {hidden})"


def abstract_sentences(results: StudyResults) -> list[str]:
    """The abstract, sentence by sentence; nothing without cells."""
    summary = results.summary
    config = results.config
    if summary.empty:
        return []
    training = summary[~is_replay(summary)]
    replays = summary[is_replay(summary)]
    sentences = []
    # Hardware and emulation.
    cpus = summary["host_cpus"].max() if "host_cpus" in summary else float("nan")
    cores = f"{fmt_count(cpus)} CPUs, " if not is_missing(cpus) else ""
    engines = (
        sorted({str(e) for e in summary["link_engine"].dropna() if str(e)})
        if "link_engine" in summary
        else []
    )
    engine_words = {"netem": "the kernel's netem", "nfqueue": "a user-space NFQUEUE delayer"}
    shaping = "the bandwidth cap by a token bucket on each node's interface"
    if engines:
        shaping += ", delay, jitter and loss by " + _join([engine_words.get(e, e) for e in engines])
    sentences.append(
        "Every node of the emulated cluster is a Linux network namespace on one host "
        f"({cores}Linux {platform.release()}), joined to one software switch by a virtual "
        f"Ethernet pair; {shaping}. Ranks train with PyTorch on the CPU (no GPU)."
    )
    models = sorted(training["model"].astype(str).unique()) if len(training) else []
    specs = config.get("models", {})
    if models:
        sentences.append(
            f"{len(models)} model{'' if len(models) == 1 else 's'}: "
            + _join([model_words(m, specs.get(m, {})) for m in models])
            + "; strategies: "
            + _join(sorted(training["strategy"].astype(str).unique()))
            + "."
        )
    numbers = link_number_columns(summary)
    swept = [
        text
        for text in (
            ("bandwidth caps of " + _values(numbers["bw_bps"], "Mbit/s", 1e-6)).strip(),
            ("one-way delays of " + _values(numbers["delay_ms"], "ms")),
            ("jitter of " + _values(numbers["jitter_ms"], "ms")),
            ("random loss of " + _values(numbers["loss_pct"], "%")),
        )
        if not text.endswith("of ")
    ]
    nodes = sorted(summary["nodes"].astype(int).unique())
    rpn = sorted(summary["ranks_per_node"].astype(int).unique())
    scale = (
        f"{_join([str(n) for n in nodes])} nodes with {_join([str(r) for r in rpn])} "
        f"rank{'' if rpn == [1] else 's'} each"
    )
    sentences.append(
        f"{len(summary)} cells ran on {scale}"
        + (f", the link unshaped or with {_join(swept)}" if swept else ", on the unshaped link")
        + "."
    )
    if results.reference is not None:
        sentences.append(
            f"Slowdowns are against {baseline_link(results)}, a cap this host carries "
            "faithfully; the unshaped link, a veth at memory-copy speed, is no network and is "
            "one setting among the others."
        )
    if "host_limited" in summary and "monitored" in summary:
        watched = summary["monitored"].fillna(False).astype(bool)
        limited = host_limited_mask(summary) & watched
        head = f"A fidelity monitor watched {int(watched.sum())} of {len(summary)} cells and found "
        sentences.append(
            head + f"the host, not the network, set the step time of {int(limited.sum())} (listed "
            "under Limitations); no finding rests on them."
            if limited.any()
            else head + "none whose step time the host, not the network, set (its bounds are "
            "under Limitations)."
        )
    setting = ("strategy", "model", "nodes", "ranks_per_node", "cc", "steps")
    keys = [*(c for c in setting if c in summary), *LINK_NUMBER_COLUMNS]
    with_numbers = summary.assign(**{c: numbers[c] for c in LINK_NUMBER_COLUMNS})
    repeats = with_numbers.groupby(keys, dropna=False).size()
    steps = summary["measured_steps"].dropna().astype(int) if "measured_steps" in summary else []
    warmup = config.get("run", {}).get("warmup_steps")
    rep = (
        "each setting ran once"
        if repeats.max() == 1
        else f"{int((repeats > 1).sum())} of {len(repeats)} settings were repeated "
        f"({int(repeats[repeats > 1].min())}–{int(repeats.max())} runs), the rest ran once"
    )
    if len(steps):
        measured = (
            f"{steps.min()}" if steps.min() == steps.max() else f"{steps.min()}–{steps.max()}"
        )
        rep += f"; every run measured {measured} steps"
        if warmup is not None:
            rep += f" after {warmup} warm-up steps"
    sentences.append(rep[0].upper() + rep[1:] + ".")
    if len(replays):
        sentences.append(
            f"{len(replays)} cell{'' if len(replays) == 1 else 's'} replayed recorded traces "
            "(the same communication, no compute): their findings are kept apart from training."
        )
    return sentences
