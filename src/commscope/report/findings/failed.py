"""Findings and failed cells: a finding one of the failed cells could have been a side of says
so, and names the cells it was computed without."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from commscope.config import cell_axes
from commscope.report.findings._base import Finding, setup_words
from commscope.spec.link import SHAPING


def failed_cell_words(cell: str) -> str:
    """A failed cell as a reader names it: strategy, model, placement and link."""
    a = cell_axes(cell)
    link = ", ".join(f"{k} {a[k]}" for k in SHAPING if k in a)
    return (
        f"{a.get('strategy', '?')} ({a.get('model', '?')}, {a.get('nodes', '?')} x "
        f"{a.get('ranks_per_node', '?')}, {link}, repeat {a.get('repeat', '?')})"
    )


def _names(text: str, strategy: str) -> bool:
    return bool(strategy) and bool(re.search(rf"(?<![\w-]){re.escape(strategy)}(?![\w-])", text))


def lost_sides(
    findings: list[Finding], failed: list[dict[str, Any]], strategies: Sequence[str] = ()
) -> list[Finding]:
    """``findings`` with a note on each one a failed cell could have been a side of: the
    finding names the cell's strategy, or the setup (model, nodes, ranks per node) whose
    strategies it compares, or it compares two or more of the study's ``strategies`` without
    naming a setup. Such a finding was computed on the cells that ran; the note says which
    cells it lacks instead of passing that over (erring towards a note too many)."""
    if not failed:
        return findings
    out = []
    for f in findings:
        compares = sum(_names(f.text, name) for name in strategies) >= 2
        names_a_setup = bool(re.search(r" on \d+ nodes?, \d+ ranks? each", f.text))
        lacking = []
        for rec in failed:
            a = cell_axes(rec["cell"])
            strategy = a.get("strategy", "")
            if a.get("model") and a.get("nodes") and a.get("ranks_per_node"):
                setup = setup_words(a)
            else:
                setup = None
            in_setup = bool(setup) and setup in f.text
            # A check of the tool runs over every cell that ran: each failed cell is missing.
            over_all = f.source == "check"
            if _names(f.text, strategy) or in_setup or over_all or (compares and not names_a_setup):
                lacking.append(failed_cell_words(rec["cell"]))
        if lacking:
            text = (
                f"{f.text} [Computed without {len(lacking)} failed "
                f"cell{'' if len(lacking) == 1 else 's'} it could have included: "
                f"{'; '.join(lacking)}.]"
            )
            f = replace(f, text=text)
        out.append(f)
    return out
