"""What every report section is made of: a :class:`Section` (title, how to read it, the table
built from the study's results) and its anchor, derived from its title so that a finding links
to a section by importing it, never by retyping its title."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from commscope.contracts import is_replay
from commscope.report.results import StudyResults
from commscope.spec.link import IMPAIRMENT_AXES, link_label


def anchor(title: str) -> str:
    """A section title as a URL fragment: ``"Wire vs ops"`` -> ``"wire-vs-ops"``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def always(_results: StudyResults) -> bool:
    """Shown whatever the study ran."""
    return True


def declared(*names: str) -> Callable[[StudyResults], bool]:
    """Shown when the report rule declared every one of ``names`` (a stage that is on)."""

    def shown(results: StudyResults) -> bool:
        return all(results.declared(name) for name in names)

    return shown


@dataclass(frozen=True)
class Section:
    """One section of the report: its ``title``, ``intro`` (how to read it; text, or computed
    from the results where it says where the numbers came from) and ``build``, its table from
    the study's results (shown as is). ``shown`` leaves the section out when its stage is off.
    ``fixed_anchor`` is only for the sections the template lays out itself (``run``,
    ``strategies``, ``sensitivity``): every other anchor is derived from the title. ``place``:
    where the page shows it: ``lead`` (right after the findings: what the study implies and
    what it cannot say), ``main`` (after the figures) or ``detail`` (one row per cell: folded,
    at the end, so that per-cell tables never stand between the reader and the figures).
    ``points``: sentences computed from the results, shown as a list under the intro."""

    title: str
    intro: str | Callable[[StudyResults], str]
    build: Callable[[StudyResults], pd.DataFrame]
    shown: Callable[[StudyResults], bool] = always
    fixed_anchor: str = ""
    place: str = "main"
    points: Callable[[StudyResults], list[str]] | None = None

    @property
    def anchor(self) -> str:
        """The section's id in the page (:func:`anchor` of its title)."""
        return self.fixed_anchor or anchor(self.title)

    def intro_for(self, results: StudyResults) -> str:
        """The intro, computed from ``results`` where it depends on them."""
        return self.intro if isinstance(self.intro, str) else self.intro(results)

    def render(self, results: StudyResults) -> dict[str, Any]:
        """Title, intro and table frame, as :func:`commscope.report.render.render_report` shows
        them."""
        return {"title": self.title, "intro": self.intro_for(results), "frame": self.build(results)}

    def points_for(self, results: StudyResults) -> list[str]:
        """The section's computed sentences (none without :attr:`points`)."""
        return self.points(results) if self.points is not None else []


def setting_label(row: dict[str, Any]) -> str:
    """How a setting moved off the unshaped link, in words (``"cap 50 Mbit/s + delay 5 ms"``,
    ``"unshaped"``), from the row's link numbers: :func:`commscope.spec.link.link_label`."""
    return link_label(row)


def baseline_link(results: StudyResults) -> str:
    """The link every slowdown is against, in words: ``"the reference link (1 Gbit/s)"``
    (the config's ``reference_link``) or ``"the unshaped link"`` without one."""
    reference = results.reference
    return reference.words if reference is not None else "the unshaped link"


def than_baseline(results: StudyResults) -> str:
    """The baseline after "as" or "than": ``"unshaped"`` (the words before the reference link
    existed, kept), or ``"on the reference link (1 Gbit/s)"``."""
    reference = results.reference
    return "unshaped" if reference is None else f"on {reference.words}"


def link_words(row: dict[str, Any]) -> str:
    """`` under a cap of 50 Mbit/s, delay 5ms`` from a row's link axes as the sweep wrote them
    (only those set): beside :func:`setting_label`, the other place the report words a link."""
    parts = []
    bw = str(row.get("bw", "none"))
    if bw != "none":
        rate = re.fullmatch(r"([0-9.]+)([kmg])bit", bw)
        unit = {"k": "kbit/s", "m": "Mbit/s", "g": "Gbit/s"}
        parts.append(f"a cap of {rate[1]} {unit[rate[2]]}" if rate else f"a cap of {bw}")
    for axis in IMPAIRMENT_AXES:
        value = str(row.get(axis, "0"))
        if re.sub(r"[a-z]+$", "", value) not in ("0", "0.0", ""):
            parts.append(f"{axis} {value}")
    return f" under {', '.join(parts)}" if parts else " on the unshaped link"


def training(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of training cells (replay cells have their own section)."""
    if "strategy" not in table:
        return table
    return table[~is_replay(table)].reset_index(drop=True)
