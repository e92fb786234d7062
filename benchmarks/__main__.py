"""``python -m benchmarks [--quick] [--soak] [--only NAME ...]``: run the suite, write JSON to
``benchmarks/results/`` and regenerate ``docs/benchmarks.md`` (see :mod:`benchmarks.report`).

No threshold is asserted anywhere: goals are reported as met / not met, never failed on.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import report
from .common import machine_info, private_redis

# name -> (module, kind). "own": run(quick=..., soak=...) -> result in report's shape.
# "external": a self-contained script with run(redis_url) -> dict, given a private server.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "goals19": ("benchmarks.bench_goals", "own"),
    "progress": ("benchmarks.bench_progress", "own"),
    "beat": ("benchmarks.bench_beat", "own"),
    "throughput": ("benchmarks.bench_throughput", "own"),
    "read": ("benchmarks.bench_read", "own"),
    "wire": ("benchmarks.bench_wire", "own"),
    "wake": ("benchmarks.bench_wake", "own"),
    # HOOK: scripts written by other helpers (run(redis_url) -> dict); run when present,
    # reported as "not in the tree yet" otherwise.
    "sweep": ("benchmarks.bench_sweep", "external"),
    "reader": ("benchmarks.bench_reader", "external"),
    "http": ("benchmarks.bench_http", "external"),
    "cluster": ("benchmarks.bench_cluster", "own"),
    "stale": ("benchmarks.bench_stale", "own"),
    "false_stale": ("benchmarks.bench_false_stale", "own"),
    "gateway": ("benchmarks.bench_gateway", "own"),
    "metrics": ("benchmarks.bench_metrics", "external"),
    "sidecar": ("benchmarks.bench_sidecar", "own"),
}


# --only GROUP runs these together: "goals" is one run holding every row of issue 28's table and
# the sidecar's rows (benchmarks/goals28.py builds the table from them).
GROUPS: dict[str, tuple[str, ...]] = {
    "goals": ("goals19", "progress", "read", "wire", "wake", "sidecar"),
}


def _redis_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "unknown"


def _call(fn: Callable[..., Any], **options: Any) -> Any:
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in options.items() if k in accepted})


def run_one(name: str, quick: bool, soak: bool) -> dict[str, Any]:
    module_name, kind = BENCHMARKS[name]
    if importlib.util.find_spec(module_name) is None:
        return {
            "name": name,
            "title": name,
            "method": "",
            "tables": [],
            "skipped": f"`{module_name}` is not in the tree yet (hook in benchmarks/__main__.py)",
        }
    module = importlib.import_module(module_name)
    if kind == "own":
        result: dict[str, Any] = _call(module.run, quick=quick, soak=soak)
        return result
    with private_redis() as server:
        raw = _call(module.run, redis_url=server.url, quick=quick)
    result = report.normalise(raw, name, module.__doc__ or "")
    result.setdefault("title", getattr(module, "TITLE", name))
    result.setdefault("issue", 9)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke run: short windows (< 2 min)")
    parser.add_argument("--soak", action="store_true", help="false-STALE soak for 10 minutes")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only these (repeatable): {', '.join(BENCHMARKS)}; "
                             f"groups: {', '.join(GROUPS)}")  # fmt: skip
    parser.add_argument("--no-docs", action="store_true", help="write JSON only")
    args = parser.parse_args(argv)
    asked = [n for part in args.only for n in part.split(",") if n] or list(BENCHMARKS)
    names = list(dict.fromkeys(m for n in asked for m in GROUPS.get(n, (n,))))
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    machine = machine_info(_redis_version())
    print(f"# machine: {machine['cpu_model']}, {machine['cores']} cores, Python "
          f"{machine['python']}, Redis {machine['redis_version']}", flush=True)  # fmt: skip
    failed = []
    t_all = time.monotonic()
    for name in names:
        t0 = time.monotonic()
        print(f"# {name} ...", flush=True)
        try:
            result = run_one(name, args.quick, args.soak)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        result["seconds"] = round(time.monotonic() - t0, 1)
        path = report.write_result(result, machine, args.quick)
        print(f"#   {name}: {result['seconds']} s -> {path.relative_to(report.ROOT)}", flush=True)
        for goal, ok in (result.get("goals") or {}).items():
            print(f"#     {goal}: {'n/a' if ok is None else 'met' if ok else 'NOT met'}")
    if not args.no_docs:
        out = report.render(quick=args.quick)
        print(f"# wrote {out.relative_to(report.ROOT)}")
    print(f"# total {time.monotonic() - t_all:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
