"""A real headless Chromium driven by selenium, for the dashboard tests: the system's browser
and driver (Debian's `chromium` and `chromium-driver`, scripts/ci_system_deps) by their explicit
paths, so Selenium Manager never downloads anything. Without them the tests skip with one
reason — and fail when CI=true, where they must run."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
T = TypeVar("T")


def require_browser() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if not missing:
        return
    reason = f"the dashboard's browser tests need {', '.join(missing)} (scripts/ci_system_deps)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1700) -> Iterator[Any]:
    """A headless Chromium whose console messages can be read (get_log("browser"))."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--disable-extensions",
                "--no-first-run", "--disable-background-networking"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The console's errors since the last call (a failed load, an exception, console.error)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.1) -> T:
    """probe()'s first truthy answer, polled; fails naming `what` after timeout_s."""
    end = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):  # an element being redrawn between two looks
            if found := probe():
                return found
        assert time.monotonic() < end, f"{what}: not within {timeout_s} s"
        time.sleep(every_s)


def text(driver: Any, element_id: str) -> str:
    return str(driver.find_element("id", element_id).text)


def screenshot(driver: Any) -> bytes:
    """The page as PNG; also written where MLX_CLUSTER_SCREENSHOT says (README's image)."""
    png: bytes = driver.get_screenshot_as_png()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    if target := os.environ.get("MLX_CLUSTER_SCREENSHOT"):
        Path(target).write_bytes(png)
    return png
