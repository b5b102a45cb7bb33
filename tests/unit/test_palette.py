"""Strategy colours: stable per name and distinct for a study's strategies."""

from __future__ import annotations

from commscope.plots._style import _palette

STUDY = [
    "ddp", "dp-tp", "dp-tp-across", "dp-tp-pp", "ep", "fsdp",
    "fsdp-tp", "pp", "pp-gpipe", "pp-interleaved", "tp", "tp-pp",
]  # fmt: skip


def test_every_strategy_of_the_default_study_has_its_own_colour() -> None:
    colours = _palette(STUDY)
    assert len(set(colours.values())) == len(STUDY)  # DDP and TP were both blue
    assert _palette(reversed(STUDY)) == colours  # the order they come in does not matter


def test_twenty_distinct_then_repeat() -> None:
    names = [f"s{i:02d}" for i in range(21)]
    colours = _palette(names)
    assert len(set(colours.values())) == 20
    assert colours["s20"] == colours["s00"]
    assert _palette([]) == {}
