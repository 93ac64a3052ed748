"""Calls with no history: answered only where the answer is shown not to depend on state.

A request with no episode and no session (the MCP SDK client's default, 2026-07-28 era over HTTP)
is resolved as if from the initial state. That is right only when the state cannot matter, and the
recordings must *show* it, because the client may have changed the state with calls the replay could
not tie to this one (its own write was a miss, or went to another replica). A recorded answer is
served without a history when

- no tool of its server may change state (declared or learned: :mod:`replay_sim.effects`), or
- its recordings were made from at least two different states (different state-changing calls
  before them in their sessions) and all agree.

Recordings that all come from one state agree trivially: they show nothing about another state.
Otherwise the call is a miss; the replay server adds how to give requests a history.
"""

from __future__ import annotations

import json
from typing import Any

from replay_sim.protocol import is_client_request
from replay_sim.resolve.resolution import Candidate, Problem, Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Recording

__all__ = ["NO_HISTORY", "state_dependence"]

NO_HISTORY = "and this request has no episode id and no MCP session"


def state_dependence(
    resolver: Resolver, server: str, method: str, name: str, arguments: dict[str, Any], resolution: Resolution
) -> Resolution | None:
    """The miss for a call with no history whose answer is not shown independent of state, else None.

    Refusals (an unknown tool, invalid arguments) are answered as usual.

    Args:
        resolver: The resolver that resolved the call (its state lookup and recorded schemas).
        server: Recorded server name.
        method: The MCP method called.
        name: The tool, prompt or resource the call asked for.
        arguments: The call's (redacted) arguments.
        resolution: How the call was resolved from the initial state.

    Returns:
        A miss whose reason says why the state matters (without the fix, which the caller names),
        or None when the call can be answered without a history.
    """
    if resolution.problem in (Problem.UNKNOWN_TOOL, Problem.INVALID_ARGUMENTS):
        return None
    what = f"{method} {name!r}"
    recording = resolution.recording
    candidates = resolution.candidates
    lookup = resolver.lookup
    if resolution.problem == Problem.OTHER_STATE:
        why = f"{what} was recorded only after state changes, {NO_HISTORY} to say if this client made them"
    elif recording is None:
        schema = resolver.tool_schema(server, name) if method == "tools/call" else None
        if schema is None or not lookup.changes_state(server, name, arguments):
            return None
        why = f"{what} may change the server's state, {NO_HISTORY} to keep that change in"
    else:
        # Every recording of the call answered and of the one asked for (a canonical hit's differ).
        same = [*lookup.by_key(recording.key), *lookup.by_key(resolution.key)]
        group = list({r.id: r for r in same}.values())
        candidates = [Candidate(r.id, resolution.score) for r in group[:3]]
        states = {lookup.state_of(r) for r in group}
        if lookup.is_mutating(recording.key):
            why = f"{what} may change the server's state, {NO_HISTORY} to keep that change in"
        elif _disagree(group):
            ids = ", ".join(f"#{r.id}" for r in group)
            why = (
                f"the recordings of {what} ({ids}) answer differently at different points of their "
                f"sessions, {NO_HISTORY} to say which point this client is at"
            )
        elif len(states) >= 2 or not any(v.changes_state for v in lookup.effects(server).values()):
            return None
        else:
            changing = sorted(t for t, v in lookup.effects(server).items() if v.changes_state)
            why = (
                f"every recording of {what} was made from one state, which shows nothing about its "
                f"answer after {server}'s tools that may change state ({', '.join(changing[:5])}) — "
                f"{NO_HISTORY} to say which state this client is in"
            )
    return Resolution(Tier.MISS, 0.0, candidates=candidates, key=resolution.key, reason=why)


def _disagree(recordings: list[Recording]) -> bool:
    """Whether recordings of one call, made for clients asked and answering alike, got different answers.

    A server answers a client it could ask (sampling, elicitation) otherwise than one it could
    not, and after one answer otherwise than after another: those differences are the client's
    (the replay's conversation picks by them), not the state's. ``_meta`` aside.
    """
    answers: dict[str, tuple[Any, Any]] = {}
    for r in recordings:
        asked = (
            json.dumps([m for m in r.notifications if is_client_request(m)], sort_keys=True)
            if r.notifications
            else ""
        )
        result = {k: v for k, v in r.result.items() if k != "_meta"} if r.result is not None else None
        if answers.setdefault(asked, (result, r.error)) != (result, r.error):
            return True
    return False
