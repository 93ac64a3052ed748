"""Which live replica owns an episode: rendezvous (highest-random-weight) hashing.

Every router computes the same owner from the same key and the same set of live replicas, with no
shared state: each replica scores ``blake2b(replica, key)`` and the highest score wins. When a
replica leaves, only its own episodes move (to the next-highest scorer); when one joins, it takes
only the episodes it now scores highest on — and those already held elsewhere are sent back to
their holder (:mod:`~replay_sim.scale.gateway`), so a scale-up never splits an episode.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["owner"]


def owner(key: str, replicas: Iterable[str]) -> str | None:
    """The replica that owns ``key`` among ``replicas`` (None when there are none).

    Args:
        key: The affinity key (an episode id).
        replicas: The live replicas' ids.

    Returns:
        The owner's id; the same for the same key and set of replicas, in any process.
    """
    best: tuple[bytes, str] | None = None
    encoded = key.encode()
    for replica in replicas:
        score = hashlib.blake2b(encoded, key=replica.encode()[:64], digest_size=8).digest()
        if best is None or (score, replica) > best:
            best = (score, replica)
    return None if best is None else best[1]
