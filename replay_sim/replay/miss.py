"""Miss policies: what the replay server does when no recording answers a call with certainty.

A policy turns the resolver's miss into a :class:`~replay_sim.resolve.resolver.Resolution`: the miss itself
(``error``: the replay server answers with a diagnosable error), the nearest candidate
(``nearest``), or a new recording it stored first (``live`` forwards to the real server;
``synthesize`` asks an LLM). Policies are looked up by name in :data:`MISS_POLICIES`, a plain dict.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import anyio
import anyio.abc
import httpx2
import mcp_types as types

from replay_sim.errors import ConfigError, UpstreamError
from replay_sim.record.config import RecorderConfig
from replay_sim.record.upstream import Upstream
from replay_sim.resolve.resolver import Resolution, Tier
from replay_sim.store import Origin, Recording, Store

__all__ = [
    "MISS_POLICIES",
    "ErrorPolicy",
    "Forward",
    "LivePolicy",
    "Miss",
    "MissPolicy",
    "MissPolicyName",
    "MissSettings",
    "NearestPolicy",
    "SynthesizePolicy",
    "Upstreams",
    "make_policy",
]


class MissPolicyName(StrEnum):
    """The miss policies a replay server can run with."""

    ERROR = "error"
    """Answer with an error naming the nearest candidates and the fields that differ (default)."""
    NEAREST = "nearest"
    """Serve the closest candidate recording, marked ``nearest`` in the provenance."""
    LIVE = "live"
    """Forward the call to the real server from the recorder config, record the answer and serve it."""
    SYNTHESIZE = "synthesize"
    """Ask an LLM at an OpenAI-compatible URL for a plausible answer; stored with origin ``synthetic``."""


@dataclass(frozen=True, slots=True)
class Miss:
    """A call the resolver could not answer with certainty."""

    server: str
    method: str
    params: dict[str, Any]
    resolution: Resolution
    tool: dict[str, Any] | None = None
    """The tool's (or prompt's) entry from the recorded listing, when there is one."""


Forward = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""``forward(server, method, params)`` sends a call to the real server and returns
``{"result": ..., "error": ..., "notifications": [...], "latency_ms": ...}`` (wire JSON)."""


@dataclass(slots=True)
class MissSettings:
    """Everything the policies may need; each reads only its own part."""

    store: Store
    forward: Forward | None = None
    """How ``live`` reaches the real servers (built from the recorder config)."""
    llm_url: str | None = None
    """OpenAI-compatible base URL (``http://host/v1``) or full ``/chat/completions`` URL."""
    llm_model: str | None = None
    llm_api_key: str | None = None
    top_k: int = 5
    """Recordings of the tool shown to the LLM as examples."""
    timeout: float = 60.0
    """Seconds an LLM or upstream answer may take."""


class MissPolicy(Protocol):
    """Decides the answer to a call no recording answers with certainty."""

    async def answer(self, miss: Miss) -> Resolution:
        """Return the resolution to serve: the miss itself, or one carrying a recording."""
        ...


class ErrorPolicy:
    """Serve the miss as an error (the replay server renders its candidates and diffs)."""

    def __init__(self, settings: MissSettings) -> None:
        self.settings = settings

    async def answer(self, miss: Miss) -> Resolution:
        """Return the miss unchanged."""
        return miss.resolution


class NearestPolicy:
    """Serve the best-scoring candidate, honestly marked ``nearest``."""

    def __init__(self, settings: MissSettings) -> None:
        self.store = settings.store

    async def answer(self, miss: Miss) -> Resolution:
        """Return the top candidate as a ``nearest`` resolution, or the miss when there is none."""
        for candidate in miss.resolution.candidates:
            recording = self.store.recording(candidate.recording_id)
            if recording is not None:
                return Resolution(
                    Tier.NEAREST,
                    candidate.score,
                    recording,
                    miss.resolution.candidates,
                    key=miss.resolution.key,
                    step=miss.resolution.step,
                )
        return miss.resolution


def _live_session(server: str) -> str:
    return f"live-{server}"


