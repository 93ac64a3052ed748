"""The ``synthesize`` miss policy: ask an LLM for the answer a real server would most plausibly give.

The LLM is any OpenAI-compatible chat completions endpoint, prompted with the tool's schema and the
top-k recordings of the tool as examples. Its answer is stored with origin ``synthetic`` (and never
passed off as recorded: its provenance status is ``synthetic``), so a repeat is served from the store.
"""

from __future__ import annotations

import functools
import json
import re
import time
from typing import Any

import anyio.to_thread
import httpx2

from replay_sim.errors import ConfigError, UpstreamError
from replay_sim.replay.core.misses import Miss
from replay_sim.replay.policies.miss import MissSettings
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Origin, Recording

__all__ = ["SynthesizePolicy"]

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
        # Off the event loop: while another process holds the store's write lock only this call waits.
        record = functools.partial(
            self.store.record_call,
            miss.server,
            miss.method,
            miss.params,
            result=result,
            latency_ms=(time.perf_counter() - started) * 1000,
            origin=Origin.SYNTHETIC,
        )
        recording = self.store.recording(await anyio.to_thread.run_sync(record))
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
