"""The wire at four time scales: per cell, how its wire was measured (source and resolution) and
how bursty its nodes' transmissions are at 0.1, 1, 10 and 100 ms."""

from __future__ import annotations

import pandas as pd

from commscope.report.results import StudyResults
from commscope.report.sections._base import Section, declared
from commscope.units import fmt_ratio

# The wire table: (summary column, header); peak/mean and CoV of node tx at four widths.
WIRE_COLUMNS: list[tuple[str, str]] = [
    ("peak_to_mean_100us", "peak/mean 0.1 ms"),
    ("peak_to_mean_1ms", "peak/mean 1 ms"),
    ("peak_to_mean_10ms", "peak/mean 10 ms"),
    ("peak_to_mean_100ms", "peak/mean 100 ms"),
    ("cov_100us", "CoV 0.1 ms"),
    ("cov_10ms", "CoV 10 ms"),
    ("bw_utilization", "utilization of the cap"),
]


def wire_cells(results: StudyResults) -> pd.DataFrame:
    """Per cell: how its wire was measured (source and resolution) and the tx burstiness of
    its nodes at 0.1, 1, 10 and 100 ms (means over nodes; NaN where not resolved)."""
    summary = results.summary
    if summary.empty or "wire_source" not in summary:
        return pd.DataFrame()
    keys = [c for c in ("strategy", "model", "nodes", "ranks_per_node", "bw", "cc") if c in summary]
    out = summary[keys].copy()
    out["wire"] = [
        f"{src} at {res:g} µs" if pd.notna(res) else f"{src}"
        for src, res in zip(summary["wire_source"], summary["wire_resolution_us"], strict=True)
    ]
    for col, header in WIRE_COLUMNS:
        out[header] = summary[col].map(fmt_ratio) if col in summary else ""
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def wire_intro(results: StudyResults) -> str:
    """How to read the wire table, with where its numbers came from: how many cells the BPF
    accounting measured, at what resolution, and each fallback with its reason."""
    summary = results.summary
    base = (
        "How each cell's wire was measured and how bursty its nodes' transmissions are at "
        "four time scales: peak / mean and coefficient of variation of the tx rate over the "
        "measured steps, in 0.1, 1, 10 and 100 ms bins (means over nodes). A flat line at a "
        "cap gives peak / mean near 1 at every scale; a scale finer than the source resolves "
        "is left blank."
    )
    if summary.empty or "wire_source" not in summary:
        return base
    bpf = summary[summary["wire_source"] == "bpf"]
    text = f" {len(bpf)} of {len(summary)} cells were measured in the kernel (tc BPF"
    if len(bpf):
        widths = sorted({f"{w:g} µs" for w in bpf["wire_resolution_us"].dropna()})
        text += f", {', '.join(widths)} bins"
    text += ", counted on the receiver's ingress)"
    fell = summary[summary["wire_fallback"].astype(str) != ""]
    if len(fell):
        reasons = sorted(set(fell["wire_fallback"].astype(str)))
        text += (
            f"; {len(fell)} fell back to the 1 kHz /proc sampler and tcpdump because: "
            + " | ".join(reasons)
        )
    text += "."
    if "wire_offload" in summary and summary["wire_offload"].astype(bool).any():
        n = int(summary["wire_offload"].astype(bool).sum())
        text += (
            f" In {n} cells TSO/GSO was on at some node (recorded per node in cell.json "
            "links): its interface handles super-packets of up to 64 KB, so a bin shorter than "
            "one takes at the link's rate (64 KB / rate: 10 ms at 50 Mbit/s, 0.5 ms at 1 Gbit/s)"
            " shows the offload's bursts rather than the traffic's; coarser bins are unaffected."
        )
    else:
        text += (
            " Every node carried MTU frames (TSO/GSO off), so every scale shown is the traffic's."
        )
    return base + text


SECTION = Section(
    "The wire at four time scales", wire_intro, wire_cells, declared("summary"), place="detail"
)
