"""When each call an episode's sandbox instance is asked happens, on its pinned clock.

An instance of a server on a pinned clock (``clock = "recorded"``) reads, for the whole of a call,
the time this module gives it when the call is sent (:meth:`SandboxInstance.call`'s ``at``):

- a **re-played** call is sent at the time its recording was sent (:func:`began`: the recording's
  ``recorded_at``, stamped when its answer came, less its latency), so a server that stamps time
  (a git commit's hash) answers as it did then;
- a **new** call is sent at :func:`following` the episode's previous call: the whole second after
  that call's recorded end. It is a function of what is recorded only (never of this run's
  latencies), so the same episode played twice sends it at the same time and gets the same answer
  — and a server stamping time stamps the same, however long the call takes;
- what the instance answers is recorded with ``recorded_at`` on its clock (:func:`stamp`: the time
  it was sent plus its latency), so re-playing that recording later sends it at the same time again.

An answer a sandbox made re-plays to the microsecond. A real server's recorded stamp re-plays when
the server read its clock within the time its clock showed when the call was sent, to the unit it
stamps: a whole-second stamp (git, file times) in the same second; a sub-second stamp
(``created_at`` with microseconds) is not guaranteed, since the real server read its clock a little
after the call was sent.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from replay_sim.store import Recording

__all__ = ["began", "ended", "following", "stamp"]


def _utc(text: str) -> datetime:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def ended(recording: Recording) -> datetime:
    """When a recorded call's answer came (its ``recorded_at``)."""
    return _utc(recording.recorded_at)


def began(recording: Recording) -> datetime:
    """When a recorded call was sent: its ``recorded_at`` less its latency (to the microsecond)."""
    return ended(recording) - timedelta(milliseconds=recording.latency_ms or 0.0)


def following(recording: Recording) -> datetime:
    """When a new call after ``recording`` is sent: the whole second after the recorded call ended."""
    return datetime.fromtimestamp(math.floor(ended(recording).timestamp()) + 1, UTC)


def stamp(answer: dict[str, Any]) -> str | None:
    """The ``recorded_at`` of an instance's answer: on its clock, when the answer came.

    Args:
        answer: :meth:`SandboxInstance.call`'s dict (``clock``: when it was sent on its clock).

    Returns:
        ISO 8601, or None for an instance on the host's clock (the store stamps it now).
    """
    sent = answer.get("clock")
    if not sent:
        return None
    return (_utc(sent) + timedelta(milliseconds=answer.get("latency_ms") or 0.0)).isoformat()
