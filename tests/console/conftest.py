"""The console's browser tests: a real cluster, `tide console` as a process, headless
Chromium (Debian's) driven by Selenium through Debian's chromedriver.

Chromium and chromedriver are installed with apt-get where they are missing and apt
works (``make chromium`` does the same); the tests are skipped, with the reason, where
they cannot be. Screenshots of every page go to ``build/console-screenshots/`` (not
committed; ``TIDE_CONSOLE_SCREENSHOTS`` moves them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("TIDE_CONSOLE_SCREENSHOTS", ROOT / "build" / "console-screenshots"))
WAIT_SCALE = float(os.environ.get("TIDE_TEST_WAIT_SCALE", "2"))


def _apt_install(*packages: str) -> None:
    if not shutil.which("apt-get"):
        return
    for cmd in (["apt-get", "install", "-y", "-q", *packages], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", *packages]):
        try:
            done = subprocess.run(cmd, capture_output=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            return
        if cmd[1] == "install" and done.returncode == 0:
            return


def browser_binaries() -> tuple[str, str]:
    """(chromium, chromedriver), installed from Debian if need be; skips without them."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        _apt_install("chromium", "chromium-driver")
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        driver = shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("no chromium and chromedriver, and apt-get could not install them "
                    "(Debian packages chromium, chromium-driver)")
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium for a test module; nothing it loads may leave the machine."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--window-size=1280,900", "--disable-dev-shm-usage",
                # Every host name but the loopback fails to resolve: no asset from elsewhere.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class ConsoleProcess:
    """``tide console`` started by a test and stopped by its pid."""

    def __init__(self, args: list[str], log_path: Path):
        self.log_path = log_path
        log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tidewater.tools", "console", "--listen", "127.0.0.1:0",
             *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        self.url = self._wait_url()

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 30 * WAIT_SCALE
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith("console: "):
                    return line.split(" ", 1)[1].rstrip("/")
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"tide console did not start: {self.log_path.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


def screenshot(driver: object, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    return path
