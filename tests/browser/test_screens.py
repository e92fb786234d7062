"""The dashboard as issue 25 and issue 24 item 7 ask, in a real headless Chromium (Playwright):
screenshots at 1440 px and 390 px of RUNNING, STALE and finished jobs (checked here: every
state shows, nothing is cut off, a STALE job offers no ETA, rate nor cancel), a finished job
still listed after a reload, a list response read before a worker's verdict never shows the
STALE job RUNNING again, and the operator token carried from the URL fragment to a cancel.

Real worker processes, real Redis, real uvicorn (in a thread of the test process). With
``JOBPULSE_UPDATE_SCREENSHOTS=1`` the screenshots are written to ``docs/img/`` (the ones
docs/http.md shows), else to ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from jobpulse._protocol.keys import KeySchema
from tests.integration.http_server import ServerThread
from tests.support import spawn_ready, stop

from .test_dashboard import ARGS, ARTIFACTS, CHROMIUM, ROOT, WAIT_MS, row, state_is
from .test_operator import _clean, seed

playwright_api = pytest.importorskip("playwright.sync_api")

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.xdist_group("screens"),  # one worker, one browser (module fixture)
]
SHOTS = ROOT / "docs" / "img" if os.environ.get("JOBPULSE_UPDATE_SCREENSHOTS") else ARTIFACTS
TOKEN = "browser-test-token-42"
NONE = "\u2013"  # the en dash the dashboard shows for "no value"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def watch_console(page: object) -> list[str]:
    """Page errors, console errors and failed (4xx/5xx) responses, as they come."""
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"pageerror {exc}"))  # type: ignore[attr-defined]
    page.on(  # type: ignore[attr-defined]
        "console", lambda m: problems.append(f"console {m.text}") if m.type == "error" else None
    )
    page.on(  # type: ignore[attr-defined]
        "response",
        lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    return problems


def fits(page: object) -> None:
    """Nothing is cut off: no horizontal scroll of the page nor of the table."""
    widths = page.evaluate(  # type: ignore[attr-defined]
        """() => ({page: document.documentElement.scrollWidth, view: innerWidth,
                   table: document.querySelector('#table-wrap').scrollWidth,
                   wrap: document.querySelector('#table-wrap').clientWidth})"""
    )
    assert widths["page"] <= widths["view"], widths
    assert widths["table"] <= widths["wrap"], widths


def cell(page: object, job: str, name: str) -> str:
    return str(page.inner_text(f"{row(job)} td.{name}"))  # type: ignore[attr-defined]


def test_screens_of_running_stale_and_finished_jobs_at_1440_and_390_px(
    browser: object, redis_url: str, ns: str
) -> None:
    running = spawn_ready(
        "tests.integration.worker_proc", redis_url, ns, "report-7", "2.0", "report"
    )
    doomed = spawn_ready("tests.integration.worker_proc", redis_url, ns, "video-3", "2.0", "video")
    finite = spawn_ready(
        "tests.browser.finite_proc", redis_url, ns, "etl/2026-12", "20", stdin=True
    )
    longer = spawn_ready("tests.browser.finite_proc", redis_url, ns, "import-9", "900", stdin=True)
    page = browser.new_page(viewport={"width": 1440, "height": 700})  # type: ignore[attr-defined]
    problems = watch_console(page)
    try:
        with ServerThread(redis_url, ns, keepalive=1.0) as srv:
            page.goto(srv.base_url + "/?refresh=0.5")
            for job in ("report-7", "video-3", "etl/2026-12", "import-9"):
                state_is(page, job, "RUNNING")
            for proc in (finite, longer):
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            state_is(page, "etl/2026-12", "COMPLETED")
            doomed.send_signal(signal.SIGKILL)
            state_is(page, "video-3", "STALE")
            # A finished job leaves GET /jobs; this tab still shows it after a reload.
            page.reload()
            state_is(page, "etl/2026-12", "COMPLETED")
            state_is(page, "video-3", "STALE")
            state_is(page, "report-7", "RUNNING")
            page.select_option("#state-filter", "ended")
            assert page.locator("#jobs tbody tr:not([hidden])").count() == 1
            page.select_option("#state-filter", "*")
            # STALE: no ETA nor rate of the dead worker; its detail explains and offers no cancel
            assert cell(page, "video-3", "eta") == NONE
            assert cell(page, "video-3", "rate") == NONE
            assert cell(page, "report-7", "rate").endswith("/s")
            page.wait_for_function(  # the live row has its rate and ETA
                "([sel, none]) => document.querySelector(sel).textContent !== none",
                arg=[f"{row('import-9')} td.eta", NONE],
                timeout=WAIT_MS,
            )
            fits(page)
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "dashboard-1440.png"))
            page.click(f"{row('video-3')} td.job")
            page.wait_for_selector("#stale-note", state="visible", timeout=WAIT_MS)
            page.wait_for_selector("#timeline li.ev-stale", timeout=WAIT_MS)
            assert page.locator("#cancel").is_hidden()
            assert page.inner_text('#detail-fields dd[data-field="eta"]') == NONE
            fence_help = page.get_attribute("#detail-fields dt.help:text('fence')", "title")
            assert fence_help is not None
            assert "attempt" in fence_help
            stale_text = page.inner_text("#timeline li.ev-stale .ev-text")
            assert stale_text.startswith("STALE: no heartbeat")
            assert page.inner_text("#timeline li.ev-stale .ev-time") != ""  # it has a time
            start_text = page.inner_text("#timeline li.ev-start .ev-text")
            assert start_text.startswith("attempt 1 started")
            page.screenshot(path=str(SHOTS / "dashboard-detail-stale-1440.png"))
            page.click("#detail-close")

            page.set_viewport_size({"width": 390, "height": 760})
            fits(page)
            for job in ("report-7", "video-3", "etl/2026-12"):
                assert page.locator(f"{row(job)} .state").is_visible()
                assert page.locator(f"{row(job)} .bar").is_visible()
            page.screenshot(path=str(SHOTS / "dashboard-390.png"))
            page.click(f"{row('report-7')} td.job")
            page.wait_for_selector("#cancel", state="visible", timeout=WAIT_MS)
            page.wait_for_function(
                "() => Number(document.querySelector('#sparkline').dataset.points) >= 2",
                timeout=WAIT_MS,
            )
            assert page.inner_text("#rate-max").startswith("peak ")
            box = page.locator("#detail").bounding_box()
            assert box is not None
            assert box["width"] <= 390
            page.screenshot(path=str(SHOTS / "dashboard-detail-390.png"))
            seen = list(problems)  # before the server stops under the open page
    finally:
        page.close()
        for proc in (running, doomed, finite, longer):
            stop(proc)
        _clean(redis_url, ns)
    assert seen == []  # no favicon 404, no script error


def test_a_list_read_before_the_verdict_never_shows_a_stale_job_running_again(
    browser: object, redis_url: str, ns: str
) -> None:
    """Issue 24 item 7: a GET /jobs answer read while the job was RUNNING arrives after the
    STALE verdict; its (fence, seq) equal the verdict's (a dead worker's seq stands still), so
    the dashboard orders the two by the server's clock and keeps STALE."""
    seed(redis_url, ns, ["held"], ttl_ms=3_600_000)
    page = browser.new_page()  # type: ignore[attr-defined]
    problems = watch_console(page)
    try:
        with ServerThread(redis_url, ns, keepalive=1.0) as srv:
            page.goto(srv.base_url + "/?refresh=0.3")
            state_is(page, "held", "RUNNING")
            page.wait_for_selector(f'{row("held")}[data-transport="sse"]', timeout=WAIT_MS)
            held: list[object] = []

            def hold(route: object) -> None:
                held.append(route)  # list requests from now on wait, unanswered

            page.route("**/jobs", hold)
            deadline = time.monotonic() + WAIT_MS / 1000
            while not held:
                assert time.monotonic() < deadline, "the page sent no list request"
                page.wait_for_timeout(20)
            before = httpx.get(srv.base_url + "/jobs", timeout=30).text  # read while RUNNING
            assert [j["state"] for j in json.loads(before)["jobs"]] == ["RUNNING"]
            lists = int(page.get_attribute("body", "data-lists") or "0")
            client = redis.Redis.from_url(redis_url)
            client.delete(KeySchema(ns).alive("held"))  # the worker's liveness key is gone
            client.close()
            state_is(page, "held", "STALE")  # the SSE verdict
            page.evaluate(
                """(sel) => {
                    window.__states = [];
                    new MutationObserver(() => window.__states.push(
                        document.querySelector(sel).dataset.state)
                    ).observe(document.querySelector(sel), {attributes: true});
                }""",
                row("held"),
            )
            held[0].fulfill(status=200, content_type="application/json", body=before)  # type: ignore[attr-defined]
            page.wait_for_function(
                f"() => Number(document.body.dataset.lists) > {lists}", timeout=WAIT_MS
            )
            assert page.get_attribute(row("held"), "data-state") == "STALE"
            assert "RUNNING" not in page.evaluate("() => window.__states")
            seen = list(problems)
    finally:
        page.close()
        _clean(redis_url, ns)
    assert seen == []


