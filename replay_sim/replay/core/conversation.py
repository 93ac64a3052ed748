"""Re-enacting what a server sent while a recorded call ran: notifications and questions to the client.

A recording keeps, in order, the messages the real server sent during the call: progress and log
notifications, and server→client requests (sampling, elicitation, roots) with the client's answer.
Replaying the call sends them again on the request's stream. A recorded answer holds only if the
client answers each question as it did when recorded — the real server's result depended on it —
so the first different answer ends the re-enactment and says how it differed.

A server asks a client only what the client declared it can answer, so one call may have been
recorded both with a question (for a client that could be asked) and without (for one that could
not); :func:`suited` picks the recording made for a client like the one replaying.

A 2026-07-28 ("modern") request has no stream to ask on: each question goes out in an
``input_required`` result, and the client's retry of the call brings its answer (:class:`Rounds`).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

import mcp_types as types
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from replay_sim.asking import ask_client
from replay_sim.canonical import answer_text
from replay_sim.protocol import INPUT_KEY, error_json, is_client_request
from replay_sim.store import Recording

__all__ = ["Rounds", "bound_to", "questions", "reenact", "suited"]

_CAPABILITY = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}

_SHOWN_CHARS = 160
_STATE = re.compile(r"(0|[1-9][0-9]{0,8})\.[0-9a-f]{24}")  # ASCII only: int() reads "٣" too


def asked(recording: Recording) -> frozenset[str]:
    """The client capabilities the server's recorded questions during the call needed."""
    return frozenset(
        _CAPABILITY.get(str(m.get("method")), str(m.get("method")))
        for m in recording.notifications
        if is_client_request(m)
    )


def suited(recordings: Sequence[Recording], client: Collection[str]) -> Recording | None:
    """The first of a call's recordings (from one state) made for a client declaring ``client``.

    A recording that asked for a capability was made for a client that declared it; and where
    some recording of the call asked for it, the server asks every client that declares it, so
    one that did not ask was made for a client that did not. None when no recording fits.
    """
    ever = frozenset().union(*(asked(r) for r in recordings))
    wanted = ever & frozenset(client)
    return next((r for r in recordings if asked(r) == wanted), None)


def questions(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server→client requests among a recorded call's messages, in order."""
    return [m for m in messages if is_client_request(m)]


class Rounds:
    """A 2026-era client's rounds through a recorded call's questions, one question per round.

    Such a client cannot be asked mid-call: it gets each question in an ``input_required``
    result, as the real server asked it, and retries the call with its answer. The replay keeps no
    state between the rounds: ``requestState`` says how many questions were answered as recorded,
    signed with a key of this process over the recording, the count and what the state is bound
    to — the episode (or connection) and the call — so a client cannot skip a question by forging
    a state, nor by bringing one from another episode or another call. A state that is not exactly
    ``<ASCII digits>.<24 hex digits>`` of ours counts as none: the rounds start from the first question.
    """

    def __init__(self) -> None:
        self._key = secrets.token_bytes(16)

    def _state(self, recording: Recording, answered: int, bound: str) -> str:
        message = f"{recording.id}:{answered}:{bound}".encode("utf-8", "surrogatepass")
        return f"{answered}.{hmac.new(self._key, message, 'sha256').hexdigest()[:24]}"

    def answered(self, recording: Recording, state: Any, bound: str) -> int:
        """How many of the recording's questions a ``requestState`` says were answered as recorded.

        Args:
            recording: The recording whose questions are asked.
            state: The ``requestState`` the client sent (anything).
            bound: What the state must have been given for: the episode or connection, and the call.
        """
        parsed = _STATE.fullmatch(state) if isinstance(state, str) else None
        if parsed is None:
            return 0  # none, or not of our making
        answered = int(parsed.group(1))
        if not hmac.compare_digest(state, self._state(recording, answered, bound)):
            return 0  # not ours (another process, episode or call; a forgery): start from the first question
        return answered

    def next(
        self, recording: Recording, params: Mapping[str, Any], bound: str
    ) -> dict[str, Any] | str | None:
        """The round a 2026-era request of ``recording``'s call is in.

        Args:
            recording: The recording served.
            params: The request's params (``requestState``, ``inputResponses``).
            bound: The episode or connection and the call the rounds belong to (see :func:`bound_to`).

        Returns:
            The ``input_required`` result asking the next question; or why the client's answer is
            not the recorded one; or None when every question was answered as recorded.
        """
        asked = questions(recording.notifications)
        answered = self.answered(recording, params.get("requestState"), bound)
        responses = params.get("inputResponses")
        if isinstance(responses, dict) and answered < len(asked):
            answer = responses.get(INPUT_KEY)
            now = answer_text(answer, None) if isinstance(answer, dict) else "no answer"
            if (otherwise := _otherwise(asked[answered], now)) is not None:
                return otherwise
            answered += 1
        if answered == len(asked):
            return None
        question = asked[answered]
        request = {
            "method": question["method"],
            **({"params": question["params"]} if question.get("params") else {}),
        }
        return {
            "resultType": "input_required",
            "inputRequests": {INPUT_KEY: request},
            "requestState": self._state(recording, answered, bound),
        }


def bound_to(scope: Hashable | None, call: str) -> str:
    """What a ``requestState`` is bound to: whose history the request extends, and the call's key.

    Args:
        scope: The episode id, a connection's history key, or None (no history).
        call: The call's exact key (:func:`~replay_sim.canonical.call_key`).
    """
    if scope is None or isinstance(scope, str):
        return f"{'' if scope is None else 'episode ' + scope}\0{call}"
    return f"connection {id(scope)}\0{call}"


def _otherwise(question: dict[str, Any], now: str) -> str | None:
    """Why the client's answer ``now`` (canonical) is not the recorded one, or None when it is."""
    recorded = answer_text(question.get("result"), question.get("error"))
    if now == recorded:
        return None
    return (
        f"the client answered {question.get('method')} otherwise than when the call was recorded "
        f"(recorded {recorded[:_SHOWN_CHARS]}, now {now[:_SHOWN_CHARS]})"
    )


async def reenact(
    ctx: ServerRequestContext[Any, Any], messages: list[dict[str, Any]], *, ask: bool = True
) -> str | None:
    """Send a recorded call's messages on this request's stream, in order.

    Args:
        ctx: The client's request.
        messages: The recorded messages.
        ask: Ask the recorded questions (False when a 2026-era retry's ``inputResponses`` answered
            them already).

    Returns:
        None when the client answered every recorded question as recorded; else why not.
    """
    raw_meta = (ctx.params or {}).get("_meta")
    levels = allowed_log_levels(ctx.protocol_version, raw_meta if isinstance(raw_meta, dict) else None)
    for message in messages:
        method, params = str(message.get("method")), message.get("params") or {}
        if is_client_request(message):
            if not ask:
                continue
            try:
                now = answer_text(await ask_client(ctx, method, params), None)
            except MCPError as exc:
                now = answer_text(None, error_json(exc))
            if (otherwise := _otherwise(message, now)) is not None:
                return otherwise
        elif method == "notifications/progress":
            # report_progress addresses the current request's progress token (a no-op without one).
            await ctx.session.report_progress(
                params.get("progress", 0), params.get("total"), params.get("message")
            )
        elif method == "notifications/message" and params.get("level") in levels:
            notification = types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams.model_validate(params)
            )
            await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
    return None
