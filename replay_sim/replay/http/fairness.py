"""Per-client fairness of episode creation: one flooding client cannot spend every client's rate.

The server's own bucket (:class:`~replay_sim.replay.core.episodes.Episodes`: ``--episode-rate``
after a burst of ``--episode-burst``) bounds how fast episodes are created over every client. On
its own it is first come, first served: one client creating episodes in a loop takes the whole
burst, and another trainer's first episode gets ``503``. :class:`ClientBuckets` gives each client
a bucket of its own, a share (:attr:`~replay_sim.replay.options.Limits.episode_client_share`, half
by default) of the server's rate and burst: a client that spent its share is refused (``503``,
retry shortly) while the rest of the server's bucket stays for the others, and the server's bound
holds as before.

A client is its address — the peer of the connection, or what uvicorn's proxy headers say it is
behind a trusted proxy. Clients behind one address share a bucket. Only buckets still refilling
are kept: a full bucket is no different from none, so memory stays bounded by the clients active
within the last ``burst / rate`` seconds, and at most :data:`MAX_CLIENTS` of them.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import Scope

from replay_sim.errors import ConfigError, EpisodeError

__all__ = ["MAX_CLIENTS", "ClientBuckets", "client_of"]

MAX_CLIENTS = 65_536
"""The most clients whose buckets are kept at once (past it, the least recently refilled go)."""


def client_of(scope: Scope) -> str:
    """The client a request comes from: its address (``unknown`` when the server cannot tell)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class ClientBuckets:
    """A creation-rate bucket per client: a share of the server's rate and burst each.

    Thread-safe (the MCP endpoints and the admin API's worker threads share it).

    Args:
        rate: The server's new episodes a second (``--episode-rate``).
        burst: The server's new episodes at once (``--episode-burst``).
        share: The part of ``rate`` and ``burst`` one client may take (1: no per-client bound).
        clock: Seconds, monotonic (injected by tests).

    Raises:
        ConfigError: ``share`` is not above 0 and at most 1.
    """

    def __init__(
        self, rate: float, burst: int, share: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < share <= 1:
            raise ConfigError(f"a client's share of the episode rate must be in (0, 1], not {share!r}")
        self.rate = rate * share
        self.burst = max(1, math.ceil(burst * share))
        self.share = share
        self.clock = clock
        self.refused = 0
        """New episodes refused at a client's own bound so far (for metrics)."""
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client: (tokens, when)
        self._lock = threading.Lock()

    @property
    def off(self) -> bool:
        """Whether one client may take the server's whole rate (no per-client bound)."""
        return self.share >= 1

    def check(self, client: str, episode: str) -> None:
        """Refuse a new episode of ``client`` when it has spent its share (spends nothing).

        Raises:
            EpisodeError: ``client`` has no episode left in its bucket (503).
        """
        if self.off:
            return
        with self._lock:
            if self._tokens(client, self.clock()) < 1:
                self.refused += 1
                raise EpisodeError(
                    f"cannot start episode {episode!r}: {client} is creating episodes faster than one "
                    f"client may ({self.rate:g} a second after a burst of {self.burst}: "
                    f"{self.share:g} of --episode-rate and --episode-burst); retry in a second",
                    status=503,
                )

    def spend(self, client: str) -> None:
        """Count one episode created by ``client``."""
        if self.off:
            return
        with self._lock:
            now = self.clock()
            tokens = self._tokens(client, now) - 1
            self._buckets[client] = (tokens, now)
            self._buckets.move_to_end(client)
            self._forget_full(now)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)

    def __len__(self) -> int:
        """Clients whose bucket is refilling (the others' are full: not kept)."""
        with self._lock:
            self._forget_full(self.clock())
            return len(self._buckets)

    def _tokens(self, client: str, now: float) -> float:
        kept = self._buckets.get(client)
        if kept is None:
            return float(self.burst)
        tokens, when = kept
        return min(float(self.burst), tokens + (now - when) * self.rate)

    def _forget_full(self, now: float) -> None:
        """Drop the buckets refilled to full: the least recently spent come first, stop at one that is not."""
        while self._buckets:
            client = next(iter(self._buckets))
            if self._tokens(client, now) < self.burst:
                return
            del self._buckets[client]