def test_the_page_cancels_with_the_token_of_its_url_fragment_or_its_form(
    browser: object, redis_url: str, ns: str
) -> None:
    one = spawn_ready("tests.integration.worker_proc", redis_url, ns, "tok-1", "2.0", "etl")
    two = spawn_ready("tests.integration.worker_proc", redis_url, ns, "tok-2", "2.0", "etl")
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    try:
        with ServerThread(redis_url, ns, keepalive=1.0, token=TOKEN) as srv:
            # Without the token the dry run answers 401: no button, the form asks for it.
            page.goto(srv.base_url + "/?refresh=0.5")
            state_is(page, "tok-1", "RUNNING")
            with page.expect_response(lambda r: "dry_run=1" in r.url) as answer:
                page.click(f"{row('tok-1')} td.job")
            assert answer.value.status == 401
            page.wait_for_selector("#token-form", state="visible", timeout=WAIT_MS)
            assert page.locator("#cancel").is_hidden()
            page.fill("#token-input", "wrong-token")
            with page.expect_response(lambda r: "dry_run=1" in r.url) as answer:
                page.click("#token-form button")
            assert answer.value.status == 401
            page.wait_for_selector("#token-hint:text('That token was refused.')", timeout=WAIT_MS)
            page.fill("#token-input", TOKEN)
            page.click("#token-form button")
            page.wait_for_selector("#cancel", state="visible", timeout=WAIT_MS)
            assert page.locator("#token-form").is_hidden()
            page.click("#cancel")
            state_is(page, "tok-1", "CANCELLED")
            assert page.inner_text("#cancel-result") == "cancel requested"

            # From the URL fragment (never sent to the server), in a fresh tab: the address bar
            # drops it at once, and the cancel carries it.
            fresh = context.new_page()
            sent: list[str] = []
            fresh.on("request", lambda r: sent.append(r.url + " " + json.dumps(r.headers)))
            fresh.goto(srv.base_url + f"/?refresh=0.5#token={TOKEN}")
            state_is(fresh, "tok-2", "RUNNING")
            assert "token" not in fresh.url
            fresh.click(f"{row('tok-2')} td.job")
            fresh.wait_for_selector("#cancel", state="visible", timeout=WAIT_MS)
            with fresh.expect_request(lambda r: r.url.endswith("/tok-2/cancel")) as request:
                fresh.click("#cancel")
            assert request.value.headers["authorization"] == f"Bearer {TOKEN}"
            state_is(fresh, "tok-2", "CANCELLED")
            fresh.close()
        # the token travels only in the cancel requests' header, never in a URL
        assert not any(TOKEN in line.split(" ", 1)[0] for line in sent)
        carried = [line.split(" ", 1)[0] for line in sent if TOKEN in line]
        assert carried
        assert all("/cancel" in u for u in carried)
        assert not any(TOKEN in text for text in console)
        assert one.wait(timeout=30) != 0
        assert two.wait(timeout=30) != 0
    finally:
        context.close()
        stop(one)
        stop(two)
        _clean(redis_url, ns)
