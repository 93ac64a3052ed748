"""What a process derives of a store per server and keeps for as long as the store is open.

Learning a server's tool effects reads its calls and judges them once each, and goes on from there
as the store grows (:mod:`~replay_sim.resolve.effectcalls`, :mod:`~replay_sim.resolve.tooleffects`).
What that keeps belongs to one store and one server: :class:`PerServer` holds it, made on first use
and dropped with the store.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from replay_sim.store.store import Store

__all__ = ["PerServer"]

T = TypeVar("T")


class PerServer(Generic[T]):
    """One ``T`` per open store and server (``make()`` on first use; thread-safe).

    Args:
        make: Makes what is kept for a store and server not seen yet.
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._kept: weakref.WeakKeyDictionary[Store, dict[str, T]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def of(self, store: Store, server: str) -> T:
        """What is kept for ``server`` of ``store``."""
        with self._lock:
            kept = self._kept.setdefault(store, {})
            if server not in kept:
                kept[server] = self._make()
            return kept[server]
