"""``python -m tests.nemesis [--seconds S] [--seed N ...] [--topology T] [--cover] [--keep DIR]``
or ``python -m tests.nemesis --minutes M [--seed N]`` (a soak).

A run with ``--seconds``: one run per seed (a random seed when none is given: it is printed, and
``--seed`` replays its schedule) on the seed's topology (``single``, ``sentinel``, ``cluster``:
seed % 3, or ``--topology``); prints what was checked and every violation with its seed, fault
schedule and history slice. A soak with ``--minutes M``: ``M`` minutes cut into segments of about
5 minutes (a multiple of 3), segment ``i`` on seed ``N + i`` (``N``: ``--seed`` or a random one),
so the segments rotate through the three topologies; each segment's schedule first injects every
fault kind of its topology once (``--cover``), and each prints its seed and replay command; then
the totals. Exits 1 when any rule was broken.
"""

from __future__ import annotations

import argparse
import random
import sys

from .run import run
from .topology import ORDER

SEGMENT = 300.0  # a soak's segment length, about


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    p.add_argument("--seconds", type=float, default=120.0, help="length of each run (120)")
    p.add_argument("--minutes", type=float, help="a soak of this many minutes (segments)")
    p.add_argument("--seed", type=int, action="append", help="a seed (repeat for several runs)")
    p.add_argument("--random", action="store_true", help="also run one random seed")
    p.add_argument("--topology", choices=ORDER, help="the servers (default: the seed's)")
    p.add_argument("--cover", action="store_true", help="every fault kind once first")
    p.add_argument("--keep", help="write the history here (default: a new temporary directory)")
    args = p.parse_args(argv)
    seeds = list(args.seed or [])
    if args.random or not seeds:
        seeds.append(random.SystemRandom().randrange(1, 2**31))
    runs: list[tuple[int, float, bool]] = []  # seed, seconds, cover
    if args.minutes:
        total = args.minutes * 60
        n = len(ORDER) * max(1, round(total / (SEGMENT * len(ORDER))))
        runs = [(seeds[0] + i, total / n, True) for i in range(n)]
        print(f"== nemesis soak: {args.minutes:g} min in {n} segments of {total / n:.0f} s, "
              f"seeds {seeds[0]} .. {seeds[0] + n - 1} (replay all: --minutes {args.minutes:g} "
              f"--seed {seeds[0]})", flush=True)  # fmt: skip
    else:
        runs = [(seed, args.seconds, args.cover) for seed in seeds]
    failed = False
    operations, violations = 0, 0
    faults: dict[str, int] = {}
    for seed, seconds, cover in runs:
        topology = None if args.minutes else args.topology
        print(f"== nemesis seed {seed} ({seconds:.0f} s)", flush=True)
        keep = args.keep if len(runs) == 1 else None
        result = run(seed, seconds, keep, topology=topology, cover=cover)
        print(result.summary, flush=True)
        failed = failed or bool(result.violations)
        operations += result.operations
        violations += len(result.violations)
        for kind, count in result.faults.items():
            faults[kind] = faults.get(kind, 0) + count
    if len(runs) > 1:
        by_kind = ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
        print(f"== totals over {len(runs)} runs: operations checked {operations}; faults "
              f"injected {sum(faults.values())} ({by_kind}); violations {violations}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
