"""One set of formatters for bytes, rates, times and counts, for reports, figures and the CLI.

Sizes are SI (1 MB = 10**6 bytes, 1 kB = 1000 B) and rates are bits per second, as everywhere in
commscope; the one binary formatter (:func:`binary_size_label`) labels the microbenchmark's
message sizes, which are powers of two (1 KiB .. 64 MiB). Missing values (None, NA, NaN, text
that is not a number) print as ``n/a`` instead of failing.
"""

from __future__ import annotations

import math
import sys
from typing import Any

# SI byte units, largest first: (name, bytes).
SI_BYTE_UNITS: tuple[tuple[str, float], ...] = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
SI_BIT_RATE_UNITS: tuple[tuple[str, float], ...] = (
    ("Gbit/s", 1e9),
    ("Mbit/s", 1e6),
    ("kbit/s", 1e3),
)
BINARY_UNITS: tuple[tuple[str, int], ...] = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


def is_missing(value: Any) -> bool:
    """True for None, ``pd.NA`` and NaN; False for anything else, numbers and non-numbers
    alike (a string is not missing)."""
    # A pd.NA exists only once pandas is imported: this module (imported by every node program
    # and cell job) need not import it (0.6 s) to recognise one.
    pandas = sys.modules.get("pandas")
    if value is None or (pandas is not None and value is pandas.NA):
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def _unit_of(value: float, units: tuple[tuple[str, float], ...], below: str) -> tuple[str, float]:
    """The largest unit ``(name, scale)`` of ``units`` (largest first) that ``value`` reaches,
    else ``(below, 1.0)``."""
    return next(((u, s) for u, s in units if value >= s), (below, 1.0))


def fmt_bytes(value: Any, digits: int = 2) -> str:
    """``2000000`` -> ``'2.00 MB'`` (``digits`` decimals); NaN -> ``'n/a'``."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    unit, scale = _unit_of(abs(v), SI_BYTE_UNITS, "B")
    return f"{v:.0f} B" if scale == 1.0 else f"{v / scale:.{digits}f} {unit}"


def bytes_tick(value: float, _pos: object = None) -> str:
    """SI byte size for axis ticks, without trailing zeros: ``2e6`` -> ``'2 MB'``."""
    unit, scale = _unit_of(abs(value), SI_BYTE_UNITS, "B")
    return f"{value / scale:g} {unit}"


def binary_size_label(nbytes: float, _pos: object = None) -> str:
    """A power-of-two size as a short tick label: ``4096`` -> ``'4K'``, ``1 << 26`` -> ``'64M'``."""
    unit, scale = _unit_of(nbytes, BINARY_UNITS, "")
    return f"{nbytes / scale:g}{unit}"


def si_byte_unit(top: float) -> tuple[str, float]:
    """The largest SI byte unit ``(name, bytes)`` that ``top`` reaches (``("B", 1.0)`` below
    1 kB), to scale a whole column or axis by one unit."""
    return _unit_of(top, SI_BYTE_UNITS, "B")


def fmt_bps(value: Any) -> str:
    """``84e6`` -> ``'84.0 Mbit/s'``; NaN -> ``'n/a'``."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    unit, scale = _unit_of(abs(v), SI_BIT_RATE_UNITS, "bit/s")
    return f"{v:.0f} bit/s" if scale == 1.0 else f"{v / scale:.1f} {unit}"


def fmt_ms(seconds: Any) -> str:
    """A duration in seconds shown in milliseconds: ``0.1`` -> ``'100.0 ms'``."""
    return "n/a" if is_missing(seconds) else f"{float(seconds) * 1e3:.1f} ms"


def fmt_ratio(value: Any) -> str:
    """``1.05`` -> ``'1.05'``; NaN (e.g. unresolved burstiness) -> ``'n/a'``."""
    return "n/a" if is_missing(value) else f"{float(value):.2f}"


def fmt_count(value: Any) -> str:
    """Counts and means of counts: ``6.0`` -> ``'6'``, ``6.25`` -> ``'6.2'``."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    return f"{v:.0f}" if v.is_integer() else f"{v:.1f}"


def fmt_us(value: Any) -> str:
    """A lateness in µs for text: ``48.2`` -> ``'48 µs'``, ``1234`` -> ``'1.23 ms'``."""
    if is_missing(value):
        return "n/a"
    v = float(value)
    return f"{v:.0f} µs" if abs(v) < 1000 else f"{v / 1000:.3g} ms"


def fmt_pct(value: Any) -> str:
    """A percentage with three significant digits: ``0.0987`` -> ``'0.0987 %'``."""
    return "n/a" if is_missing(value) else f"{float(value):.3g} %"


def fmt_share(value: Any) -> str:
    """A share as a percentage with one decimal: ``0.4`` -> ``'40.0 %'``."""
    return "n/a" if is_missing(value) else f"{100 * float(value):.1f} %"


def fmt_slowdown(mean: Any, low: Any = None, high: Any = None) -> str:
    """``1.84`` -> ``'1.84×'``, with its interval when there is one: ``'1.84× [1.80, 1.88]'``."""
    if is_missing(mean):
        return "n/a"
    text = f"{float(mean):.2f}×"
    if not (is_missing(low) or is_missing(high)):
        text += f" [{float(low):.2f}, {float(high):.2f}]"
    return text
