"""Episodes: the named histories of rollouts, bounded in number and in idle time.

An episode is one rollout's view of the recorded servers: its history on each server (what the
resolver picks recordings by), how many calls it made (what deterministic faults are drawn by),
what it was answered (calls by tier, misses, faults) and its seed. It is created by
``POST /api/episodes`` (or :meth:`Episodes.create`), or by the first *valid* request naming a new
id in an episode URL, the ``X-Replay-Episode`` header or ``_meta["replay-sim/episode"]``: one the
MCP server answered (a request it refused — an unknown session, a malformed body — creates nothing;
:meth:`Episodes.admit` checks a request before it is handled without creating anything).

Memory stays bounded without ever taking a live rollout's state away: an episode idle for
``idle_timeout`` seconds expires (its next request starts afresh), and beyond ``max_live`` live
episodes a new one is refused (:class:`~replay_sim.errors.EpisodeError`, status 503) rather than
an old one evicted. ``DELETE /api/episodes/<id>`` ends one at once. Creation is rate-aware: new
episodes come from a bucket of ``burst`` that refills at ``rate`` a second, so a burst of
creations past it is refused (503, retry shortly) long before it could take the cap; a rollout
batch starting at once (up to ``burst`` episodes) is never refused by it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from replay_sim import untrusted
from replay_sim.errors import EpisodeError
from replay_sim.protocol import episode_problem
from replay_sim.replay.options import (
    DEFAULT_EPISODE_BURST,
    DEFAULT_EPISODE_IDLE_TIMEOUT,
    DEFAULT_EPISODE_RATE,
    DEFAULT_MAX_EPISODES,
)
from replay_sim.resolve.lineage import Trail

__all__ = [
    "MAX_METADATA_BYTES",
    "Episode",
    "Episodes",
    "History",
    "seed_of",
]

MAX_METADATA_BYTES = 16 * 1024
"""The most JSON an episode's metadata may take."""
_KEPT_MISSES = 10  # the latest misses an episode keeps for its summary
_REASON_CHARS = 300


def seed_of(episode: str) -> int:
    """The seed of an episode created without one: a 63-bit number drawn from its id (same id, same seed)."""
    return int.from_bytes(hashlib.sha256(episode.encode()).digest()[:8], "big") >> 1


class History:
    """One scope's history on each recorded server: its trail and how many calls it made there.

    A scope is a named episode or an MCP connection (a handshake-era session, a stdio client).
    """

    __slots__ = ("calls", "trails")

    def __init__(self) -> None:
        self.trails: dict[str, Trail] = {}
        self.calls: dict[str, int] = {}

    def trail(self, server: str) -> Trail:
        """The trail on ``server`` (created empty): the resolver reads it and advances it."""
        found = self.trails.get(server)
        if found is None:
            found = self.trails[server] = Trail()
        return found

    def called(self, server: str) -> None:
        """Count one answered call on ``server`` (the next call's index is one more)."""
        self.calls[server] = self.calls.get(server, 0) + 1


