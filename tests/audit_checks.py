"""Shared checks of the audit tests: records read back from a sub-run folder, values recomputed
independently (numpy/scipy here, never the code under test), and the headless-browser check."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def read_records(folder: Path) -> list[dict]:
    """Every finished record of a run folder's records.jsonl (the first line is the config)."""
    out = []
    for line in (folder / "records.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if "key" in entry and "record" in entry and "error" not in entry["record"]:
            out.append(entry["record"])
    return out


def t_interval(values) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% Student t interval, computed here with scipy.stats."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return mean, mean - half, mean + half


def assert_estimate(estimate: dict, values, scale: float = 1.0) -> None:
    mean, low, high = t_interval([v * scale for v in values])
    assert estimate["n"] == len(values)
    assert estimate["value"] == pytest.approx(mean, abs=1e-9)
    if np.isnan(low):
        assert estimate["low"] is None
        return
    assert estimate["low"] == pytest.approx(low, abs=1e-9)
    assert estimate["high"] == pytest.approx(high, abs=1e-9)


def share_interval(values) -> tuple[float, float, float]:
    """A share's mean and 95% interval as scipy's bootstrap gives it (BCa, 9,999 resamples seeded 0;
    percentile where BCa is undefined; the value itself where every value is equal)."""
    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=float)
    if np.all(x == x[0]):
        return float(x[0]), float(x[0]), float(x[0])
    for method in ("BCa", "percentile"):
        ci = bootstrap((x,), np.mean, n_resamples=9999, method=method,
                       random_state=np.random.default_rng(0)).confidence_interval
        if np.isfinite(ci.low) and np.isfinite(ci.high):
            break
    return float(x.mean()), float(ci.low), float(ci.high)


def assert_share_estimate(estimate: dict, values, scale: float = 1.0) -> None:
    mean, low, high = share_interval(values)
    assert estimate["n"] == len(values)
    assert estimate["value"] == pytest.approx(mean * scale, abs=1e-9)
    assert estimate["low"] == pytest.approx(low * scale, abs=1e-9)
    assert estimate["high"] == pytest.approx(high * scale, abs=1e-9)
    assert 0.0 <= estimate["low"] <= estimate["high"] <= 100.0  # a share never leaves its range


def chromium_or_skip() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip('the browser test needs Playwright: pip install "ctrlsim[dev]" (playwright)')
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("the browser test needs a Chromium executable (Debian: apt-get install chromium); none found")


def check_in_browser(report: Path, screenshot: Path) -> dict:
    """Open `report` in headless Chromium with every request intercepted; returns what was seen.

    Only the file itself and data: URIs are let through; anything else is aborted and recorded."""
    from playwright.sync_api import sync_playwright

    executable = chromium_or_skip()
    page_url = report.resolve().as_uri()
    seen: list[str] = []
    blocked: list[str] = []

    def route(r) -> None:
        url = r.request.url
        seen.append(url)
        if url == page_url or url.startswith("data:"):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda req: seen.append(req.url))
            page.route("**/*", route)
            page.goto(page_url, wait_until="load")
            widths = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
            sources = page.evaluate("Array.from(document.images).map(i => i.src.slice(0, 22))")
            page.screenshot(path=str(screenshot))
            page.emulate_media(media="print")
            printable = page.evaluate("getComputedStyle(document.querySelector('.summary')).pageBreakAfter")
        finally:
            browser.close()
    return {"seen": seen, "blocked": blocked, "images": widths, "sources": sources, "page_url": page_url,
            "printable": printable}


def pixel_variance(png: Path) -> float:
    from PIL import Image

    return float(np.asarray(Image.open(png).convert("L"), dtype=float).var())
