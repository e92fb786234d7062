"""Developer sessions: ``nox -s tests lint typecheck docs bench``."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "docs"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite against a real Redis (REDIS_URL, a container, or a private redis-server)."""
    session.install("-e", ".[dev]")
    session.run("pytest", *(session.posargs or ["-n", "2", "--dist", "loadgroup"]))  # as CI


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")  # the version pinned in the dev extra
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict", "src")
    session.run("mypy", "--strict", "tests/typing")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("mkdocs", "build", "--strict")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The benchmark suite (``nox -s bench -- --quick`` for the 2-minute smoke run)."""
    session.install("-e", ".[dev,bench]")
    session.run("python", "-m", "benchmarks", *session.posargs)
