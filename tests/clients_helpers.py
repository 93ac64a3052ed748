"""The rollouts the agent-client tests (tests/clients) run, and what they check of their episodes."""

from __future__ import annotations

from typing import Any

STEPS = [("a", "increment"), ("b", "counter"), ("a", "counter"), ("b", "increment"), ("b", "counter")]
"""Two rollouts, interleaved: ``a`` writes first, so ``b``'s first read is still 0."""
ANSWERS = ["ok", "0", "1", "ok", "1"]
"""What each step is answered when each rollout has its own history (shared history: b reads 1)."""


def answered_alone(*episodes: Any) -> bool:
    """Whether each episode handle's stats show its own calls only, all exact, none diverged."""
    for episode in episodes:
        stats = episode.stats()
        if stats["tiers"] != {"exact": stats["calls"]} or stats["diverged"] or stats["calls"] < 2:
            return False
    return True
