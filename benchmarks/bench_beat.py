"""What one beat (or one progress update) costs Redis (issue 2 benchmark 2, issue 9 item 2).

jobpulse and the seed pattern run N live jobs under their real heartbeats for a window; the
peers (SAQ, RQ, Celery, see :mod:`benchmarks.peers`) run the same number of progress updates
through their public calls. Between ``CONFIG RESETSTAT`` and ``INFO`` the harness records the
server's commandstats and net bytes; the client side counts writes (round trips) and top-level
commands by wrapping redis-py's ``send_packed_command``, so calls a Lua script makes inside
Redis (which commandstats also counts) never pass for top-level commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aioredis

from jobpulse import heartbeat

from . import bullmq, peers
from .common import Probe, UpdateCost, advancer, median, private_redis, ratio
from .seed import SeedJob

NAME = "beat"
TITLE = "Cost of one beat / progress update"
NS = "bench"
GOALS = {"commands": 1.0, "server_us": 25.0, "bytes": 400.0}


async def jobpulse_window(url: str, probe: Probe, n: int, interval: float, seconds: float):
    client = aioredis.Redis.from_url(url)
    async with contextlib.AsyncExitStack() as stack:
        hbs = []
        for i in range(n):
            hb = await stack.enter_async_context(
                heartbeat(
                    client,
                    f"job-{i:06d}",
                    namespace=NS,
                    interval=interval,
                    ttl=max(6.0, 4 * interval),
                    total=1_000_000,
                )
            )
            hbs.append(hb)
        stop = asyncio.Event()
        adv = asyncio.create_task(advancer([h.progress for h in hbs], interval / 3, stop))
        await asyncio.sleep(interval * 12)  # every job past its first index refresh
        b0 = sum(h.statistics().beats_sent for h in hbs)
        with UpdateCost(probe) as cost:
            await asyncio.sleep(seconds)
        b1 = sum(h.statistics().beats_sent for h in hbs)
        stop.set()
        await adv
    await client.aclose()
    out = cost.per(b1 - b0)
    out["evalsha_per_beat_server"] = ratio(out["server_cmds"].get("evalsha", 0), b1 - b0)
    out["zadd_per_beat"] = out["command_mix"].get("zadd", 0.0)
    out["evalsha_us"] = out["usec_per_call"].get("evalsha", float("nan"))
    return out


async def seed_window(url: str, probe: Probe, n: int, interval: float, seconds: float):
    client = aioredis.Redis.from_url(url)
    async with contextlib.AsyncExitStack() as stack:
        jobs = [
            await stack.enter_async_context(SeedJob(client, f"job-{i:06d}", interval=interval))
            for i in range(n)
        ]

        class Cell:
            def __init__(self, job: SeedJob) -> None:
                self.job = job

            def advance(self) -> None:
                self.job.progress += 1

        stop = asyncio.Event()
        adv = asyncio.create_task(advancer([Cell(j) for j in jobs], interval / 3, stop))
        await asyncio.sleep(interval * 3)
        b0 = sum(j.beats for j in jobs)
        with UpdateCost(probe) as cost:
            await asyncio.sleep(seconds)
        b1 = sum(j.beats for j in jobs)
        stop.set()
        await adv
    await client.aclose()
    return cost.per(b1 - b0)


def back_to_back(url: str, probe: Probe, count: int) -> dict[str, float]:
    """Server µs per beat when beats come back to back from one client (caches warm): the
    scripts' intrinsic cost, without the idle gaps of a paced heartbeat."""
    import redis

    from jobpulse._protocol import calls
    from jobpulse._protocol.keys import KeySchema
    from jobpulse._protocol.scripts import SCRIPTS

    from .seed import RELEASE, RENEW

    client = redis.Redis.from_url(url)
    job = f"hot-{time.time_ns()}"
    keys = KeySchema(NS).job(job).all()
    beat_keys = KeySchema(NS).job(job).beat()
    reply = client.eval(
        SCRIPTS.acquire.text, len(keys), *keys, "tok", 6000, 1000, "w", "", "", "", ""
    )
    fence, seq = int(reply[1]), int(reply[3])
    client.script_load(SCRIPTS.beat.text)
    renew = client.register_script(RENEW)
    client.register_script(RELEASE)
    client.set(f"lock:job:{job}", "tok", px=6000)
    out: dict[str, float] = {}
    for name in ("jobpulse", "seed"):
        with UpdateCost(probe) as cost:
            for i in range(count):
                if name == "jobpulse":
                    seq += 1
                    # what moves between two beats (an entry also carries total and stage)
                    fields: dict[str, Any] = {"done": i, "rate": "12.5", "eta_s": "80.0"}
                    fields.update(cpu_s="0.34", loop_lag_ms="0.8")
                    event: tuple[str, str, int] | None = None
                    if i % 10 == 0:
                        fields.update(total=1000000, stage="s")
                        event = ("beat", "", 1000)
                    segment = calls.beat_segment(
                        token="tok", fence=fence, ttl_ms=6000, seq=seq, fields=fields, event=event,
                        every_key=False,
                    )  # fmt: skip
                    sent = calls.beat_keys(beat_keys, segment)  # as the worker: state, alive
                    client.execute_command(*calls.beat_command([(sent, segment)]))
                else:
                    renew(keys=[f"lock:job:{job}"], args=["tok", 6000])
                    pipe = client.pipeline(transaction=False)
                    pipe.hset(f"job:telemetry:{job}", mapping={"progress": i, "stage": "s",
                              "alloc_mb": 58, "last_heartbeat": int(time.time()),
                              "status": "RUNNING"})  # fmt: skip
                    pipe.expire(f"job:telemetry:{job}", 3600)
                    pipe.execute()
        out[name] = cost.per(count)["server_us"]
    client.close()
    return out


