"""Two studies' findings side by side (issue 25: two fresh-clone default studies must state the
same ordering wherever a finding is stated in both).

``python benchmarks/compare_findings.py A/results/report/findings.json B/... [--md out.md]``

Findings are paired within one research question, source and report section by the likeness of
their sentences with every number masked (difflib), so a finding whose numbers moved pairs with
itself and one whose strategies changed pairs too, and shows it. Prints a Markdown table: the
two sentences, and ``same words`` when the sentences agree but for their numbers (the same
strategies in the same order), else ``differs``; unpaired findings are listed as only in A or B.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path

NUMBER = re.compile(r"[-+]?\d[\d,.]*")


def masked(text: str) -> str:
    """The sentence with every number replaced by '#'."""
    return NUMBER.sub("#", text)


def pair(a: list[dict], b: list[dict]) -> list[tuple[dict | None, dict | None]]:
    """Greedy best pairs of ``a`` and ``b`` within one (question, source, anchor), most alike
    first; the rest unpaired, in ``a``'s then ``b``'s order."""
    candidates = []
    for i, fa in enumerate(a):
        for j, fb in enumerate(b):
            if (fa["question"], fa["source"], fa["anchor"]) == (
                fb["question"],
                fb["source"],
                fb["anchor"],
            ):
                ratio = difflib.SequenceMatcher(None, masked(fa["text"]), masked(fb["text"]))
                candidates.append((ratio.ratio(), i, j))
    used_a, used_b, pairs = set(), set(), {}
    for ratio, i, j in sorted(candidates, reverse=True):
        if i in used_a or j in used_b or ratio < 0.5:
            continue
        used_a.add(i)
        used_b.add(j)
        pairs[i] = j
    out: list[tuple[dict | None, dict | None]] = [
        (fa, b[pairs[i]] if i in pairs else None) for i, fa in enumerate(a)
    ]
    out += [(None, fb) for j, fb in enumerate(b) if j not in used_b]
    return out


def table(pairs: list[tuple[dict | None, dict | None]]) -> str:
    """The Markdown table of :func:`pair`'s result."""

    def cell(f: dict | None) -> str:
        return f["text"].replace("|", "\\|") if f else "—"

    lines = ["| question | run A | run B | words |", "|---|---|---|---|"]
    for fa, fb in pairs:
        question = (fa or fb or {}).get("question", "")
        if fa and fb:
            verdict = "same words" if masked(fa["text"]) == masked(fb["text"]) else "differs"
        else:
            verdict = "only in A" if fa else "only in B"
        lines.append(f"| {question} | {cell(fa)} | {cell(fb)} | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--md", type=Path, help="also write the table here")
    args = parser.parse_args()
    pairs = pair(json.loads(args.a.read_text()), json.loads(args.b.read_text()))
    text = table(pairs)
    print(text)
    same = sum(1 for fa, fb in pairs if fa and fb and masked(fa["text"]) == masked(fb["text"]))
    both = sum(1 for fa, fb in pairs if fa and fb)
    print(f"\n{same} of {both} paired findings have the same words; {len(pairs) - both} unpaired")
    if args.md:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