class Episode(History):
    """A named episode: its history, its seed and metadata, and what it was answered.

    Attributes:
        id: The episode id (:data:`~replay_sim.protocol.EPISODE_ID_GRAMMAR`).
        seed: Draws its faults (with the snapshot or store and the call index): given, or
            :func:`seed_of` its id.
        metadata: What its creator attached (JSON), returned as given.
        created_at: When it was created (Unix time).
        used: When it last served a request (the registry's clock).
    """

    __slots__ = ("created_at", "faults", "id", "metadata", "misses", "sandbox", "seed", "tiers", "used")

    def __init__(self, id: str, seed: int, metadata: Any, used: float) -> None:
        super().__init__()
        self.id = id
        self.seed = seed
        self.metadata = metadata
        self.created_at = time.time()
        self.used = used
        self.tiers: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.misses: list[dict[str, Any]] = []
        self.sandbox: dict[str, int] = {}

    def count_sandbox(self, **counts: int) -> None:
        """Count what its sandbox instances did: ``instances``, ``replayed`` calls, ``answers``, ``lost``."""
        for what, n in counts.items():
            self.sandbox[what] = self.sandbox.get(what, 0) + n

    def count(self, server: str, name: str, status: str, fault: str | None, reason: str = "") -> None:
        """Count one answered call: its tier (``status``), the fault injected, a miss's reason."""
        self.tiers[status] = self.tiers.get(status, 0) + 1
        if fault is not None:
            self.faults[str(fault)] = self.faults.get(str(fault), 0) + 1
        if status in ("miss", "refused"):
            del self.misses[: max(0, len(self.misses) - _KEPT_MISSES + 1)]
            self.misses.append(
                {"server": server, "name": name, "status": status, "reason": reason[:_REASON_CHARS]}
            )

    @property
    def diverged(self) -> dict[str, str]:
        """The servers on which the episode changed state in a way no recording shows, with the call."""
        return {server: t.diverged for server, t in sorted(self.trails.items()) if t.diverged}

    def summary(self, now: float) -> dict[str, Any]:
        """What ``GET /api/episodes/<id>`` says: calls by tier, misses, divergence, seed, idle time, sandbox.

        ``sandbox`` counts what its sandbox instances did: instances bound, calls re-played, calls
        answered, and whether an instance died (the episode is lost).
        """
        return {
            "id": self.id,
            "seed": self.seed,
            "metadata": self.metadata,
            "created_at": round(self.created_at, 3),
            "idle_s": round(max(0.0, now - self.used), 3),
            "calls": sum(self.calls.values()),
            "calls_by_server": dict(sorted(self.calls.items())),
            "tiers": dict(sorted(self.tiers.items())),
            "faults": dict(sorted(self.faults.items())),
            "misses": sum(n for tier, n in self.tiers.items() if tier in ("miss", "refused")),
            "recent_misses": list(self.misses),
            "diverged": bool(self.diverged),
            "diverged_at": self.diverged,
            "sandbox": {
                "instances": self.sandbox.get("instances", 0),
                "replayed": self.sandbox.get("replayed", 0),
                "answers": self.sandbox.get("answers", 0),
                "lost": self.sandbox.get("lost", 0),
            },
        }


