"""The live view in a real browser: Debian's Chromium, headless, driven by Playwright
(on the system browser through its executable path; Playwright's own browser
download is never used). `.ci/run` installs Chromium and the `test` extra installs
Playwright, so these tests run in every CI run; a machine without them fails here
with a message that says what to install, never a skip.

The servers run the real default model (fp32) with its shipped DSpark drafter and
a synthetic step-time table, and without speculation. Each page's screenshot is
written to the test's temporary folder, or to $DSPARK_SCREENSHOT_DIR when set
(`DSPARK_SCREENSHOT_DIR=docs/live pytest tests/test_live_browser.py` refreshes the
README's pictures).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest

# the servers: module-scoped fixtures of test_dashboard, built once more for this module
from test_dashboard import KEY, plain_server, spec_server  # noqa: F401

CHROMIUM = os.environ.get("DSPARK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1360, "height": 900}


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: pip install -e '.[test]' (or pip install playwright)")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set DSPARK_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("DSPARK_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def close(self) -> None:
        self.context.close()


def enter_key(page) -> None:
    page.wait_for_selector("#key-box:not([hidden])", timeout=10_000)
    page.fill("#key-input", KEY)
    page.click("#key-form button")


def updates(page) -> int:
    return int(page.evaluate("Number(document.body.dataset.updates || 0)"))


def send_traffic(url: str, n: int, max_tokens: int, headers: dict | None = None) -> threading.Thread:
    def one(i: int) -> None:
        httpx.post(url + "/v1/completions", headers=headers, timeout=300,
                   json={"prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens,
                         "temperature": 0}).raise_for_status()

    def all_of_them() -> None:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    t = threading.Thread(target=all_of_them)
    t.start()
    return t


def test_dashboard_goes_live_and_its_figures_move(browser, spec_server, shots):
    p = Page(browser)
    page = p.page
    page.goto(spec_server.url + "/")
    enter_key(page)
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 2", timeout=30_000)
    assert page.inner_text("#t-mode").startswith("dspark")
    tokens_before = page.evaluate("samples[samples.length - 1].gen")
    traffic = send_traffic(spec_server.url, 4, 48, {"Authorization": f"Bearer {KEY}"})
    # the output rate tile turns positive while the requests run
    page.wait_for_function("Number(document.getElementById('t-tps').textContent) > 0", timeout=120_000)
    traffic.join()
    seen = updates(page)
    page.wait_for_function(f"Number(document.body.dataset.updates) >= {seen + 2}", timeout=30_000)
    assert page.evaluate("samples[samples.length - 1].gen") == tokens_before + 4 * 48
    assert page.evaluate("steps.length") > 0
    al = page.inner_text("#t-al")  # "–" when no step of the window drafted (plain under the fallback)
    assert al == "–" or float(al) >= 1.0
    assert page.evaluate("document.getElementById('c-cal').closest('.card').hidden") is False
    # four requests at once: the fallback's governed level, which starts with plain decoding
    assert page.evaluate("document.getElementById('fallback-card').hidden") is False
    assert "4 running requests and more" in page.inner_text("#fallback-note")
    assert page.inner_text("#fallback").split("\n")[1].split("\t")[:2] == ["4-7", "plain"]
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
    assert (shots / "dashboard.png").stat().st_size > 10_000
    assert p.errors == []
    p.close()


def test_race_finishes_with_identical_texts(browser, spec_server, shots):
    p = Page(browser)
    page = p.page
    page.goto(spec_server.url + "/race")
    enter_key(page)
    page.fill("#prompt", "Explain in a few sentences why the sky is blue.")
    page.fill("#max-tokens", "32")
    page.click("#go")
    page.wait_for_selector("#verdict:not([hidden])", timeout=600_000)
    assert page.get_attribute("#verdict", "data-identical") == "true", page.inner_text("#verdict")
    plain, spec = page.inner_text("#out-plain"), page.inner_text("#out-spec")
    assert plain and plain == spec
    assert page.locator("#out-spec span.d").count() > 0  # accepted drafts are marked
    assert page.locator("#out-plain span.d").count() == 0
    assert "steps" in page.inner_text("#stats-spec") and "tok/s" in page.inner_text("#stats-plain")
    page.screenshot(path=str(shots / "race.png"), full_page=True)
    assert (shots / "race.png").stat().st_size > 10_000
    assert p.errors == []
    p.close()


def test_plain_server_pages_show_what_applies(browser, plain_server, shots):
    p = Page(browser)
    page = p.page
    page.goto(plain_server.url + "/")
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 1", timeout=30_000)
    assert page.inner_text("#t-mode") == "plain (no speculation)"
    assert page.evaluate("document.getElementById('c-cal').closest('.card').hidden") is True
    assert page.evaluate("document.getElementById('key-box').hidden") is True  # no key asked for
    traffic = send_traffic(plain_server.url, 2, 24)
    page.wait_for_function("Number(document.getElementById('t-tps').textContent) > 0", timeout=120_000)
    traffic.join()
    page.screenshot(path=str(shots / "dashboard-plain.png"), full_page=True)
    page.goto(plain_server.url + "/race")
    page.fill("#max-tokens", "16")
    page.click("#go")
    page.wait_for_selector("#verdict:not([hidden])", timeout=120_000)
    assert page.get_attribute("#verdict", "data-identical") == "true"
    assert "without speculation" in page.inner_text("#spec-tag")
    assert p.errors == []
    p.close()
