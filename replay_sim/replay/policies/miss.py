"""Miss policies: what the replay server does when no recording answers a call with certainty.

A policy turns the resolver's miss into a :class:`~replay_sim.resolve.resolver.Resolution`: the miss itself
(``error``: the replay server answers with a diagnosable error), the nearest candidate
(``nearest``), or a new recording it stored first (``live`` forwards to the real server, see
:mod:`~replay_sim.replay.policies.live`; ``synthesize`` asks an LLM, see
:mod:`~replay_sim.replay.policies.synthesize`).
The call and the policy protocol are the core's (:mod:`~replay_sim.replay.core.misses`, with the
``error`` policy); this module holds what the others share (their settings, the ``live`` policy's
forward) and ``nearest``; policies are looked up by name in
:data:`~replay_sim.replay.policies.registry.MISS_POLICIES`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from replay_sim.replay.core.misses import Miss
from replay_sim.replay.options import DEFAULT_SANDBOX_CALL_LIMIT, DEFAULT_SANDBOX_IDLE
from replay_sim.replay.policies.instances import SandboxPool
from replay_sim.resolve.lineage import StateLookup
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Store

__all__ = ["Forward", "MissSettings", "NearestPolicy"]


Forward = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""``forward(server, method, params)`` sends a call to the real server and returns
``{"params": ..., "result": ..., "error": ..., "notifications": [...], "latency_ms": ...}`` (wire JSON,
redacted as the recorder would). The record side provides one: ``replay_sim.record.forward.Forwarder``."""


@dataclass(slots=True)
class MissSettings:
    """Everything the policies may need; each reads only its own part."""

    store: Store
    forward: Forward | None = None
    """How ``live`` reaches the real servers (injected: built from the recorder config by the caller)."""
    connections: AbstractAsyncContextManager[Any] | None = None
    """What ``forward`` holds open (upstream processes and sessions): entered around serving, which
    closes them at the end; usually the forwarder itself."""
    llm_url: str | None = None
    """OpenAI-compatible base URL (``http://host/v1``) or full ``/chat/completions`` URL."""
    llm_model: str | None = None
    llm_api_key: str | None = None
    top_k: int = 5
    """Recordings of the tool shown to the LLM as examples."""
    timeout: float = 60.0
    """Seconds an LLM answer may take."""
    sandboxes: SandboxPool | None = None
    """Where the ``sandbox`` policy takes instances of the real servers (injected: the record side's
    pool, built from the recorder config by the caller)."""
    sandbox_timeout: float = 30.0
    """Seconds an episode may wait for a sandbox instance before its call is a miss saying so."""
    sandbox_idle: float | None = DEFAULT_SANDBOX_IDLE
    """Seconds after which the instance of an episode that made no call is given back (None: never);
    the episode's next call rebuilds it."""
    sandbox_call_limit: float | None = DEFAULT_SANDBOX_CALL_LIMIT
    """Seconds one call to a sandbox instance may take at most, progress notifications or not (None:
    no limit but the server's own timeout, which progress extends)."""
    sandbox_shared: int = 2
    """Initial-state instances per server shared by requests with no history."""
    stored: Callable[[], None] | None = None
    """Called from a worker thread after a policy wrote to the store: the resolver reads what was
    appended then, off the answer path (the replay fills it in)."""
    lookup: StateLookup | None = None
    """The resolver's view of the recordings' states (the replay fills it in): what ``sandbox`` re-plays."""


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