class LivePolicy:
    """Forward to the real server, record its answer (origin ``live``) and serve it."""

    def __init__(self, settings: MissSettings) -> None:
        if settings.forward is None:
            raise ConfigError("miss policy 'live' needs a recorder config naming the real servers (--config)")
        self.store = settings.store
        self.forward = settings.forward

    async def answer(self, miss: Miss) -> Resolution:
        """Forward the call upstream and return the stored recording of the answer.

        Raises:
            UpstreamError: The real server could not be reached or broke mid-call.
        """
        started = time.perf_counter()
        answer = await self.forward(miss.server, miss.method, miss.params)
        session = self.store.start_session(miss.server, _live_session(miss.server))
        recording_id = self.store.record_call(
            miss.server,
            miss.method,
            answer.get("params", miss.params),
            result=answer.get("result"),
            error=answer.get("error"),
            session=session,
            latency_ms=answer.get("latency_ms", (time.perf_counter() - started) * 1000),
            origin=Origin.LIVE,
            notifications=answer.get("notifications") or None,
        )
        recording = self.store.recording(recording_id)
        return Resolution(
            Tier.LIVE,
            1.0,
            recording,
            miss.resolution.candidates,
            reason="forwarded to the real server",
            key=miss.resolution.key,
            step=miss.resolution.step,
        )


_SYSTEM_PROMPT = (
    "You simulate the MCP server {server!r}. Given a {method} request, answer with the JSON result the real "
    "server would most plausibly return, in MCP wire format (camelCase). For tools/call that is a "
    'CallToolResult object such as {{"content": [{{"type": "text", "text": "..."}}], "isError": false}}. '
    "Base your answer on the recorded examples; keep their style, structure and level of detail. "
    "Reply with the JSON object only."
)


def _example(recording: Recording) -> dict[str, Any]:
    return {"request": recording.params, "result": recording.result, "error": recording.error}


