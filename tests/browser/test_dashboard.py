"""The dashboard in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright): a running job's bar advances to 100 %, a SIGKILLed worker's row turns STALE in red,
and the polling fallback follows a job too. A screenshot is kept in ``test-artifacts/``.

Real worker processes, real Redis, real uvicorn (in a thread of the test process).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.http_server import ServerThread
from tests.support import spawn_ready, stop

playwright_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("JOBPULSE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]  # fmt: skip
ARTIFACTS = ROOT / "test-artifacts"
WAIT_MS = 60_000
NONE = "\u2013"  # the dashboard's "no value"

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)",
    ),
    pytest.mark.xdist_group("dashboard"),  # one worker, one browser (module fixture)
]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def server(redis_url: str, ns: str) -> Iterator[ServerThread]:
    with ServerThread(redis_url, ns, keepalive=1.0) as srv:
        yield srv
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def row(job: str) -> str:
    return f'tr[data-job="{job}"]'


def percent_is(page: object, job: str, test: str) -> None:
    """Wait until the row's bar value (a number, 0-100) satisfies the JS expression ``test``."""
    page.wait_for_function(  # type: ignore[attr-defined]
        """([sel, test]) => {
            const bar = document.querySelector(sel + " .bar");
            if (!bar) return false;
            const v = parseFloat(bar.getAttribute("aria-valuenow"));
            return !Number.isNaN(v) && new Function("v", "return " + test)(v);
        }""",
        arg=[row(job), test],
        timeout=WAIT_MS,
    )


def still_at_least(page: object, job: str, seconds: float) -> None:
    """Wait until the row's "no progress for" cell shows at least ``seconds`` (``"1.4 s"``)."""
    page.wait_for_function(  # type: ignore[attr-defined]
        """([sel, least]) => {
            const td = document.querySelector(sel + " .still");
            const m = td && /^([0-9.]+) s$/.exec(td.textContent);
            return m !== null && parseFloat(m[1]) >= least;
        }""",
        arg=[row(job), seconds],
        timeout=WAIT_MS,
    )


def state_is(page: object, job: str, state: str) -> None:
    page.wait_for_selector(  # type: ignore[attr-defined]
        f'{row(job)}[data-state="{state}"]', timeout=WAIT_MS
    )


def test_bar_reaches_100_percent_and_a_killed_worker_turns_stale(
    browser: object, server: ServerThread, redis_url: str, ns: str
) -> None:
    finite = spawn_ready(
        "tests.browser.finite_proc", redis_url, ns, "report/2024:q3", "30", stdin=True
    )
    doomed = spawn_ready("tests.integration.worker_proc", redis_url, ns, "video-encode-7", "1.0")
    page = browser.new_page(viewport={"width": 1280, "height": 420})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(server.base_url + "/?refresh=0.5")
        state_is(page, "report/2024:q3", "RUNNING")
        state_is(page, "video-encode-7", "RUNNING")
        assert page.get_attribute(row("report/2024:q3"), "data-transport") == "sse"
        # alive but not advancing (it waits for stdin): its standstill shows, and grows
        still_at_least(page, "report/2024:q3", 1.0)
        assert finite.stdin is not None
        finite.stdin.write("go\n")
        finite.stdin.flush()
        percent_is(page, "report/2024:q3", "v > 0 && v < 100")  # it advances...
        percent_is(page, "report/2024:q3", "v === 100")  # ...to the end
        state_is(page, "report/2024:q3", "COMPLETED")
        assert "100 %" in page.inner_text(f"{row('report/2024:q3')} .label")
        assert page.inner_text(f"{row('report/2024:q3')} .memory").endswith("MiB")

        doomed.send_signal(signal.SIGKILL)
        state_is(page, "video-encode-7", "STALE")
        badge = page.locator(f"{row('video-encode-7')} .state")
        assert badge.inner_text() == "STALE"
        assert badge.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(198, 40, 40)"
        assert "stale" in (page.get_attribute(row("video-encode-7"), "class") or "")
        assert page.inner_text(f"{row('video-encode-7')} .still") == NONE  # no worker to wait on
        assert page.inner_text(f"{row('report/2024:q3')} .still") == NONE  # nothing left to do
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    finally:
        page.close()
        stop(finite)
        stop(doomed)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 0
    assert errors == []


def test_polling_fallback_follows_a_job_to_the_end(
    browser: object, server: ServerThread, redis_url: str, ns: str
) -> None:
    finite = spawn_ready("tests.browser.finite_proc", redis_url, ns, "polled", "15", stdin=True)
    page = browser.new_page()  # type: ignore[attr-defined]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(server.base_url + "/?refresh=0.5&transport=poll")
        state_is(page, "polled", "RUNNING")
        assert page.get_attribute(row("polled"), "data-transport") == "poll"
        assert finite.stdin is not None
        finite.stdin.write("go\n")
        finite.stdin.flush()
        percent_is(page, "polled", "v === 100")
        state_is(page, "polled", "COMPLETED")
    finally:
        page.close()
        stop(finite)
    assert not any(url.endswith("/events") for url in requests)
    assert any(url.endswith("/jobs/polled") for url in requests)


def test_sse_failure_falls_back_to_polling(
    browser: object, server: ServerThread, redis_url: str, ns: str
) -> None:
    """The event stream answers 503 (blocked here by the browser); the row keeps moving by polls."""
    finite = spawn_ready("tests.browser.finite_proc", redis_url, ns, "fallback", "15", stdin=True)
    page = browser.new_page()  # type: ignore[attr-defined]
    page.route(
        "**/events*",
        lambda route: route.fulfill(status=503, body='{"error": "status store unavailable"}'),
    )
    try:
        page.goto(server.base_url + "/?refresh=0.5")
        page.wait_for_selector(f'{row("fallback")}[data-transport="poll"]', timeout=WAIT_MS)
        assert finite.stdin is not None
        finite.stdin.write("go\n")
        finite.stdin.flush()
        percent_is(page, "fallback", "v === 100")
        state_is(page, "fallback", "COMPLETED")
    finally:
        page.close()
        stop(finite)
