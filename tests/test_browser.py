"""The pages people look at, opened in a real browser (issue #33): a run's ``report.html``
and a ``compare.html`` in headless Chromium (Debian's ``chromium``, driven by Playwright):
every image loads, no console error, the run's key numbers are on the page, and a
screenshot of each is kept under the run directory and copied to ``runs/test-artifacts/``
(CI keeps that folder). The built documentation site the same way, served on loopback:
pages render without console errors, the navigation goes where it says and the search box
finds a config key."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from conftest import tiny_overrides

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "runs" / "test-artifacts"
CHROMIUM = os.environ.get("FEDRAY_CHROMIUM") or shutil.which("chromium") or shutil.which(
    "chromium-browser")
# as root in a closed network: no sandbox, no background connections Chromium would retry
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage"]

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); make test's "
                             "preflight refuses to run without it")]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _cancelled(request) -> bool:
    """A request the browser itself gave up because the page navigated away (a favicon
    still loading when a test clicks a link): not a broken asset. A missing file is a 404
    response, and any other network failure still counts."""
    return "ERR_ABORTED" in (request.failure or "")


@contextlib.contextmanager
def opened(browser, url: str):
    """A page at ``url`` with its console errors and failed requests collected."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: None if _cancelled(r) else
            errors.append(f"failed: {r.url} ({r.failure})"))
    page.goto(url, wait_until="load")
    try:
        yield page, errors
    finally:
        page.close()


def broken_images(page) -> list[str]:
    return page.evaluate("""() => [...document.images]
        .filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt || i.src)""")


def keep(page, run_dir: str, name: str, full_page: bool = True) -> Path:
    shot = Path(run_dir) / name
    page.screenshot(path=str(shot), full_page=full_page)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / name)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    return shot


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    """Two 2-round FedAvg runs on digits differing only in seed."""
    from fedray.core.config import load_config
    from fedray.runtime import run_experiment

    root = tmp_path_factory.mktemp("browser_runs")
    made = []
    for seed in (1, 2):
        cfg = load_config(None, tiny_overrides(rounds=2, seed=seed))
        run_experiment(cfg, str(root / f"seed{seed}"), progress=False)
        made.append(str(root / f"seed{seed}"))
    return made


@pytest.mark.ray
def test_report_html_in_chromium(browser, runs):
    from fedray.front.report import report

    res = report(runs[0])
    summary = json.loads((Path(runs[0]) / "summary.json").read_text())
    with opened(browser, Path(res["html"]).as_uri()) as (page, errors):
        assert page.locator("img").count() == len(res["plots"]) >= 3
        assert broken_images(page) == []
        text = page.inner_text("body")
        assert f"{summary['final_global_accuracy']:.4f}" in text
        total = summary["total_upload_bytes"] + summary["total_download_bytes"]
        assert f"{total:,}" in text
        assert "Chance on digits" in text
        keep(page, res["out_dir"], "report.png")
        assert errors == []


@pytest.mark.ray
def test_compare_html_in_chromium(browser, runs, tmp_path):
    from fedray.front.report import compare

    res = compare(runs, str(tmp_path / "cmp"))
    with opened(browser, Path(res["html"]).as_uri()) as (page, errors):
        assert page.locator("img").count() >= 2 and broken_images(page) == []
        text = page.inner_text("body")
        for run in runs:
            acc = json.loads((Path(run) / "summary.json").read_text())["final_global_accuracy"]
            assert f"{acc:.4f}" in text, (run, acc)
        assert "seed" in text.lower()  # the over-seeds table
        keep(page, res["out_dir"], "compare.png")
        assert errors == []


@pytest.fixture(scope="module")
def served_site(site):
    """The site as ``make docs`` builds it, on a loopback port (search needs HTTP)."""
    out = site
    handler = functools.partial(_Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", out
    server.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_site_pages_render_navigate_and_search(browser, served_site):
    base, out = served_site
    pages = ["index.html", "tutorials/first-run.html", "methods/orders.html",
             "reference/config-keys.html", "reference/api/runtime.html", "concepts/clock.html"]
    for rel in pages:
        with opened(browser, f"{base}/{rel}") as (page, errors):
            assert page.locator("article h1").count() == 1, rel
            assert broken_images(page) == [], rel
            assert errors == [], (rel, errors)
    with opened(browser, f"{base}/index.html") as (page, errors):
        page.get_by_role("link", name="Every config key").first.click()
        page.wait_for_url("**/reference/config-keys.html")
        assert "dp.noise_multiplier" in page.inner_text("article")
        page.locator("label.md-search__icon, .md-search__input").first.click()
        page.locator("input.md-search__input").fill("noise_multiplier")
        results = page.locator(".md-search-result__item")
        results.first.wait_for(timeout=20_000)
        assert results.count() >= 1
        assert "noise_multiplier" in page.inner_text(".md-search-result")
        keep(page, str(out), "site-search.png", full_page=False)
        assert errors == []
