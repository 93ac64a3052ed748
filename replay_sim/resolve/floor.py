"""The exact-repeat floor: what an exact-match cache answers right that replay-sim refuses, and why.

An exact cache serves the first recording of a call's key whatever happened before; it is wrong
where state matters, and right on most exact repeats. Replay-sim serves a recording only to an
episode in the state it was made from, so an exact repeat recorded after a call of a tool of
unknown effect (treated as a state change) is refused to an episode that did not make that call.
:func:`exact_floor` counts, on probes with live truth, the steps the exact cache answers right and
replay-sim refuses, by what blocks them: the tools of unknown effect in the recording's state —
each settled by declaring it (``read_only`` in the matching config) or by ``replay-sim explore``
on a sandbox — the episode's own earlier unrecorded state change, or another reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from replay_sim.canonical import call_identity, call_key
from replay_sim.effects import Effect
from replay_sim.resolve.evaluate import Probe, truth_of
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.sessionless import state_dependence
from replay_sim.resolve.toolstate import answer_of

__all__ = ["exact_floor", "render_floor"]

DIVERGED_EPISODE = "the episode's earlier state change no recording answered"


def exact_floor(resolver: Resolver, probes: Sequence[Probe], *, sessionless: bool = False) -> Counter[str]:
    """Steps the exact cache answers right and replay-sim refuses, counted by what blocks them.

    Args:
        resolver: The replay-sim resolver (its store holds the recordings).
        probes: Probes with live truth.
        sessionless: Replay-sim as a request with no episode and no session meets it.

    Returns:
        ``"unknown effect: SERVER/TOOL"`` (one count per blocking tool), ``DIVERGED_EPISODE`` or
        ``"other: REASON"`` -> steps; ``"total"`` -> steps refused.
    """
    lookup = resolver.lookup
    floor: Counter[str] = Counter()
    for probe in probes:
        history: list[str] = []
        for step in probe.steps:
            method, params = step["method"], step["params"]
            name, arguments = call_identity(method, params)
            cached = resolver.store.recordings(key=call_key(probe.server, method, name, arguments), limit=1)
            found = resolver.resolve(probe.server, method, params, () if sessionless else history)
            if sessionless:
                found = state_dependence(resolver, probe.server, method, name, arguments, found) or found
            history.append(found.step)
            if found.hit or not cached or answer_of(cached[0]) != truth_of(step):
                continue
            floor["total"] += 1
            blocking = sorted(
                {
                    f"unknown effect: {probe.server}/{rec.name}"
                    for key in lookup.state_of(cached[0])
                    for rec in lookup.by_key(key)[:1]
                    if lookup.effect(probe.server, rec.name).effect is Effect.UNKNOWN
                }
            )
            if blocking:
                floor.update(blocking)
            elif lookup.trail(history[:-1]).diverged:
                floor[DIVERGED_EPISODE] += 1
            else:
                floor[f"other: {(found.reason or found.tier.value).split(',')[0][:90]}"] += 1
    return floor


def render_floor(floor: Counter[str]) -> str:
    """The floor as lines: the total, then each blocker, most first."""
    lines = [f"exact repeats the exact cache answers right and replay-sim refuses: {floor['total']}"]
    lines += [f"  {count}\t{why}" for why, count in floor.most_common() if why != "total"]
    return "\n".join(lines)
