"""What a link looks like: the sweep's link axes (:data:`LINK_AXES`, their defaults, one setting
as :class:`LinkSetting`), :class:`LinkShape` and the parsers of the sweep's rate, time, loss and
congestion-control strings. Torch-free and host-free (plain data with validation): Snakemake's
config checks use it without touching a node; :mod:`commscope.cluster.shaping` turns a shape
into tc commands and a sysctl.

The analysis side reads a link as numbers, never as axis strings: a shape's
:meth:`LinkShape.numbers` are the table columns :data:`LINK_NUMBER_COLUMNS` (the parse stage,
``cell.parse``, writes the applied shape's into cell.json, the summary copies them),
:data:`SHAPING` pairs each shaping axis with its column, :func:`impaired` and :func:`link_label`
read those columns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

# The sweep axes that shape a link, in the order they appear in paths and tables. ``cc`` is the
# TCP congestion control every node of the cell runs: not an impairment, but a property of the
# link's transport that changes how the same cap is used, set per node like the qdiscs.
LINK_AXES: tuple[str, ...] = ("bw", "delay", "jitter", "loss", "cc")
# TCP congestion control algorithms a cell may ask for (all three are in this kernel; a new
# network namespace inherits the host's default, BBR here, unless told otherwise).
CC_ALGORITHMS: tuple[str, ...] = ("cubic", "bbr", "reno")
# CUBIC, as in seed 002's measurements (and Linux's own default).
DEFAULT_CC = "cubic"
# What a link axis left out means (a sweep block, a microbenchmark link): no impairment, the
# default congestion control. ``bw`` has none: every sweep block and every listed link names its
# rate ("none": no cap).
LINK_DEFAULTS: dict[str, str] = {"delay": "0ms", "jitter": "0ms", "loss": "0pct", "cc": DEFAULT_CC}

# The link axes that shape a link (LINK_AXES order; cc shapes nothing), each with the column of
# its number in cell.json and the tables: a setting moved off the unshaped link along an axis
# whose number is not the unshaped one (a cap; more than 0 ms or 0 %).
SHAPING: dict[str, str] = {
    "bw": "bw_bps",
    "delay": "delay_ms",
    "jitter": "jitter_ms",
    "loss": "loss_pct",
}
# A link as numbers (LinkShape.numbers): the cap in bit/s (NaN uncapped), the one-way delay and
# jitter in ms, the loss in %.
LINK_NUMBER_COLUMNS: tuple[str, ...] = tuple(SHAPING.values())
# The shaping axes besides the cap: what needs an impairment engine (LinkShape.impaired).
IMPAIRMENT_AXES: tuple[str, ...] = tuple(axis for axis in SHAPING if axis != "bw")

# What tc answers when the kernel lacks sch_netem (probed by commscope.cluster.shaping).
NETEM_UNKNOWN = "Specified qdisc kind is unknown"

# The two engines of the one link model (delay, jitter and loss on the receiver's ingress):
# netem on the ifb where the kernel has it; otherwise nftables' random drop for loss and the
# NFQUEUE delayer (commscope.node.delayer) for delay and jitter. ``auto`` picks netem where the
# node's kernel has it.
LINK_ENGINES: tuple[str, ...] = ("auto", "netem", "nfqueue")
# Bounds of the impairments a cell may ask for. One-way delay: 1 s is past any terrestrial or
# geostationary path (~280 ms one way) and keeps gloo's and TCP's timeouts out of play. Loss:
# above 20 % TCP spends the cell in retransmission timeouts, not in training.
MAX_DELAY_MS = 1000.0
MAX_LOSS_PCT = 20.0
# The fastest rate cap: 400 Gbit/s, the fastest Ethernet NICs in use. tc's tbf takes its queue
# bound (``latency``) and bucket in 32-bit byte counts: above ~670 Gbit/s it silently shortens the
# 50 ms queue, above ~34 Tbit/s it refuses the bucket ('illegal value for "burst"'), and a
# 20-digit rate overflows its 64-bit byte rate. Refused here, naming bw, before any node is shaped.
MAX_RATE_BPS = 400 * 10**9

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}
_NUM = r"(\d+(?:\.\d*)?|\.\d+)"


def _parse_rate(text: str) -> int | None:
    s = str(text).strip().lower()
    if s in ("none", "unlimited", "inf", ""):
        return None
    m = re.fullmatch(_NUM + r"\s*([kmgt]?bit)", s)
    if not m:
        raise ValueError(
            f"bw={text!r} is not a rate: use a number with a unit in bits per second such as "
            "'100mbit', '1gbit' or '500kbit' (tc's 'bps' means bytes, so it is not accepted), "
            "or 'none'/'unlimited' for no cap"
        )
    bps = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if bps < 8:
        raise ValueError(f"bw={text!r} must be at least 8bit (e.g. '100mbit')")
    if bps > MAX_RATE_BPS:
        raise ValueError(
            f"bw={text!r} is above the fastest cap tc shapes here, {MAX_RATE_BPS // 10**9}gbit "
            "(the fastest Ethernet); use 'none' for no cap"
        )
    return round(bps)


def _parse_time_ms(text: str, field: str) -> float:
    s = str(text).strip().lower()
    m = re.fullmatch(_NUM + r"\s*(us|ms|s)?", s)
    if not m or (m.group(2) is None and float(m.group(1)) != 0):
        raise ValueError(
            f"{field}={text!r} is not a duration: use a number with a unit such as '10ms', "
            "'0.5ms', '500us' or '1s' ('0' alone is fine)"
        )
    return float(m.group(1)) * _TIME_UNITS[m.group(2) or "ms"]


def _parse_loss_pct(text: str) -> float:
    s = str(text).strip()
    m = re.fullmatch(_NUM + r"\s*(%?)", s)
    if not m or (m.group(2) == "" and float(m.group(1)) != 0):
        raise ValueError(f"loss={text!r} is not a percentage: use e.g. '0.5%' or '0%'")
    pct = float(m.group(1))
    if pct > MAX_LOSS_PCT:
        raise ValueError(
            f"loss={text!r} must be between 0% and {tc_num(MAX_LOSS_PCT)}% (e.g. '0.5%'): above, "
            "TCP spends the cell in retransmission timeouts"
        )
    return pct


def _check_cc(cc: str) -> str:
    if cc not in CC_ALGORITHMS:
        raise ValueError(
            f"cc={cc!r} is not a TCP congestion control commscope sets: use one of "
            f"{', '.join(CC_ALGORITHMS)} (lowercase, as in net.ipv4.tcp_congestion_control)"
        )
    return cc


def loss_pct(loss: str) -> float:
    """'0.5pct' -> 0.5 (the config writes loss path-safely, without '%')."""
    return float(loss.removesuffix("pct"))


def tc_num(x: float) -> str:
    """A number as tc wants it: no exponent, no trailing zeros (10.0 -> '10', 0.25 -> '0.25')."""
    d = Decimal(repr(float(x))).normalize()
    text = format(d, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def tc_ms(x: float) -> str:
    """A duration in ms as tc wants it (10.0 -> '10ms')."""
    return f"{tc_num(x)}ms"


@dataclass(frozen=True)
class LinkShape:
    """What one node's experiment link looks like: a rate cap plus impairments (delay, jitter,
    loss), and the TCP congestion control the node runs.

    ``rate_bps`` is in bits per second of L2 frames (tbf counts whole Ethernet frames without
    FCS), ``None`` means uncapped. Delay and jitter are one-way, applied on the receive side:
    each packet is held ``delay_ms`` plus a uniform draw in ``±jitter_ms`` (never less than
    zero, since jitter may not exceed the delay). ``loss_pct`` drops packets at random on the
    receive side. ``cc`` is one of :data:`CC_ALGORITHMS`; it needs no qdisc (a sysctl of the
    node's network namespace), so it plays no part in :attr:`is_noop` or :attr:`impaired`.
    """

    rate_bps: int | None
    delay_ms: float = 0
    jitter_ms: float = 0
    loss_pct: float = 0
    cc: str = DEFAULT_CC

    def __post_init__(self) -> None:
        if self.rate_bps is not None and self.rate_bps <= 0:
            raise ValueError(f"rate_bps={self.rate_bps} must be positive, or None for no cap")
        for field, value in (
            ("delay_ms", self.delay_ms),
            ("jitter_ms", self.jitter_ms),
            ("loss_pct", self.loss_pct),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{field}={value} must be a finite number >= 0")
        if self.loss_pct > MAX_LOSS_PCT:
            raise ValueError(
                f"loss={tc_num(self.loss_pct)}% must be at most {tc_num(MAX_LOSS_PCT)}%: above, "
                "TCP spends the cell in retransmission timeouts"
            )
        if self.delay_ms > MAX_DELAY_MS:
            raise ValueError(
                f"delay={tc_ms(self.delay_ms)} must be at most {tc_ms(MAX_DELAY_MS)} one way "
                "(a geostationary hop is ~280ms)"
            )
        if self.jitter_ms > self.delay_ms:
            raise ValueError(
                f"jitter={tc_ms(self.jitter_ms)} exceeds delay={tc_ms(self.delay_ms)}: a packet "
                "is held delay ± jitter, which must not go below zero; raise delay or lower "
                "jitter"
            )
        _check_cc(self.cc)

    @property
    def impaired(self) -> bool:
        """Whether this shape has delay, jitter or loss (needs an impairment engine)."""
        return any(getattr(self, SHAPING[axis]) > 0 for axis in IMPAIRMENT_AXES)

    @property
    def is_noop(self) -> bool:
        """No cap and no impairment: the link gets no qdisc (its ``cc`` is still set)."""
        return self.rate_bps is None and not self.impaired

    @classmethod
    def parse(
        cls,
        bw: str,
        delay: str = "0ms",
        jitter: str = "0ms",
        loss: str = "0%",
        cc: str = DEFAULT_CC,
    ) -> LinkShape:
        """Parse sweep-style strings, e.g. ``LinkShape.parse("100mbit", "10ms", "1ms", "0.5%")``.

        ``bw``: ``<n>[k|m|g|t]bit`` (decimal units, as tc) or ``none``/``unlimited``;
        ``delay``/``jitter``: ``<n>us|ms|s``; ``loss``: ``<n>%``; ``cc``: one of
        :data:`CC_ALGORITHMS`. Raises ValueError naming the field and showing a valid example.
        """
        return cls(
            rate_bps=_parse_rate(bw),
            delay_ms=_parse_time_ms(delay, "delay"),
            jitter_ms=_parse_time_ms(jitter, "jitter"),
            loss_pct=_parse_loss_pct(loss),
            cc=str(cc).strip(),
        )

    def impairments(self) -> list[str]:
        """The delay, jitter and loss asked for, e.g. ``["delay=10ms", "loss=0.5%"]``."""
        parts = []
        if self.delay_ms:
            parts.append(f"delay={tc_ms(self.delay_ms)}")
        if self.jitter_ms:
            parts.append(f"jitter={tc_ms(self.jitter_ms)}")
        if self.loss_pct:
            parts.append(f"loss={tc_num(self.loss_pct)}%")
        return parts

    def describe(self) -> str:
        """Short human form, e.g. ``rate=100mbit delay=10ms cc=cubic``."""
        rate = f"rate={tc_num(self.rate_bps / 1e6)}mbit" if self.rate_bps else "rate=unlimited"
        return " ".join([rate, *self.impairments(), f"cc={self.cc}"])

    def numbers(self) -> dict[str, float]:
        """The shape as the columns :data:`LINK_NUMBER_COLUMNS`, floats: ``bw_bps`` (NaN
        uncapped), ``delay_ms``, ``jitter_ms``, ``loss_pct`` (an impairment's field is named as
        its column)."""
        rate = float(self.rate_bps) if self.rate_bps is not None else math.nan
        impairments = {
            SHAPING[axis]: float(getattr(self, SHAPING[axis])) for axis in IMPAIRMENT_AXES
        }
        return {SHAPING["bw"]: rate, **impairments}

    @classmethod
    def from_numbers(cls, numbers: Mapping[str, Any], cc: str = DEFAULT_CC) -> LinkShape:
        """The shape of :meth:`numbers` (a table row, cell.json): ``bw_bps`` None or NaN is
        uncapped; a missing delay, jitter or loss is 0."""
        rate = numbers.get(SHAPING["bw"])
        return cls(
            rate_bps=None if _missing(rate) else round(float(rate)),
            **{
                SHAPING[axis]: 0.0
                if _missing(numbers.get(SHAPING[axis]))
                else float(numbers[SHAPING[axis]])
                for axis in IMPAIRMENT_AXES
            },
            cc=cc,
        )

    def label(self) -> str:
        """How the shape moved off the unshaped link, in words (:func:`link_label`):
        ``"cap 50 Mbit/s + delay 5 ms"``, ``"unshaped"``."""
        return link_label(self.numbers())


def _missing(value: Any) -> bool:
    """None or NaN (a table's empty cell)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


# How each shaping axis's number reads in words (link_label): the text around it and what it is
# divided by (the cap is counted in bit/s and said in Mbit/s).
AXIS_WORDS: dict[str, tuple[str, float]] = {
    "bw": ("cap {:g} Mbit/s", 1e6),
    "delay": ("delay {:g} ms", 1.0),
    "jitter": ("jitter ±{:g} ms", 1.0),
    "loss": ("loss {:g} %", 1.0),
}


def link_label(numbers: Mapping[str, Any], axes: Iterable[str] = tuple(SHAPING)) -> str:
    """A link's numbers (:data:`LINK_NUMBER_COLUMNS`, e.g. a table row) in words, by
    :data:`AXIS_WORDS`: ``"cap 50 Mbit/s"``, ``"delay 5 ms"``, ``"jitter ±1 ms"``, ``"loss 0.1
    %"``, several joined by ``" + "``, or ``"unshaped"``. A missing cap is none; a missing
    impairment 0. ``axes``: the shaping axes to say (default all)."""
    parts = []
    for axis in axes:
        value = numbers.get(SHAPING[axis])
        moved = not _missing(value) if axis == "bw" else float(value or 0) > 0
        if moved:
            text, unit = AXIS_WORDS[axis]
            parts.append(text.format(float(value) / unit))
    return " + ".join(parts) or "unshaped"


def impaired(frame: pd.DataFrame) -> pd.Series:
    """Per row of a table with the :data:`LINK_NUMBER_COLUMNS`: does its link have delay,
    jitter or loss (any :data:`IMPAIRMENT_AXES` number above 0)? An impairment column the table
    lacks (written before that impairment existed) counts as 0."""
    columns = [SHAPING[axis] for axis in IMPAIRMENT_AXES if SHAPING[axis] in frame.columns]
    return (frame[columns] > 0).any(axis=1)


def shaped(frame: pd.DataFrame) -> pd.Series:
    """Per row of a table with the :data:`LINK_NUMBER_COLUMNS`: was its link moved off the
    unshaped one (a cap, or :func:`impaired`)?"""
    return frame[SHAPING["bw"]].notna() | impaired(frame)


def choose_engine(requested: str, has_netem: bool) -> str:
    """The engine that applies delay, jitter and loss on a node: ``netem`` or ``nfqueue``.

    ``requested`` is ``run.link_engine``: ``auto`` takes netem where the kernel has it, else
    the nftables + NFQUEUE engine; ``netem`` on a kernel without it is refused (ValueError
    naming the key and the fix), never silently replaced."""
    if requested not in LINK_ENGINES:
        raise ValueError(
            f"run.link_engine={requested!r}: use one of {list(LINK_ENGINES)} (auto: netem where "
            "the kernel has it, else nftables loss and the NFQUEUE delayer)"
        )
    if requested == "auto":
        return "netem" if has_netem else "nfqueue"
    if requested == "netem" and not has_netem:
        raise ValueError(
            f"run.link_engine=netem but this kernel has no netem qdisc (tc: {NETEM_UNKNOWN}); "
            "set run.link_engine to auto or nfqueue (nftables loss and the NFQUEUE delayer), "
            "or run on a kernel with sch_netem"
        )
    return requested


@dataclass(frozen=True)
class LinkSetting:
    """One link setting as the sweep writes it: ``bw``, ``delay``, ``jitter``, ``loss`` (loss
    path-safe, e.g. ``0.5pct``) and ``cc``, as strings. :attr:`id` names its directory;
    :meth:`shape` parses it into the :class:`LinkShape` the nodes apply."""

    bw: str
    delay: str = LINK_DEFAULTS["delay"]
    jitter: str = LINK_DEFAULTS["jitter"]
    loss: str = LINK_DEFAULTS["loss"]
    cc: str = LINK_DEFAULTS["cc"]

    @classmethod
    def from_mapping(cls, link: Mapping[str, Any]) -> LinkSetting:
        """From a link's values (a config entry, a rule's ``params.link``); missing delay,
        jitter, loss and cc take :data:`LINK_DEFAULTS`. ValueError naming any key that is not an
        axis, so that a renamed key fails loudly instead of being ignored."""
        unknown = sorted(set(link) - set(LINK_AXES))
        if unknown:
            raise ValueError(f"link: unknown keys {unknown}; known: {list(LINK_AXES)}")
        return cls(**{axis: str(value) for axis, value in link.items()})

    @classmethod
    def from_wildcards(cls, values: Mapping[str, Any]) -> LinkSetting:
        """The link axes of a job's wildcards, or of any mapping that has all of them among
        other keys (a cell's sweep values)."""
        return cls(*(str(values[axis]) for axis in LINK_AXES))

    @property
    def id(self) -> str:
        """Directory path of this setting, e.g.
        ``bw~50mbit/delay~0ms/jitter~0ms/loss~0pct/cc~cubic``."""
        return "/".join(f"{axis}~{value}" for axis, value in self.as_dict().items())

    def as_dict(self) -> dict[str, str]:
        """``{axis: value}`` in :data:`LINK_AXES` order (a rule's plain ``params.link``)."""
        return {axis: getattr(self, axis) for axis in LINK_AXES}

    def shape(self) -> LinkShape:
        """The tc shape this setting asks for."""
        return LinkShape.parse(self.bw, self.delay, self.jitter, f"{loss_pct(self.loss)}%", self.cc)


def axes_shape(values: Mapping[str, Any]) -> LinkShape:
    """The shape a cell's link axes ask for, from any mapping that has some of them among other
    keys (a cell's params, a table row); an axis it lacks or leaves None takes its default (no
    cap, no delay, jitter or loss: a cell recorded before that axis existed). For what has no
    link numbers of its own: a cell.json from before the parse stage wrote them, a per-cell table
    with only the axis strings. ValueError for a value the link model refuses."""
    given = {axis: str(values[axis]) for axis in LINK_AXES if values.get(axis) is not None}
    return LinkSetting.from_mapping({"bw": "none", **given}).shape()


# The unshaped link: no cap, no impairment, the default congestion control (the microbenchmark's
# reference for intra-node ops).
UNSHAPED = LinkSetting(bw="none")


@dataclass(frozen=True)
class ReferenceLink:
    """The link a study's slowdowns are measured against (the config's ``reference_link``): a
    named :class:`LinkSetting` the host carries faithfully, e.g. a 1 Gbit/s cap. Without one the
    baseline is :data:`UNSHAPED`, the veth at memory-copy speed, which is no network."""

    setting: LinkSetting
    name: str

    @classmethod
    def from_config(cls, entry: Mapping[str, Any] | None) -> ReferenceLink | None:
        """From the config's ``reference_link`` (``{name, bw, delay, jitter, loss, cc}``; only
        ``bw`` required), or None when the key is absent. ValueError naming the key and the fix
        for an unknown key or a value the link model refuses. ``name`` defaults to the link's
        :func:`link_label`."""
        if entry is None:
            return None
        link = {k: v for k, v in entry.items() if k != "name"}
        if "cc" in link:
            raise ValueError(
                "reference_link.cc: the congestion control belongs to a cell's setup, not to the "
                "link it is measured against (each setup's baseline runs its own cc); remove it"
            )
        if "bw" not in link:
            raise ValueError(
                "reference_link: needs bw, the reference's rate cap (e.g. {name: '1 Gbit/s', "
                "bw: 1gbit}); remove the key to measure slowdowns against the unshaped link"
            )
        try:
            setting = LinkSetting.from_mapping(link)
            shape = setting.shape()
        except ValueError as err:
            raise ValueError(f"reference_link: {err}") from None
        name = str(entry.get("name") or shape.label()).strip()
        if not name:
            raise ValueError("reference_link.name: give the link a name, e.g. '1 Gbit/s'")
        return cls(setting, name)

    def shape(self) -> LinkShape:
        """The tc shape of the reference link."""
        return self.setting.shape()

    def numbers(self) -> dict[str, float]:
        """The reference as the columns :data:`LINK_NUMBER_COLUMNS` (:meth:`LinkShape.numbers`)."""
        return self.shape().numbers()

    @property
    def words(self) -> str:
        """How the report names a setting on it: ``"the reference link (1 Gbit/s)"``."""
        return f"the reference link ({self.name})"
