"""A real browser for the report's tests: Debian's chromium, driven by selenium through chromium-driver.

    reason = ensure_browser()      None when ready (installed with apt-get when missing), else why not
    driver = start_browser(profile_dir)    headless, sandbox off (root in CI), nothing fetched in the background
"""

from __future__ import annotations

import os

from tests.support.apt import apt_install

PACKAGES = ("chromium", "chromium-driver")
BINARY, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def ensure_browser(timeout_s: float = 900.0) -> str | None:
    """Install Debian's chromium and chromium-driver when missing. None when ready, else why not (a skip reason)."""
    if os.path.exists(BINARY) and os.path.exists(DRIVER):
        return None
    reason = apt_install(PACKAGES, timeout_s)
    if reason:
        return reason
    missing = [path for path in (BINARY, DRIVER) if not os.path.exists(path)]
    return f"installed {PACKAGES} but {missing} are still missing" if missing else None


def start_browser(profile_dir: str):
    """A headless chromium (a fresh profile in `profile_dir`) that keeps the page's console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BINARY
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--autoplay-policy=no-user-gesture-required",
                     f"--user-data-dir={profile_dir}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=options)