def _fmt(v: float, digits: int = 1) -> str:
    return f"{v:,.{digits}f}"


def run(quick: bool = False) -> dict[str, Any]:
    n, interval = (50, 0.1) if quick else (100, 0.1)
    seconds = 1.5 if quick else 5.0
    rounds = 1 if quick else 3
    results: dict[str, list[dict[str, Any]]] = {"jobpulse": [], "seed": []}
    peer_results: dict[str, dict[str, Any]] = {}
    with private_redis() as server:
        probe = Probe(server.port)
        probe.calibrate()
        version = probe.redis_version()
        for r in range(rounds):
            order = ["jobpulse", "seed"] if r % 2 == 0 else ["seed", "jobpulse"]
            for impl in order:
                fn = jobpulse_window if impl == "jobpulse" else seed_window
                results[impl].append(asyncio.run(fn(server.url, probe, n, interval, seconds)))
        hot = [back_to_back(server.url, probe, 500 if quick else 2000) for _ in range(rounds)]
        updates = 300 if quick else 2000
        for name, (fn, why) in peers.cost_functions(quick).items():
            if fn is None:
                peer_results[name] = {"skipped": why}
                continue
            try:
                peer_results[name] = fn(server.url, probe, n, updates)
            except bullmq.Unavailable as exc:
                peer_results[name] = {"skipped": str(exc)}
            except Exception as exc:  # a peer that cannot run here is reported, not fatal
                # (BullMQ without node/npm: "not measured (npm missing)")
                peer_results[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
        probe.close()

    keys = ["round_trips", "commands", "server_us", "bytes_in", "bytes_out", "inner_calls"]
    med = {
        impl: {k: median([x[k] for x in rs]) for k in [*keys, "updates"]}
        for impl, rs in results.items()
    }
    jp, sd = med["jobpulse"], med["seed"]
    jp_raw = results["jobpulse"]
    evalsha_us = median([x["evalsha_us"] for x in jp_raw])
    zadd = median([x["zadd_per_beat"] for x in jp_raw])
    evalsha_server = median([x["evalsha_per_beat_server"] for x in jp_raw])
    bytes_total = jp["bytes_in"] + jp["bytes_out"]

    def goal(ok: bool) -> str:
        return "yes" if ok else "no"

    rows = [
        ["round trips per beat", _fmt(jp["round_trips"], 3), _fmt(sd["round_trips"], 3),
         _fmt(ratio(jp["round_trips"], sd["round_trips"]), 2), "1", "(pipelined; see note)"],
        ["top-level commands per beat", _fmt(jp["commands"], 3), _fmt(sd["commands"], 3),
         _fmt(ratio(jp["commands"], sd["commands"]), 2), "1 (+ZADD every 10th)",
         goal(evalsha_server <= 1.01)],
        ["EVALSHA per beat (server count / beats sent; a call beats a batch)",
         _fmt(evalsha_server, 3), "1.000", "", "≤ 1", goal(evalsha_server <= 1.01)],
        ["ZADD per beat (index refresh, amortised)", _fmt(zadd, 3), "0", "", "0.1", ""],
        ["server µs per beat (all top-level commands)", _fmt(jp["server_us"]),
         _fmt(sd["server_us"]), _fmt(ratio(jp["server_us"], sd["server_us"]), 2), "≤ 25",
         goal(jp["server_us"] <= GOALS["server_us"])],
        ["server µs per EVALSHA (`cmdstat_evalsha` usec_per_call, a batch of beats)",
         _fmt(evalsha_us), "", "", "", ""],
        ["server µs per beat, beats back to back (warm caches)",
         _fmt(median([h["jobpulse"] for h in hot])), _fmt(median([h["seed"] for h in hot])),
         _fmt(ratio(median([h["jobpulse"] for h in hot]), median([h["seed"] for h in hot])), 2),
         "≤ 25", goal(median([h["jobpulse"] for h in hot]) <= GOALS["server_us"])],
        ["bytes in per beat", _fmt(jp["bytes_in"], 0), _fmt(sd["bytes_in"], 0),
         _fmt(ratio(jp["bytes_in"], sd["bytes_in"]), 2), "", ""],
        ["bytes out per beat", _fmt(jp["bytes_out"], 0), _fmt(sd["bytes_out"], 0),
         _fmt(ratio(jp["bytes_out"], sd["bytes_out"]), 2), "", ""],
        ["bytes in + out per beat", _fmt(bytes_total, 0),
         _fmt(sd["bytes_in"] + sd["bytes_out"], 0),
         _fmt(ratio(bytes_total, sd["bytes_in"] + sd["bytes_out"]), 2), "≤ 400",
         goal(bytes_total <= GOALS["bytes"])],
        ["calls made inside scripts per beat", _fmt(jp["inner_calls"], 2),
         _fmt(sd["inner_calls"], 2), "", "", ""],
    ]  # fmt: skip

    # Side by side with the peers (one update each).
    side = [("jobpulse", jp, "lease + fence + seq + snapshot + liveness (+ stream every 10th)"),
            ("seed pattern", sd, "lock renew + snapshot, no fence, no seq")]  # fmt: skip
    for name, res in peer_results.items():
        if "skipped" not in res:
            side.append((name, res, res.get("what", "")))
    peer_rows = []
    for name, res, what in side:
        peer_rows.append([
            name, _fmt(res["round_trips"], 2), _fmt(res["commands"], 2), _fmt(res["server_us"]),
            _fmt(res["bytes_in"], 0), _fmt(res["bytes_out"], 0),
            _fmt(ratio(res["bytes_in"] + res["bytes_out"], sd["bytes_in"] + sd["bytes_out"]), 2),
            _fmt(ratio(res["server_us"], sd["server_us"]), 2), what,
        ])  # fmt: skip
    skipped = {k: v["skipped"] for k, v in peer_results.items() if "skipped" in v}

    labels = [row[0] for row in peer_rows]
    findings = []
    if jp["server_us"] > sd["server_us"]:
        findings.append(
            f"Server time per beat: jobpulse {jp['server_us']:.1f} µs vs the seed's "
            f"{sd['server_us']:.1f} µs ({ratio(jp['server_us'], sd['server_us']):.1f}x) at a "
            f"paced load, {median([h['jobpulse'] for h in hot]):.1f} vs "
            f"{median([h['seed'] for h in hot]):.1f} µs back to back. Per job the script reads "
            "the alive key (owner, fence, seq and cancel: GETEX), writes the fields that changed "
            "(one HSET) and renews alive with the new seq (SET PX); TIME once per call: "
            f"{jp['inner_calls']:.1f} calls inside Redis per beat "
            f"against the seed's {sd['inner_calls']:.0f} plus its HSET and EXPIRE, and Lua "
            "call overhead on each. The seed buys its lower server time with a second round "
            "trip, no fence, no seq ordering and no liveness key. Server µs also depend on the "
            "load: idle gaps between calls (cold caches) cost several times more than "
            "back-to-back calls, for every design."
        )
    if bytes_total > GOALS["bytes"]:
        findings.append(
            f"Bytes per beat: {bytes_total:.0f} in + out (goal ≤ 400): each job's five keys "
            "repeat the namespace and the job id, and a lone job's call carries the 40-byte SHA; "
            "the values are only the fields that changed, and the reply one integer per job."
        )
    for name, res in peer_results.items():
        if "skipped" in res:
            continue
        if res["server_us"] < jp["server_us"]:
            findings.append(
                f"{name} spends less server time per update ({res['server_us']:.1f} µs vs "
                f"{jp['server_us']:.1f}) but needs {res['round_trips']:.0f} round trips and "
                f"{res['bytes_in'] + res['bytes_out']:,.0f} bytes, and records progress without "
                "a fenced lease (what it does: " + res.get("what", "") + ")."
            )

    return {
        "name": NAME,
        "title": TITLE,
        "issue": "2, 9",
        "method": (
            f"{n} jobs run under jobpulse's `heartbeat()` (interval {interval} s, progress moving "
            f"between beats) and, alternately, under the seed pattern ({rounds} interleaved "
            f"rounds of {seconds:.0f} s, medians), on a private redis-server; per beat we divide "
            "the server's commandstats usec and net bytes (after `CONFIG RESETSTAT`, harness "
            "bytes subtracted) and the client's counted writes and top-level commands by the "
            "beats sent. The peers do the same number of updates per job through their public "
            "calls; a 'round trip' is one write of redis-py's connection (a pipeline is one)."
        ),
        "tables": [
            {
                "title": "Per beat: jobpulse vs the seed pattern (baseline: the seed, same run)",
                "columns": ["figure", "jobpulse", "seed", "ratio", "goal", "met"],
                "rows": rows,
                "note": (
                    "jobpulse's ticker pipelines the beats of all due jobs and lets one EVALSHA "
                    "beat up to 64 of them, so round trips and EVALSHAs per beat fall below 1 "
                    "when many jobs share a tick; a lone job's beat is one EVALSHA, one round "
                    "trip. Server µs counts each top-level command once (a script's time "
                    "includes the calls it makes)."
                ),
            },
            {
                "title": "Per progress update, side by side (ratios: to the seed pattern)",
                "columns": [
                    "design",
                    "round trips",
                    "commands",
                    "server µs",
                    "bytes in",
                    "bytes out",
                    "bytes ratio",
                    "server µs ratio",
                    "what one update does",
                ],
                "rows": peer_rows,
                "note": "; ".join(f"{k}: not measured ({v})" for k, v in skipped.items()) or "",
            },
        ],
        "plots": [
            {
                "file": "beat_cost.png",
                "kind": "grouped",
                "title": "Per beat / update: server µs and bytes (in + out)",
                "labels": labels,
                "series": {
                    "server µs": [r[1]["server_us"] for r in side],
                    "bytes / 10": [(r[1]["bytes_in"] + r[1]["bytes_out"]) / 10 for r in side],
                    "top-level commands x 10": [r[1]["commands"] * 10 for r in side],
                },
                "ylabel": "per update",
            }
        ],
        "data": {
            "jobs": n,
            "interval": interval,
            "window_s": seconds,
            "rounds": rounds,
            "redis_version": version,
            "jobpulse": results["jobpulse"],
            "seed": results["seed"],
            "peers": peer_results,
            "back_to_back_us": hot,
        },
        "findings": findings,
        "goals": {
            "at most one EVALSHA per beat": evalsha_server <= 1.01,
            "server µs per beat ≤ 25": jp["server_us"] <= GOALS["server_us"],
            "bytes per beat ≤ 400": bytes_total <= GOALS["bytes"],
        },
    }


def main() -> None:
    import json

    print(json.dumps(run(quick=True)["tables"], indent=1))


if __name__ == "__main__":
    main()
