"""The report's browser check catches what it is meant to catch (on pages built to fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .browser import check_in_browser, chromium

pytestmark = pytest.mark.skipif(chromium() is None, reason="needs chromium (Debian package)")

GOOD = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>ok</title></head><body>
<ol class="findings"><li>one</li><li>two</li></ol>
<div style="overflow-x: auto"><table><tr><td style="min-width: 3000px">wide, but boxed</td></tr>
</table></div></body></html>"""

BAD = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title></head><body>
<div style="width: 3000px">too wide</div>
<img alt="broken" src="data:image/png;base64,AAAA">
<script>console.error("something broke"); undefinedFunction();</script>
</body></html>"""


def test_a_good_page_passes(tmp_path: Path) -> None:
    page = tmp_path / "good.html"
    page.write_text(GOOD)
    result = check_in_browser(page, tmp_path)
    assert result["overflow_px"] == 0
    assert result["findings"] == 2
    assert result["broken_images"] == [] and result["problems"] == []
    assert (tmp_path / "first_screen.png").stat().st_size > 0


def test_overflow_broken_images_and_errors_are_caught(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(BAD)
    result = check_in_browser(page, tmp_path, width=1000)
    assert result["overflow_px"] > 1500
    assert result["broken_images"] == ["broken"]
    assert result["findings"] == 0
    problems = " | ".join(result["problems"])
    assert "console error: something broke" in problems
    assert "undefinedFunction" in problems
