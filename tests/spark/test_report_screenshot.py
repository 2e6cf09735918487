"""report.html in a real browser: headless Chromium (Debian's) takes a screenshot.

Chromium is installed with apt-get where it is missing and apt works (make
chromium does the same); the test is skipped, with the reason, where it cannot be.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.spark.conftest import run_tide_audit

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

PAGE_WIDTH = 1100


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get"):
        for cmd in (["apt-get", "install", "-y", "-q", "chromium"],
                    ["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            try:
                subprocess.run(cmd, capture_output=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired):
                break
            if shutil.which("chromium"):
                return shutil.which("chromium")  # type: ignore[return-value]
    pytest.skip("no chromium, and apt-get could not install it")


@pytest.fixture(scope="module")
def chaos_report(spark, damaged_dump, tmp_path_factory):
    """tide audit of the damaged dump as after a chaos run: broker 2 killed for 2.5 s."""
    out = tmp_path_factory.mktemp("chaos-report")
    faults = out.parent / "faults.jsonl"
    t0 = 1_700_000_000_000
    faults.write_text("".join(json.dumps(e) + "\n" for e in (
        {"unix_ms": t0 + 3000, "elapsed_s": 3.0, "action": "kill", "node": "broker-2",
         "fault": "kill", "target": None, "ok": True, "error": ""},
        {"unix_ms": t0 + 5500, "elapsed_s": 5.5, "action": "start", "node": "broker-2",
         "fault": "kill", "target": None, "ok": True, "error": ""})))
    code, report = run_tide_audit(damaged_dump, out, ["--faults", str(faults)])
    assert code == 1 and report is not None
    return out / "report.html"


def test_report_renders_in_headless_chromium(chaos_report, tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    chromium = _chromium()
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         # Nothing may come from the network: every host name fails to resolve.
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--window-size={PAGE_WIDTH},4000",
         f"--screenshot={shot}", chaos_report.as_uri()],
        capture_output=True, text=True, timeout=300)
    assert shot.exists(), proc.stderr[-3000:]
    image = image_module.open(shot).convert("RGB")
    assert image.size == (PAGE_WIDTH, 4000)
    width, _height = image.size

    def colors(box) -> set:
        return {color for _count, color in image.crop(box).getcolors(1 << 24)}

    # The verdict, in red, is at the top of the page.
    top = colors((0, 0, width, 80))
    assert any(r > 150 and g < 80 and b < 80 for r, g, b in top), "no red FAIL at the top"
    # Text and charts drew: many colours over the page, and the green "up" lanes and the
    # shaded fault band of the timeline are there.
    everything = colors((0, 0, width, 4000))
    assert len(everything) > 200
    assert (0x22, 0xAA, 0x77) in everything  # lanes: answering scrapes
    html = chaos_report.read_text()
    assert "Chaos timeline" in html and "<script" not in html
    # Nothing overflows the page sideways: long names wrap.
    assert colors((width - 30, 0, width, 4000)) <= {(255, 255, 255)}