class Episodes:
    """The live named episodes: created explicitly or on first use, expired when idle, capped in number.

    Thread-safe (the MCP endpoints and the admin API's worker threads share it).

    Args:
        max_live: Live episodes at most; past it a new episode is refused (503), never an old one evicted.
        idle_timeout: Seconds without a request after which an episode expires (None: never).
        clock: Seconds, monotonic (injected by tests).
        rate: New episodes a second, sustained, once ``burst`` is spent (past it: 503).
        burst: New episodes that may be created at once.
    """

    def __init__(
        self,
        max_live: int = DEFAULT_MAX_EPISODES,
        idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        rate: float = DEFAULT_EPISODE_RATE,
        burst: int = DEFAULT_EPISODE_BURST,
    ) -> None:
        self.max_live = max_live
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.rate = rate
        self.burst = burst
        self.expired = 0
        """Episodes expired so far (for metrics)."""
        self.refused = 0
        """New episodes refused at the cap or the creation rate so far (for metrics)."""
        self._live: OrderedDict[str, Episode] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self._tokens = float(burst)  # new episodes that may be created now
        self._filled = clock()  # when the bucket was last refilled

    def __len__(self) -> int:
        with self._lock:
            self._expire(self.clock())
            return len(self._live)

    def create(self, episode: str | None = None, seed: int | None = None, metadata: Any = None) -> Episode:
        """Create an episode (``POST /api/episodes``).

        Args:
            episode: Its id (default: a fresh random one).
            seed: Its seed (default: :func:`seed_of` its id).
            metadata: JSON its creator attaches (at most :data:`MAX_METADATA_BYTES`).

        Raises:
            EpisodeError: The id is malformed or the metadata too large or not JSON (400), the id is
                live already (409), or the cap of live episodes is reached (503).
        """
        if episode is None:
            episode = f"ep-{secrets.token_hex(8)}"
        elif (problem := episode_problem(episode)) is not None:
            raise EpisodeError(problem)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63):
            raise EpisodeError(f"episode {episode!r}: the seed must be an integer below 2**63, not {seed!r}")
        try:
            untrusted.check_depth(metadata)
            size = len(json.dumps(metadata, ensure_ascii=False, allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            raise EpisodeError(f"episode {episode!r}: metadata must be JSON: {exc}") from exc
        if size > MAX_METADATA_BYTES:
            raise EpisodeError(
                f"episode {episode!r}: metadata of {size} bytes is too large (at most {MAX_METADATA_BYTES})"
            )
        with self._lock:
            now = self.clock()
            self._expire(now)
            if episode in self._live:
                raise EpisodeError(
                    f"episode {episode!r} is live already: end it first (DELETE /api/episodes/{episode}) "
                    "or choose another id",
                    status=409,
                )
            return self._add(episode, seed, metadata, now)

    def open(self, episode: str) -> Episode:
        """The live episode ``episode`` (a valid request names it), created on first use; marked as used now.

        Raises:
            EpisodeError: It is new and the cap of live episodes or the creation rate is reached (503).
        """
        with self._lock:
            now = self.clock()
            found = self._live.get(episode)
            if found is not None and not self._stale(found, now):
                found.used = now
                self._live.move_to_end(episode)
                return found
            self._expire(now)
            return self._add(episode, None, None, now)

    def admit(self, episode: str) -> None:
        """Check that a request naming ``episode`` may go on, creating nothing (a request not yet handled).

        A live episode may; a new one may while the cap and the creation rate leave room for it.
        The request creates it only if it turns out valid (:meth:`open`), so invalid requests
        never fill the cap nor spend the rate.

        Raises:
            EpisodeError: It is new and the cap of live episodes or the creation rate is reached (503).
        """
        with self._lock:
            now = self.clock()
            found = self._live.get(episode)
            if found is not None and not self._stale(found, now):
                return
            self._expire(now)
            self._room(episode, now)

    def get(self, episode: str) -> Episode | None:
        """The live episode ``episode``, or None (reading it does not count as a use)."""
        with self._lock:
            self._expire(self.clock())
            return self._live.get(episode)

    def end(self, episode: str) -> Episode | None:
        """End an episode and free its state; returns it, or None when it was not live."""
        with self._lock:
            self._expire(self.clock())
            return self._live.pop(episode, None)

    def live(self) -> list[Episode]:
        """Every live episode, least recently used first."""
        with self._lock:
            self._expire(self.clock())
            return list(self._live.values())

    def summary(self, episode: Episode) -> dict[str, Any]:
        """``episode``'s summary (:meth:`Episode.summary`) by this registry's clock."""
        with self._lock:
            return episode.summary(self.clock())

    def _add(self, episode: str, seed: int | None, metadata: Any, now: float) -> Episode:
        self._room(episode, now)
        self._tokens -= 1
        created = self._live[episode] = Episode(
            episode, seed_of(episode) if seed is None else seed, metadata, now
        )
        return created

    def _room(self, episode: str, now: float) -> None:
        """Refuse a new episode past the cap or the creation rate (503); the bucket refilled to ``now``."""
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        if len(self._live) >= self.max_live:
            self.refused += 1
            expiry = (
                f"idle ones expire after {self.idle_timeout:g} s (--episode-idle-timeout)"
                if self.idle_timeout is not None
                else "they never expire (--episode-idle-timeout)"
            )
            raise EpisodeError(
                f"cannot start episode {episode!r}: {len(self._live)} episodes are live, the most this "
                f"server keeps (--max-episodes {self.max_live}); end finished ones "
                f"(DELETE /api/episodes/<id>, or close their handles), or wait: {expiry}",
                status=503,
            )
        if self._tokens < 1:
            self.refused += 1
            raise EpisodeError(
                f"cannot start episode {episode!r}: new episodes are being created faster than this "
                f"server allows (--episode-rate {self.rate:g} a second after a burst of "
                f"{self.burst}); retry in a second",
                status=503,
            )

    def _stale(self, episode: Episode, now: float) -> bool:
        return self.idle_timeout is not None and now - episode.used >= self.idle_timeout

    def _expire(self, now: float) -> None:
        """Drop the episodes idle too long: the least recently used come first, so stop at a fresh one."""
        while self._live:
            oldest = next(iter(self._live.values()))
            if not self._stale(oldest, now):
                return
            del self._live[oldest.id]
            self.expired += 1
