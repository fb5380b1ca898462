"""A PNG of the inspector page as a browser renders it (headless Chromium through Selenium)."""

from __future__ import annotations

import shutil
from pathlib import Path


def screenshot(html: Path, png: Path, *, width: int = 1280, height: int = 800) -> Path:
    """Render ``html`` in headless Chromium with a ``width`` x ``height`` viewport and save ``png``.

    Needs the ``selenium`` package (the ``test`` extra) and the Debian packages ``chromium`` and
    ``chromium-driver`` (``.ci/install-browser`` installs them); raises RuntimeError naming what is
    missing otherwise.
    """
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        raise RuntimeError(
            "--screenshot needs chromium and chromedriver (apt-get install chromium chromium-driver, "
            "or bash .ci/install-browser)"
        )
    try:
        from selenium import webdriver
    except ImportError as exc:
        raise RuntimeError("--screenshot needs selenium (pip install -e '.[test]')") from exc
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get(Path(html).resolve().as_uri())
        png = Path(png)
        png.parent.mkdir(parents=True, exist_ok=True)
        if not driver.save_screenshot(str(png)):
            raise RuntimeError(f"the browser could not write {png}")
    finally:
        driver.quit()
    return png
