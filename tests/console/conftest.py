"""The console's browser tests share these, one of each per module: the console of the shared stack (`web`, started
as a user starts it, with the plane's two workers), Debian's Chromium driven by Playwright (`browser`), one page
entered with the token (`session`), and `page`, which fails the test that used it when the page logged an error in the
browser's console or requested anything from another address."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.console.consoles import console_of

CHROMIUM = Path("/usr/bin/chromium")
# no sandbox (root in CI), nothing fetched by the browser itself: Playwright's own browser download never runs here
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def web(stack):
    """The console of the shared stack (two workers); stopped after the module."""
    with console_of(stack, 2) as result:
        yield result


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: `apt-get install -y chromium` (Debian's) runs the browser tests")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def session(browser, web):
    """One page for the module, entered with the token; what it requested and what it logged as an error."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(60_000)
    seen = {"requests": [], "problems": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("console", lambda m: seen["problems"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["problems"].append(str(e)))
    page.goto(web["url_with_token"])
    page.wait_for_selector("[data-testid=run]")
    assert page.url == web["url"]  # the token went from the address bar
    try:
        yield page, seen
    finally:
        context.close()


@pytest.fixture
def page(session, web):
    page, seen = session
    yield page
    assert seen["problems"] == [], "the page logged errors in the browser's console"
    origin = web["url"].rstrip("/")
    foreign = sorted({u for u in seen["requests"] if not u.startswith((origin + "/", "data:", "blob:"))})
    assert foreign == [], "the page loaded something from another address"
