"""The background warm-up is never silently gone: a failure is said, kept and tried again (issue 20)."""

from __future__ import annotations

import logging
import threading

import pytest

from replay_sim.resolve.warmup import Warmup


def _failing_first(times: int) -> tuple[Warmup, threading.Event, list[int]]:
    failed = threading.Event()
    calls: list[int] = []

    def work() -> None:
        calls.append(len(calls) + 1)
        if len(calls) <= times:
            failed.set()
            raise OSError(24, "Too many open files")

    return Warmup(work), failed, calls


def test_a_failed_warm_up_says_so_and_succeeds_on_its_retry(caplog: pytest.LogCaptureFixture) -> None:
    warmup, failed, calls = _failing_first(1)
    done: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="replay_sim"):
        warmup.start(then=lambda: done.append(True))
        assert failed.wait(30)
        assert warmup.wait(30)  # tried again after its back-off, and loaded
    assert calls == [1, 2] and warmup.attempts == 2 and warmup.failure is None
    assert done == [True] and warmup.problem() is None
    assert "failed (attempt 1): OSError: [Errno 24] Too many open files; trying again in 1 s" in caplog.text


def test_a_warm_up_stopped_after_a_failure_starts_again_on_the_next_start() -> None:
    warmup, failed, calls = _failing_first(1)
    warmup.start()
    assert failed.wait(30)
    warmup.stop()  # the server stops during the back-off
    thread = warmup._thread
    assert thread is not None
    thread.join(30)  # stopped: no retry
    assert not warmup.done and calls == [1]
    assert "failed 1 time(s), last with OSError" in (warmup.problem() or "")
    warmup.start()  # served again: the warm-up runs again
    assert warmup.wait(30) and calls == [1, 2]
