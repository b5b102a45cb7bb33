"""Open an HTML report in headless Chromium the way a reader does and say what went wrong.

A copy of the page gets a script at the top of its head that records script errors, console
errors and resources that fail to load; once the page has loaded it writes, into the page, how
far the page overflows its viewport sideways, which images did not decode and how many findings
it lists. ``chromium --dump-dom`` prints the page, the result is read back from it."""

from __future__ import annotations

import html as html_text
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHECK = """<script>
window.__problems = [];
window.addEventListener("error", function (e) {
  var t = e.target;
  window.__problems.push(t && t !== window ? "failed to load: " + (t.outerHTML || "").slice(0, 120)
                                           : "script error: " + e.message);
}, true);
(function () {
  var orig = console.error;
  console.error = function () {
    window.__problems.push("console error: " + Array.prototype.join.call(arguments, " "));
    return orig.apply(console, arguments);
  };
})();
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var doc = document.documentElement;
  var out = {
    overflow_px: doc.scrollWidth - doc.clientWidth,
    images: imgs.length,
    broken_images: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                       .map(function (i) { return i.alt || i.src.slice(0, 60); }),
    problems: window.__problems,
    findings: document.querySelectorAll("ol.findings li").length
  };
  var pre = document.createElement("pre");
  pre.id = "__browser_check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    """The Chromium binary, None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def check_in_browser(
    html: Path, workdir: Path, width: int = 1280, height: int = 900
) -> dict[str, Any]:
    """Load ``html`` in headless Chromium at ``width`` x ``height``: ``overflow_px`` (how far
    the page is wider than the window), ``images``, ``broken_images``, ``problems`` (script
    and console errors, failed loads) and ``findings`` (items of the findings list). Also
    leaves a screenshot of the first screen in ``workdir/first_screen.png``."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed (Debian package chromium)")
    page = workdir / "checked.html"
    text = html.read_text(encoding="utf-8")
    page.write_text(text.replace("<head>", "<head>\n" + CHECK, 1), encoding="utf-8")
    common = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--window-size={width},{height}", "--virtual-time-budget=20000"]  # fmt: skip
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180
    )
    found = re.search(r'<pre id="__browser_check">(.*?)</pre>', dom.stdout, re.S)
    if found is None:
        raise RuntimeError(f"the page never finished loading in Chromium: {dom.stderr[-2000:]}")
    subprocess.run(
        [*common, f"--screenshot={workdir / 'first_screen.png'}", html.as_uri()],
        capture_output=True, timeout=180,
    )  # fmt: skip
    return json.loads(html_text.unescape(found.group(1)))
