"""Which replica holds each episode: one small shared table, so a lost episode is never restarted.

Routing sends an episode to one replica, but the live set changes: a replica dies (its episodes
now hash elsewhere), or autoscaling adds one (some episodes now hash to it). The replica that
receives an episode it does not know claims it here first (once per episode, not per call); the
answer is the episode's holder — itself for a new episode, else the replica that served its
first call. The replica then refuses to start a second history for it, and its front either sends
the request to the live holder or tells the client the episode is lost.

The table is a Serve deployment of one replica, so it lives and dies with the application. If it
is restarted it starts empty: replicas keep serving the episodes they hold, but an episode whose
holder died in the same window would be restarted empty elsewhere — each front's own record of
holders still catches that for the episodes it routed.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["DEFAULT_MAX_EPISODES", "Holders"]

DEFAULT_MAX_EPISODES = 2_000_000
"""How many episodes the table remembers (least recently claimed forgotten first; ~150 B each)."""


class Holders:
    """The episode → holder table (the body of the registry deployment; plain Python, tested alone).

    Args:
        max_episodes: How many episodes to remember.
    """

    def __init__(self, max_episodes: int = DEFAULT_MAX_EPISODES) -> None:
        self.max_episodes = max_episodes
        self._holders: OrderedDict[str, str] = OrderedDict()

    async def claim(self, episode: str, replica: str) -> str:
        """Claim ``episode`` for ``replica`` unless another holds it; returns the holder.

        Async with no await inside: claims are atomic on the deployment's event loop.
        """
        holder = self._holders.get(episode)
        if holder is None:
            holder = self._holders[episode] = replica
            while len(self._holders) > self.max_episodes:
                self._holders.popitem(last=False)
        else:
            self._holders.move_to_end(episode)
        return holder

    async def held(self) -> dict[str, int]:
        """How many episodes each replica holds (dead replicas' included)."""
        counts: dict[str, int] = {}
        for holder in self._holders.values():
            counts[holder] = counts.get(holder, 0) + 1
        return counts
