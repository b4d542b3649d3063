"""The decision page opened by a real headless Chromium: its DOM has the verdict table and every image loads.

The report is built by the CLI from a constructed store (tests/report_fixtures.py). Chromium loads a copy of the
page with one script appended that, on the load event, writes what the browser saw (each <img>'s naturalWidth /
naturalHeight, the verdict table's rows) into the DOM; ``--dump-dom`` prints the DOM after that. The page itself
has no script and references nothing outside itself.

Skipped only when no Chromium is installed and $CI is unset (scripts/ci-system-deps.sh installs it in CI).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.report_fixtures import EXPERIMENT, SLO, build_store

pytestmark = pytest.mark.integration
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROBE = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.map.call(document.images, function (i) {
    return {name: i.getAttribute("data-name"), w: i.naturalWidth, h: i.naturalHeight, complete: i.complete};
  });
  var rows = Array.prototype.map.call(document.querySelectorAll("table.verdicts tbody tr"), function (tr) {
    return [tr.cells[0].querySelector("b").textContent, tr.cells[1].querySelector(".v").textContent];
  });
  var heads = Array.prototype.map.call(document.querySelectorAll("table.verdicts thead th"), function (th) {
    return th.textContent;
  });
  var pre = document.createElement("pre");
  pre.id = "qt-check";
  pre.textContent = JSON.stringify({images: imgs, rows: rows, heads: heads});
  document.body.appendChild(pre);
});
</script>"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("no Chromium on PATH in CI: scripts/ci-system-deps.sh should have installed it")
    pytest.skip("no Chromium installed (apt-get install chromium)")


def test_page_in_a_real_browser(tmp_path: Path) -> None:
    browser = _browser()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ids = build_store(uri)
    page = tmp_path / "report.html"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    subprocess.run(["python", "-m", "quantrack.cli", "report", "--experiment", EXPERIMENT, "--slo", SLO,
                    "--slo", "ttft_p50<=2s@64", "--max-accuracy-drop", "1pp", "--out", str(page)],
                   check=True, capture_output=True, text=True, timeout=300, env=env)
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text  # the page needs no script; the probe below is added to a copy
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=300, check=False)
    m = re.search(r'<pre id="qt-check">(.*?)</pre>', proc.stdout, re.DOTALL)
    assert m, f"the probe did not run (rc {proc.returncode}): {proc.stderr[-2000:]}"
    seen = json.loads(html.unescape(m.group(1)))
    # the verdict table, as the browser laid it out
    assert seen["heads"][:3] == ["Arm", "Verdict", "SLOs"] and "Δ vs baseline [95% CI]" in seen["heads"]
    assert dict(seen["rows"]) == {"bf16": "cleared", "fp8": "cannot be cleared", "fp8-good": "cleared",
                                  "fp8-kv": "cannot be cleared", "marlin": "cleared", "slow": "misses"}
    # every image decoded by the browser (a broken data: URI has naturalWidth 0)
    names = [i["name"] for i in seen["images"]]
    assert {"capacity", "tpot_p50-vs-concurrency", "ttft_p50-vs-concurrency", "throughput-vs-concurrency",
            "speedup-vs-batch", "accuracy", "kl"} <= set(names)
    assert len(names) == text.count("<img ")
    for img in seen["images"]:
        assert img["complete"] and img["w"] >= 400 and img["h"] >= 150, img
    assert ids["fp8"] in proc.stdout
