"""The nemesis run (issue 26): real worker, sweeper and reader processes against private servers
(one Redis behind a fault proxy, Sentinel, or Cluster: :mod:`tests.nemesis.topology`) while a
seeded schedule injects faults; every operation and fault goes into a history that a pure
checker (:mod:`tests.nemesis.checker`) holds against the promises of docs/reliability.md.

It lives in ``tests/`` (not ``benchmarks/``) because it is a correctness check with one right
outcome (zero violations), reuses the fault proxy and process helpers of the test suite, and its
checker is unit-tested by pytest beside it; nothing in it measures speed.

Run it: ``python -m tests.nemesis --seconds 120 --seed 1`` (see ``--help``).
"""