def _parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in an LLM reply, tolerating a Markdown code fence around it."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    candidate = fenced.group(1) if fenced else text
    try:
        value = json.loads(candidate.strip())
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class SynthesizePolicy:
    """Ask an LLM (OpenAI-compatible chat completions) for the answer; store it as ``synthetic``."""

    def __init__(self, settings: MissSettings) -> None:
        if not settings.llm_url or not settings.llm_model:
            raise ConfigError(
                "miss policy 'synthesize' needs --llm-url and --llm-model (an OpenAI-compatible API)"
            )
        url = settings.llm_url.rstrip("/")
        self.url = url if url.endswith("/chat/completions") else f"{url}/chat/completions"
        self.settings = settings
        self.store = settings.store

    def examples(self, miss: Miss) -> list[Recording]:
        """The top-k recordings shown to the LLM: the miss's candidates, then other calls of the tool."""
        chosen: dict[int, Recording] = {}
        for candidate in miss.resolution.candidates:
            recording = self.store.recording(candidate.recording_id)
            if recording is not None and recording.origin != Origin.SYNTHETIC:
                chosen.setdefault(recording.id, recording)
        if len(chosen) < self.settings.top_k:
            name = miss.resolution.recording.name if miss.resolution.recording else None
            name = name or str(miss.params.get("name") or miss.params.get("uri") or "")
            for recording in self.store.recordings(miss.server, method=miss.method, name=name, limit=50):
                if recording.origin != Origin.SYNTHETIC:
                    chosen.setdefault(recording.id, recording)
        return list(chosen.values())[: self.settings.top_k]

    def messages(self, miss: Miss) -> list[dict[str, str]]:
        """The chat messages sent to the LLM (deterministic for a given store and miss)."""
        user = {
            "tool": miss.tool,
            "recorded_examples": [_example(r) for r in self.examples(miss)],
            "request": {"method": miss.method, "params": miss.params},
        }
        return [
            {"role": "system", "content": _SYSTEM_PROMPT.format(server=miss.server, method=miss.method)},
            {"role": "user", "content": json.dumps(user, ensure_ascii=False, sort_keys=True)},
        ]

    async def answer(self, miss: Miss) -> Resolution:
        """Synthesize, store and return the answer.

        Raises:
            UpstreamError: The LLM endpoint failed or answered with something that is not a chat completion.
        """
        body = {
            "model": self.settings.llm_model,
            "messages": self.messages(miss),
            "temperature": 0,
            "seed": 0,
        }
        headers = (
            {"Authorization": f"Bearer {self.settings.llm_api_key}"} if self.settings.llm_api_key else {}
        )
        started = time.perf_counter()
        try:
            async with httpx2.AsyncClient(timeout=self.settings.timeout) as client:
                response = await client.post(self.url, json=body, headers=headers)
                response.raise_for_status()
                content = response.json()["choices"][0]["message"]["content"] or ""
        except (httpx2.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(f"synthesize: LLM at {self.url} failed: {exc}") from exc
        result = _parse_json_object(content)
        if result is None or (miss.method == "tools/call" and not isinstance(result.get("content"), list)):
            result = {"content": [{"type": "text", "text": content}], "isError": False}
        recording_id = self.store.record_call(
            miss.server,
            miss.method,
            miss.params,
            result=result,
            latency_ms=(time.perf_counter() - started) * 1000,
            origin=Origin.SYNTHETIC,
        )
        recording = self.store.recording(recording_id)
        score = miss.resolution.candidates[0].score if miss.resolution.candidates else 0.0
        return Resolution(
            Tier.SYNTHETIC,
            score,
            recording,
            miss.resolution.candidates,
            reason="synthesized by LLM",
            key=miss.resolution.key,
            step=miss.resolution.step,
        )


class Upstreams:
    """The ``live`` policy's way to the real servers of a recorder config (a :data:`Forward`).

    Connections open on first use and live in this object's task group: use it as an async context
    manager around serving. Calls to one upstream are sent one at a time, so the notifications that
    arrive while a call is in flight belong to that call (stdio log messages carry no request id).
    Params, answers and notifications are redacted with the config's rules before they are stored.

    Args:
        config: The recorder config (upstreams by recorded server name, redaction rules).
    """

    def __init__(self, config: RecorderConfig) -> None:
        self.config = config
        self._upstreams: dict[str, tuple[Upstream, anyio.Lock, list[dict[str, Any]]]] = {}
        self._open_lock = anyio.Lock()
        self._stack = AsyncExitStack()
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Upstreams:
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *exc: object) -> None:
        for upstream, _, _ in self._upstreams.values():
            await upstream.close()
        self._upstreams.clear()
        await self._stack.aclose()

    async def _open(self, server: str) -> tuple[Upstream, anyio.Lock, list[dict[str, Any]]]:
        async with self._open_lock:
            found = self._upstreams.get(server)
            if found is not None and found[0].alive:
                return found
            spec = self.config.servers.get(server)
            if spec is None:
                known = ", ".join(sorted(self.config.servers)) or "none"
                raise UpstreamError(
                    f"live: no upstream for server {server!r} in the recorder config ({known})"
                )
            if self._tg is None:
                raise RuntimeError("enter Upstreams (async with) before forwarding")
            notes: list[dict[str, Any]] = []

            async def collect(method: str, params: dict[str, Any]) -> None:
                if method in ("notifications/progress", "notifications/message"):
                    notes.append(
                        {
                            "method": method,
                            "params": {k: v for k, v in params.items() if k != "progressToken"},
                        }
                    )

            upstream = Upstream(spec, on_notification=collect)
            await self._tg.start(upstream.run)
            found = self._upstreams[server] = (upstream, anyio.Lock(), notes)
            return found

    async def __call__(self, server: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Forward one call; see :data:`Forward`."""
        upstream, lock, notes = await self._open(server)
        redactor = self.config.redactor.with_secrets(upstream.spec.secrets())
        async with lock:
            notes.clear()
            request_id = upstream.next_request_id()
            out = {**params, "_meta": {"progressToken": request_id}}
            answer = await upstream.exchange(method, out, request_id=request_id)
            if answer.error is not None and answer.error["code"] == types.CONNECTION_CLOSED:
                raise UpstreamError(f"live: {answer.error['message']}")
            return {
                "params": redactor.redact(params),
                "result": redactor.redact(answer.result),
                "error": redactor.redact(answer.error),
                "notifications": redactor.redact(list(notes)),
                "latency_ms": round(answer.latency_ms, 3),
            }


MISS_POLICIES: dict[MissPolicyName, Callable[[MissSettings], MissPolicy]] = {
    MissPolicyName.ERROR: ErrorPolicy,
    MissPolicyName.NEAREST: NearestPolicy,
    MissPolicyName.LIVE: LivePolicy,
    MissPolicyName.SYNTHESIZE: SynthesizePolicy,
}
"""Miss policies by name."""


def make_policy(name: str | MissPolicyName, settings: MissSettings) -> MissPolicy:
    """Build the named miss policy.

    Raises:
        ConfigError: Unknown policy name, or settings the policy needs are missing.
    """
    try:
        factory = MISS_POLICIES[MissPolicyName(name)]
    except ValueError:
        known = ", ".join(MissPolicyName)
        raise ConfigError(f"unknown miss policy {name!r}; choose one of {known}") from None
    return factory(settings)
