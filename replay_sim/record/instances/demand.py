"""How many warm instances keep up with demand: the recent take rate times how long a start takes.

A pool that keeps a fixed number of instances warm either starts processes nobody asks for or
makes a burst of episodes wait for starts one by one. :class:`Demand` watches each server's takes
(over the last :data:`WINDOW` seconds) and how long its instances take to start (a moving average),
and says how many to keep warm so that the instances being started when a take comes are ready by
the next ones: ``rate x start time`` with some headroom, never below the configured pool nor above
a ceiling (the pool bounds it by its cap).
"""

from __future__ import annotations

import math
from collections import deque

import anyio

__all__ = ["WINDOW", "Demand"]

WINDOW = 10.0
"""Seconds of takes the rate is measured over."""
_HEADROOM = 1.5
_SMOOTHING = 0.3  # weight of the latest start in the moving average


class Demand:
    """Takes and start times per server, and the warm instances they call for."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._takes: dict[str, deque[float]] = {}
        self._start_s: dict[str, float] = {}
        self._begun: dict[str, float] = {}  # instance id -> when its start began

    def took(self, server: str) -> None:
        """An instance of ``server`` was handed out now."""
        self._takes.setdefault(server, deque()).append(anyio.current_time())

    def begin(self, instance: str) -> None:
        """An instance's start began now."""
        self._begun[instance] = anyio.current_time()

    def ready(self, server: str, instance: str) -> None:
        """An instance's start ended (it came up, or not): its time joins the server's average."""
        began = self._begun.pop(instance, None)
        if began is None:
            return
        seconds = anyio.current_time() - began
        before = self._start_s.get(server)
        self._start_s[server] = seconds if before is None else before + _SMOOTHING * (seconds - before)

    def warm(self, server: str, floor: int, ceiling: int) -> int:
        """Warm instances to keep for ``server``: enough for the recent take rate, within the bounds."""
        takes = self._takes.get(server)
        if not takes:
            return floor
        since = anyio.current_time() - self.window
        while takes and takes[0] < since:
            takes.popleft()
        rate = len(takes) / self.window
        wanted = math.ceil(rate * self._start_s.get(server, 1.0) * _HEADROOM)
        return max(floor, min(wanted, ceiling))
