"""Every jobpulse exception pickles to an equal one: the sidecar helper sends them between
processes (a ``JobBusy`` came back as ``job "job '…' is held by another live worker" is held by
another live worker``)."""

from __future__ import annotations

import pickle

import pytest

from jobpulse import errors
from jobpulse.http.poll import PollError

SAMPLES: dict[type[errors.JobpulseError], errors.JobpulseError] = {
    errors.JobpulseError: errors.JobpulseError("plain"),
    errors.InvalidJobId: errors.InvalidJobId("job id 'a b' breaks the grammar"),
    errors.JobBusy: errors.JobBusy("report-7"),
    errors.LeaseLost: errors.LeaseLost("report-7", errors.LeaseLostCause.FENCED_OUT),
    errors.JobCancelled: errors.JobCancelled("job 'report-7' was cancelled on request"),
    errors.ProtocolError: errors.ProtocolError("snapshot field 'fence' is not an integer"),
    errors.StateNotWritten: errors.StateNotWritten("final state of 'report-7' not written"),
    PollError: PollError("no such job", url="http://127.0.0.1/jobs/x", status_code=404),
}


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _subclasses(sub)
    return found


def test_every_jobpulse_error_has_a_sample() -> None:
    # a new exception class must be added above (and pickle whole)
    assert _subclasses(errors.JobpulseError) == set(SAMPLES)


@pytest.mark.parametrize("error", SAMPLES.values(), ids=lambda e: type(e).__name__)
def test_an_error_pickles_to_the_same_type_message_and_attributes(
    error: errors.JobpulseError,
) -> None:
    error.add_note("a note added on the way")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)  # job_id, cause, url, status_code, the notes


def test_job_busy_keeps_its_message_through_pickle() -> None:
    copy = pickle.loads(pickle.dumps(errors.JobBusy("report-7")))
    assert str(copy) == "job 'report-7' is held by another live worker"
    assert copy.job_id == "report-7"
