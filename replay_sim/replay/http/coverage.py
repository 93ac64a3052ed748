"""The coverage view (``/api/coverage``, the dashboard's "Coverage" section): where recordings run out.

Per tool: how many calls are recorded (by origin), how the calls replayed so far were answered (by
tier, and the share answered from a recording), and how many misses are kept for it. Then the most
missed calls — from the persistent miss log (:mod:`replay_sim.store.misses`), so they survive
restarts — each with its nearest recordings and whether ``replay-sim backfill`` can take it: at the
initial state it can; after state-changing calls only with the upstream's ``reset`` command; with
no episode, or a redacted value, it cannot.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from replay_sim.replay.core.replay import Replay
from replay_sim.replay.observe.metrics import truncated
from replay_sim.store import Store
from replay_sim.store.misses import MissEntry, read_misses

__all__ = ["coverage"]

_ANSWERED = ("exact", "canonical", "semantic")  # tiers that answer from a recording with certainty


def _backfill(entry: MissEntry, replacement: str) -> dict[str, Any]:
    """Whether backfill can take a miss, and what it needs."""
    why = entry.obstacle(replacement)
    if why is not None:
        return {"can": False, "needs": why}
    if entry.initial:
        return {"can": True, "needs": None}
    n = len(entry.prefix or [])
    return {
        "can": True,
        "needs": f"the upstream's reset command ({n} state-changing call{'s' * (n != 1)} first)",
    }


def _kept(replay: Replay, limit: int) -> tuple[list[MissEntry], str | None]:
    """The most missed calls in the replay's miss log, and where it is (None: nowhere)."""
    log = replay.miss_log
    if log is None:
        return [], None
    if log.path == replay.store.path:
        return read_misses(replay.store, limit=limit), str(log.path)
    if not log.path.is_file():
        return [], str(log.path)
    with Store(log.path, readonly=True) as side:
        return read_misses(side, limit=limit), str(log.path)


def coverage(replay: Replay, limit: int = 20) -> dict[str, Any]:
    """The coverage view as JSON: per tool, and the ``limit`` most missed calls.

    Returns:
        ``{"tools": [...], "misses": [...], "miss_log": path | None}``.
    """
    tools: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"recorded": 0, "origins": {}, "tiers": {}, "replayed": 0, "kept_misses": 0}
    )
    for row in replay.store.stats():
        if row["method"] == "tools/call":
            tool = tools[(row["server"], row["name"])]
            tool["recorded"] += row["calls"]
            tool["origins"][row["origin"]] = row["calls"]
    for row in replay.metrics.stats():
        if row["method"] == "tools/call":
            tool = tools[(row["server"], row["tool"])]
            tool["tiers"][row["tier"]] = row["count"]
            tool["replayed"] += row["count"]
    entries, where = _kept(replay, 10_000)
    for entry in entries:
        if entry.method == "tools/call":
            tools[(entry.server, entry.name)]["kept_misses"] += entry.count
    replacement = replay.redactor.replacement
    rows = []
    for (server, name), tool in sorted(tools.items()):
        answered = sum(tool["tiers"].get(t, 0) for t in _ANSWERED)
        rate = round(answered / tool["replayed"], 4) if tool["replayed"] else None
        rows.append({"server": server, "tool": name, **tool, "hit_rate": rate})
    misses = [
        {**e.as_dict(), "params": truncated(e.params), "reason": truncated(e.reason),
         "candidates": truncated(e.candidates), "prefix": None if e.prefix is None else len(e.prefix),
         "backfill": _backfill(e, replacement)}
        for e in entries[:limit]
    ]  # fmt: skip
    return {"tools": rows, "misses": misses, "miss_log": where}
