"""What the calibrated confidence costs an exact hit, against the same resolver without it.

The first dev set's recordings (``fixtures/probes``) are imported, indexed and their confidence
model learned as ``replay-sim index build`` does. Two resolvers over that store answer the same
exact hits — every recorded call the strict tiers answer exactly from the initial state, and the
same calls one state-changing step into an episode — in interleaved rounds:

- ``judged``: the resolver as ``serve`` and ``serving()`` build it (the model loaded from the
  index folder; every answer gets its confidence and drivers);
- ``unjudged``: the same resolver with the judge replaced by one that hands each resolution back
  untouched (what an exact hit cost before the confidence existed).

Both go through ``Resolver.resolve_now``, the call the replay server makes for every request
(exact hits are settled there, on the event loop). Reported: each side's best median per call
over the rounds and their ratio. Target: ``judged`` within 5 % of ``unjudged`` (ratio <= 1.05).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from replay_sim.resolve.build import build_index
from replay_sim.resolve.confidence.learning import learn
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "fixtures" / "probes" / "recordings.jsonl"
ROUNDS = 7
REPEATS = 20  # each call this many times per round
TARGET = 1.05

Call = tuple[str, str, dict[str, Any], list[str]]


class Unjudged:
    """A judge that judges nothing: the resolution as the strict tiers gave it."""

    def judge(self, resolver: Any, server: str, method: str, name: str, arguments: Any, trail: Any,
              resolution: Resolution, requested: float | None = None) -> Resolution:  # fmt: skip
        return resolution


def _exact_hits(resolver: Resolver) -> list[Call]:
    """Recorded calls the strict tiers answer exactly, from the initial state and one step in."""
    calls: list[Call] = []
    for rec in resolver.store.recordings(method="tools/call"):
        for history in ([], resolver.lookup.state_of(rec)[:1]):
            found = resolver.resolve(rec.server, rec.method, rec.params, list(history))
            if found.tier is Tier.EXACT:
                calls.append((rec.server, rec.method, rec.params, list(history)))
    return calls


def _round(resolver: Resolver, calls: list[Call]) -> float:
    """Median seconds per ``resolve_now`` of the calls."""
    samples = []
    for _ in range(REPEATS):
        for server, method, params, history in calls:
            started = time.perf_counter()
            found = resolver.resolve_now(server, method, params, history)
            samples.append(time.perf_counter() - started)
            assert found is not None and found.tier is Tier.EXACT
    return statistics.median(samples)


def measure(folder: Path) -> dict[str, float]:
    """Each side's best median (µs) and the ratio judged / unjudged."""
    store = Store(folder / "confidence.db")
    import_jsonl(store, RECORDINGS)
    index = folder / "index"
    build_index(store, Resolver(store, index_dir=None).tool_schema, directory=index)
    learn(store, index)
    judged = Resolver(store, index_dir=index)
    unjudged = Resolver(store, index_dir=index)
    unjudged.confidence = Unjudged()  # type: ignore[assignment]
    calls = _exact_hits(judged)
    for resolver in (judged, unjudged):  # warm: key caches, tool states, judged exact hits
        _round(resolver, calls)
    best = {"judged": float("inf"), "unjudged": float("inf")}
    for _ in range(ROUNDS):
        for name, resolver in (("judged", judged), ("unjudged", unjudged)):
            best[name] = min(best[name], _round(resolver, calls) * 1e6)
    store.close()
    return {**best, "ratio": best["judged"] / best["unjudged"], "calls": float(len(calls))}


def main() -> None:
    """Print the exact hit's cost with and without the confidence, and the ratio."""
    folder = Path(tempfile.mkdtemp(prefix="replay-sim-bench-"))
    try:
        found = measure(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    verdict = "met" if found["ratio"] <= TARGET else "MISSED"
    print(
        f"   exact hit, Resolver.resolve_now ({found['calls']:.0f} calls x {REPEATS}, best median of "
        f"{ROUNDS} interleaved rounds): judged {found['judged']:.1f} µs, unjudged "
        f"{found['unjudged']:.1f} µs, ratio {found['ratio']:.3f} (target <= {TARGET}: {verdict})"
    )


if __name__ == "__main__":
    main()
