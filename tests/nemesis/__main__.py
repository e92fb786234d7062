"""``python -m tests.nemesis [--seconds S | --minutes M] [--seed N ...] [--keep DIR]``.

Runs one nemesis run per seed (a random seed when none is given: it is printed, and
``--seed`` replays its schedule), prints what was checked and every violation with its seed,
fault schedule and history slice; exits 1 when any rule was broken.
"""

from __future__ import annotations

import argparse
import random
import sys

from .run import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    p.add_argument("--seconds", type=float, default=120.0, help="length of each run (120)")
    p.add_argument("--minutes", type=float, help="length of each run in minutes (a soak)")
    p.add_argument("--seed", type=int, action="append", help="a seed (repeat for several runs)")
    p.add_argument("--random", action="store_true", help="also run one random seed")
    p.add_argument("--keep", help="write the history here (default: a new temporary directory)")
    args = p.parse_args(argv)
    seconds = args.minutes * 60 if args.minutes else args.seconds
    seeds = list(args.seed or [])
    if args.random or not seeds:
        seeds.append(random.SystemRandom().randrange(1, 2**31))
    failed = False
    for seed in seeds:
        print(f"== nemesis seed {seed} ({seconds:.0f} s)", flush=True)
        violations, summary = run(seed, seconds, args.keep if len(seeds) == 1 else None)
        print(summary, flush=True)
        failed = failed or bool(violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
