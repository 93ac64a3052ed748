"""Asking a real server again, with no client: a fresh connection whose calls are recorded as a session.

``replay-sim explore`` (:mod:`replay_sim.record.revisit`) and ``replay-sim backfill``
(:mod:`replay_sim.record.backfill`) ask the real servers of a recorder config what a store's
recordings or a replay's misses call for. Each does it in a :class:`Rerun`: a new upstream
connection (a fresh server process for a command), optionally after the upstream's ``reset``
command (:func:`reset`), whose answers are redacted with the config's rules and recorded, in the
order asked, as one new store session — so the session prefix of each recording says which state
it was answered from, exactly as for a client's session.
"""

from __future__ import annotations

import subprocess
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import anyio.abc
import mcp_types as types
from mcp.shared.exceptions import MCPError

from replay_sim.canonical import answer_text
from replay_sim.errors import UpstreamError
from replay_sim.record.config import UpstreamSpec
from replay_sim.record.upstream import Upstream
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.store import Origin, Store

__all__ = ["RESET_TIMEOUT", "Answer", "Rerun", "recording_redactor", "reset"]

RESET_TIMEOUT = 300.0
"""Seconds a ``reset`` command may run."""
_KEPT_NOTIFICATIONS = ("notifications/progress", "notifications/message")
_TAIL = 500


@dataclass(frozen=True, slots=True)
class Answer:
    """What the real server answered one call (redacted), and how long it took."""

    result: dict[str, Any] | None
    error: dict[str, Any] | None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    latency_ms: float = 0.0

    @property
    def text(self) -> str:
        """The answer, canonical (:func:`~replay_sim.canonical.answer_text`)."""
        return answer_text(self.result, self.error)

    @property
    def failed(self) -> bool:
        """An error, or an ``isError`` result."""
        return self.error is not None or bool((self.result or {}).get("isError"))


def recording_redactor(store: Store, redactor: Redactor) -> Redactor:
    """``redactor`` merged with the rules ``store`` was recorded with, which the store then keeps.

    As the recorder does: what is added to a store is redacted the way its recordings were, and a
    replay redacts incoming calls with the rules the store keeps.
    """
    previous = store.meta(RULES_META_KEY)
    merged = redactor if previous is None else redactor.merged(Redactor.from_rules(previous))
    store.set_meta(RULES_META_KEY, merged.rules())
    return merged


async def reset(name: str, spec: UpstreamSpec, timeout: float = RESET_TIMEOUT) -> None:
    """Run upstream ``name``'s ``reset`` command (a shell command) and wait for it.

    Raises:
        UpstreamError: It has none, or it failed (names the server, the command, its exit status
            and the end of its output) or ran longer than ``timeout``.
    """
    if spec.reset is None:
        raise UpstreamError(f"upstream {name!r} has no reset command in the recorder config")
    try:
        with anyio.fail_after(timeout):
            done = await anyio.run_process(
                spec.reset, check=False, cwd=spec.cwd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
    except TimeoutError:
        raise UpstreamError(
            f"reset command of upstream {name!r} ({spec.reset}) ran longer than {timeout:g}s"
        ) from None
    except OSError as exc:
        raise UpstreamError(
            f"reset command of upstream {name!r} ({spec.reset}) cannot run: {exc.strerror or exc}"
        ) from exc
    if done.returncode != 0:
        tail = " | ".join(done.stdout.decode(errors="replace").strip()[-_TAIL:].splitlines())
        raise UpstreamError(
            f"reset command of upstream {name!r} ({spec.reset}) failed with exit status "
            f"{done.returncode}{f': {tail}' if tail else ''}"
        )


class Rerun:
    """One fresh connection to a real server, its answers recorded as one new store session.

    Use as an async context manager: entering starts the server (raising :class:`UpstreamError`
    when it does not start). :meth:`ask` sends one call and returns the answer; :meth:`keep`
    records it. Calls are sent one at a time, so the notifications that arrive while one is in
    flight belong to it.

    Args:
        name: The recorded server name.
        spec: How to reach it.
        store: Where its answers are recorded.
        redactor: Applied to everything recorded (the spec's env and header values are added).
    """

    def __init__(self, name: str, spec: UpstreamSpec, store: Store, redactor: Redactor) -> None:
        self.name = name
        self.spec = spec
        self.store = store
        self.redactor = redactor.with_secrets(spec.secrets())
        self.session: str | None = None
        """The store session recorded into (opened by the first :meth:`keep`)."""
        self.calls = 0
        """Calls sent to the real server."""
        self._notes: list[dict[str, Any]] = []
        self._upstream: Upstream | None = None
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Self:
        tg: anyio.abc.TaskGroup = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(tg.cancel_scope.cancel)
        upstream = Upstream(self.spec, on_notification=self._collect)
        self._stack.push_async_callback(upstream.close)
        try:
            await tg.start(upstream.run)
        except BaseException:
            await self._stack.aclose()
            raise
        self._upstream = upstream
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _collect(self, method: str, params: dict[str, Any]) -> None:
        if method in _KEPT_NOTIFICATIONS:
            self._notes.append(
                {"method": method, "params": {k: v for k, v in params.items() if k != "progressToken"}}
            )

    async def ask(self, method: str, params: dict[str, Any]) -> Answer:
        """Send one call and return its answer, redacted (not recorded: see :meth:`keep`).

        Raises:
            UpstreamError: The server timed out, or the connection broke (names the server).
        """
        upstream = self._upstream
        if upstream is None:
            raise RuntimeError("enter the Rerun (async with) before asking")
        self._notes = []
        request_id = upstream.next_request_id()
        self.calls += 1
        try:
            answer = await upstream.exchange(
                method, {**params, "_meta": {"progressToken": request_id}}, request_id=request_id
            )
        except MCPError as exc:  # timed out
            raise UpstreamError(f"{self.name}: {exc.error.message}") from exc
        if answer.error is not None and answer.error["code"] == types.CONNECTION_CLOSED:
            raise UpstreamError(f"{self.name}: {answer.error['message']}")
        redact = self.redactor.redact
        return Answer(
            redact(answer.result),
            redact(answer.error),
            redact(list(self._notes)),
            round(answer.latency_ms, 3),
        )

    def keep(self, method: str, params: dict[str, Any], answer: Answer, origin: Origin) -> int:
        """Record an answered call as the next call of this rerun's store session; returns its id."""
        if self.session is None:
            self.session = self.store.start_session(self.name)
        return self.store.record_call(
            self.name,
            method,
            self.redactor.redact(params),
            result=answer.result,
            error=answer.error,
            session=self.session,
            latency_ms=answer.latency_ms,
            origin=origin,
            notifications=answer.notifications or None,
        )
