"""The public surface is exactly what ``jobpulse.__all__`` names (anyio's test_all_attributes)."""

from __future__ import annotations

import jobpulse


def test_all_names_exist_and_nothing_public_is_unlisted() -> None:
    exported = set(jobpulse.__all__)
    assert all(hasattr(jobpulse, name) for name in exported)
    modules = ("errors", "http", "cli", "metrics", "integrations")
    public = {n for n in vars(jobpulse) if not n.startswith("_") and n not in modules}
    assert public == exported


def test_contract_names_are_exported() -> None:
    contract = {
        "heartbeat", "JobHeartbeat", "ProgressCell", "request_cancel",
        "JobpulseError", "LeaseLost", "JobBusy", "JobCancelled", "InvalidJobId",
    }  # fmt: skip
    assert contract <= set(jobpulse.__all__)


def test_every_exception_derives_from_jobpulse_error() -> None:
    for name in jobpulse.__all__:
        obj = getattr(jobpulse, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, jobpulse.JobpulseError), name
    assert issubclass(jobpulse.InvalidJobId, ValueError)


def test_sync_has_the_blocking_twin_of_every_operator_call() -> None:
    import inspect

    import jobpulse.sync

    assert "request_cancel" in jobpulse.sync.__all__
    asynchronous = inspect.signature(jobpulse.request_cancel)
    blocking = inspect.signature(jobpulse.sync.request_cancel)
    # the same parameters, defaults and answer; only the client differs (asyncio / blocking)
    first, *rest = asynchronous.parameters.values()
    blocking_first, *blocking_rest = blocking.parameters.values()
    assert first.name == blocking_first.name == "redis"
    assert rest == blocking_rest
    assert asynchronous.return_annotation == blocking.return_annotation
