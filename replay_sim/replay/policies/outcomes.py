"""What a sandbox call resolves to: its instance's answer, or the miss served instead, saying why.

A sandbox answer is served as the real server's (tier ``sandbox``, its instance, latency and
re-played calls in the provenance). A call the real server was to answer but did not (no instance
could be had, it failed, it was cut) is a miss; one that reached no instance the episode keeps and
may change state leaves the episode's state there unknown.
"""

from __future__ import annotations

from replay_sim.canonical import call_identity
from replay_sim.replay.core.misses import Miss
from replay_sim.resolve.lineage import DIVERGED, StateLookup
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.store import Recording

__all__ = ["answered", "missed"]


def answered(
    lookup: StateLookup, miss: Miss, recording: Recording, instance: str, replayed: int, *, readonly: bool
) -> Resolution:
    """The resolution of a call its sandbox instance answered (``recording``, as it will be written).

    ``readonly``: the store is read-only (answers go to a side store the resolver cannot see).
    """
    step = recording.key
    if readonly and lookup.may_change(miss.server, recording.name, recording.arguments):
        # The resolver cannot see the side store: the episode's state is its instance's from here
        # (a failed call too: on a sandbox server every call not declared read-only is state).
        step = DIVERGED + step
    return Resolution(
        Tier.SANDBOX,
        1.0,
        recording,
        miss.resolution.candidates,
        reason=f"answered by sandbox instance {instance} of the real server",
        key=miss.resolution.key,
        step=step,
        sandbox={"instance": instance, "latency_ms": recording.latency_ms, "replayed": replayed},
    )


def missed(lookup: StateLookup, miss: Miss, why: str, *, unmade: bool = False) -> Resolution:
    """The miss to serve instead: the resolver's (its state-changing step marked), saying why.

    ``unmade``: the call reached no instance the episode keeps (none could be had, or it was
    ended). The episode sent it, so one that may change state leaves the episode's state there
    unknown (its later calls miss, never answered from a state that ignores it).
    """
    resolution = miss.resolution
    step = resolution.step or resolution.key
    if resolution.hit or unmade:  # not made, or made with no answer: what state follows is unknown
        _, arguments = call_identity(miss.method, miss.params)
        name = str(miss.params.get("name", ""))
        changes = miss.method == "tools/call" and lookup.may_change(miss.server, name, arguments)
        step = DIVERGED + resolution.key if changes else "" if unmade else resolution.key
    reason = f"{resolution.reason}; {why}".lstrip("; ") if not resolution.hit else why
    return Resolution(
        Tier.MISS,
        0.0,
        None,
        resolution.candidates,
        reason,
        resolution.key,
        resolution.problem,
        step,
        sandbox={"answered": False},  # the real server was to answer: its miss says why, not "go live"
    )
