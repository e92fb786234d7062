"""The dashboard as an operator's tool, in a real headless Chromium (Playwright): 500 jobs stay
readable, filters by kind and state, a SIGKILLed worker's row turns STALE, the detail view's
event timeline and rate sparkline, and a cancel from the page ending the job CANCELLED.

Real worker processes, real Redis, real uvicorn (in a thread of the test process). Screenshots
are kept in ``test-artifacts/``.
"""

from __future__ import annotations

import secrets
import signal
import zlib
from collections.abc import Iterator

import pytest
import redis
from starlette.requests import Request

from jobpulse._protocol.keys import KeySchema
from jobpulse._protocol.scripts import SCRIPTS
from tests.integration.http_server import ServerThread
from tests.support import spawn_ready, stop

from .test_dashboard import ARGS, ARTIFACTS, CHROMIUM, WAIT_MS, row, state_is

playwright_api = pytest.importorskip("playwright.sync_api")

pytestmark = [
    pytest.mark.skipif(
        not __import__("pathlib").Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"
    ),
    pytest.mark.xdist_group("operator"),  # one worker, one browser (module fixture)
]
KINDS = ("report", "etl", "video", "email")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _clean(redis_url: str, ns: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def server(redis_url: str, ns: str) -> Iterator[ServerThread]:
    with ServerThread(redis_url, ns, keepalive=1.0, max_jobs=1000) as srv:
        yield srv
    _clean(redis_url, ns)


def seed(redis_url: str, ns: str, ids: list[str], *, ttl_ms: int) -> dict[str, str]:
    """Start ``ids`` as a worker's acquire does (acquire.lua and the index writes) with no worker
    behind them: alive for ``ttl_ms``, then STALE. Returns each job's kind."""
    schema = KeySchema(ns)
    client = redis.Redis.from_url(redis_url)
    client.script_load(SCRIPTS.acquire.text)
    kinds = {job: KINDS[zlib.crc32(job.encode()) % len(KINDS)] for job in ids}
    pipe = client.pipeline(transaction=False)
    for job in ids:
        args = [secrets.token_hex(8), ttl_ms, 100, "seed:1", 1000, "", "", kinds[job]]
        pipe.execute_command("EVALSHA", SCRIPTS.acquire.sha, 4, *schema.job(job).all(), *args)
    replies = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for job, reply in zip(ids, replies, strict=True):
        now = int(reply[5])
        done = 1 + zlib.crc32(job.encode()) % 999
        fields = {"done": done, "stage": "work", "heartbeat_ms": now, "seq": 2}
        pipe.hset(schema.state(job), mapping=fields)
        pipe.zadd(schema.index_for(job), {job: now + ttl_ms})
        pipe.zadd(schema.kind_index(kinds[job]), {job: now})
    pipe.execute()
    client.close()
    return kinds


def visible_rows(page: object) -> int:
    return int(page.evaluate(  # type: ignore[attr-defined]
        "() => [...document.querySelectorAll('#jobs tbody tr')].filter(r => !r.hidden).length"
    ))  # fmt: skip


def test_500_jobs_stay_readable_and_filter_by_kind_and_state(
    browser: object, server: ServerThread, redis_url: str, ns: str
) -> None:
    ids = [f"job-{i:03d}" for i in range(495)]
    kinds = seed(redis_url, ns, ids, ttl_ms=3_600_000)
    stale_ids = [f"dead-{i}" for i in range(5)]
    kinds |= seed(redis_url, ns, stale_ids, ttl_ms=1)
    page = browser.new_page(viewport={"width": 1400, "height": 900})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(server.base_url + "/?refresh=1")
        page.wait_for_function(
            "() => document.querySelectorAll('#jobs tbody tr').length === 500", timeout=WAIT_MS
        )
        for job in stale_ids:
            state_is(page, job, "STALE")
        assert page.locator("tr.stale").count() == 5
        # a stale row stands out: red background band and bold red text
        color = page.locator(f"{row('dead-0')} td.job").evaluate("e => getComputedStyle(e).color")
        assert color == "rgb(198, 40, 40)"
        # at most MAX_FOLLOWED rows hold a live connection; the rest refresh with the list
        live = page.locator('tr[data-transport="sse"]').count()
        assert live <= 4
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-500.png"))

        page.select_option("#state-filter", "STALE")
        assert visible_rows(page) == 5
        page.screenshot(path=str(ARTIFACTS / "dashboard-500-stale.png"))
        page.select_option("#state-filter", "*")
        page.select_option("#kind-filter", "etl")
        assert visible_rows(page) == sum(1 for k in kinds.values() if k == "etl")
        page.select_option("#state-filter", "STALE")
        assert visible_rows(page) == sum(1 for j in stale_ids if kinds[j] == "etl")
        assert "showing" in page.inner_text("#summary")
    finally:
        page.close()
    assert errors == []


def test_detail_view_timeline_sparkline_and_a_cancel_that_ends_the_job_cancelled(
    browser: object, server: ServerThread, redis_url: str, ns: str
) -> None:
    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "enc-1", "2.0", "video")
    doomed = spawn_ready("tests.integration.worker_proc", redis_url, ns, "enc-2", "2.0", "video")
    page = browser.new_page(viewport={"width": 1400, "height": 800})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(server.base_url + "/?refresh=0.5")
        state_is(page, "enc-1", "RUNNING")
        state_is(page, "enc-2", "RUNNING")

        doomed.send_signal(signal.SIGKILL)  # a real worker dies: its row turns STALE
        state_is(page, "enc-2", "STALE")
        page.select_option("#state-filter", "STALE")
        assert visible_rows(page) == 1
        assert page.locator(f"{row('enc-2')}.stale").is_visible()
        page.select_option("#state-filter", "RUNNING")
        assert visible_rows(page) == 1
        page.select_option("#state-filter", "*")

        page.click(f"{row('enc-1')} td.job")
        page.wait_for_selector('#detail[data-job="enc-1"]', state="visible", timeout=WAIT_MS)
        page.wait_for_selector("#timeline li.ev-start", timeout=WAIT_MS)
        assert page.inner_text('#detail-fields dd[data-field="kind"]') == "video"
        # a beat every 1/3 s, a stream entry every 10 beats: rates between entries
        page.wait_for_function(
            "() => Number(document.querySelector('#sparkline').dataset.points || 0) >= 3",
            timeout=WAIT_MS,
        )
        points = page.get_attribute("#sparkline polyline", "points") or ""
        assert len(points.split()) >= 3
        page.wait_for_selector("#cancel", state="visible", timeout=WAIT_MS)
        page.screenshot(path=str(ARTIFACTS / "dashboard-detail.png"))
        page.click("#cancel")
        state_is(page, "enc-1", "CANCELLED")
        page.wait_for_selector("#timeline li.ev-cancel", timeout=WAIT_MS)
        page.wait_for_selector("#timeline li.ev-end", timeout=WAIT_MS)
        assert page.inner_text("#cancel-result") == "cancel requested"
        assert worker.wait(timeout=30) != 0  # JobCancelled out of the worker's heartbeat
        client = redis.Redis.from_url(redis_url)
        assert client.hget(KeySchema(ns).state("enc-1"), "status") == b"CANCELLED"
        client.close()
    finally:
        page.close()
        stop(worker)
        stop(doomed)
    assert errors == []


def test_no_cancel_button_when_authorize_refuses(browser: object, redis_url: str, ns: str) -> None:
    def authorize(request: Request, job_id: str) -> bool:
        return request.method != "POST"  # read-only operators

    worker = spawn_ready("tests.integration.worker_proc", redis_url, ns, "ro-1", "1.0", "etl")
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        with ServerThread(redis_url, ns, keepalive=1.0, authorize=authorize) as srv:
            page.goto(srv.base_url + "/?refresh=0.5")
            state_is(page, "ro-1", "RUNNING")
            with page.expect_response(lambda r: "dry_run=1" in r.url) as answer:
                page.click(f"{row('ro-1')} td.job")
            assert answer.value.status == 403
            page.wait_for_selector('#detail[data-job="ro-1"]', state="visible", timeout=WAIT_MS)
            assert page.locator("#cancel").is_hidden()
    finally:
        page.close()
        stop(worker)
        _clean(redis_url, ns)
