"""The ``live`` miss policy: forward the call to the real server, record its answer, serve it.

How the real servers are reached is injected (:attr:`MissSettings.forward`): the replay side
never opens an upstream itself, so it does not depend on the recorder.
"""

from __future__ import annotations

import time

import anyio.to_thread

from replay_sim.errors import ConfigError
from replay_sim.replay.core.misses import Miss
from replay_sim.replay.policies.miss import MissSettings
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Origin

__all__ = ["LivePolicy"]


def _live_session(server: str) -> str:
    return f"live-{server}"


class LivePolicy:
    """Forward to the real server, record its answer (origin ``live``) and serve it."""

    def __init__(self, settings: MissSettings) -> None:
        if settings.forward is None:
            raise ConfigError("miss policy 'live' needs a recorder config naming the real servers (--config)")
        self.store = settings.store
        self.forward = settings.forward

    def asks_real_server(self, server: str) -> bool:
        """Whether a miss of ``server`` is answered by the real server: always, for ``live``."""
        del server
        return True

    async def answer(self, miss: Miss) -> Resolution:
        """Forward the call upstream and return the stored recording of the answer.

        Raises:
            UpstreamError: The real server could not be reached or broke mid-call.
        """
        started = time.perf_counter()
        answer = await self.forward(miss.server, miss.method, miss.params)
        latency_ms = answer.get("latency_ms", (time.perf_counter() - started) * 1000)

        def record() -> int:
            session = self.store.start_session(miss.server, _live_session(miss.server))
            return self.store.record_call(
                miss.server,
                miss.method,
                answer.get("params", miss.params),
                result=answer.get("result"),
                error=answer.get("error"),
                session=session,
                latency_ms=latency_ms,
                origin=Origin.LIVE,
                notifications=answer.get("notifications") or None,
            )

        # Off the event loop: while another process holds the store's write lock only this call waits.
        recording = self.store.recording(await anyio.to_thread.run_sync(record))
        return Resolution(
            Tier.LIVE,
            1.0,
            recording,
            miss.resolution.candidates,
            reason="forwarded to the real server",
            key=miss.resolution.key,
            step=miss.resolution.step,
        )
