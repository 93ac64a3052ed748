"""Why a call misses: the reason a miss gives, and the recordings nearest to it.

A miss must be diagnosable: it names what differs (identifiers, free text too far or shaped like
code, a threshold without evidence, a schema violation, another state) and lists the nearest
recordings with the fields that differ. The resolver's tiers decide; this module explains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from replay_sim.canonical import normalize
from replay_sim.errors import ReplaySimError
from replay_sim.resolve.dialect import Judgement
from replay_sim.resolve.embedding import Embedder
from replay_sim.resolve.index import IndexSet, call_text
from replay_sim.resolve.resolution import Candidate, FieldDiff, Problem, Resolution, Tier
from replay_sim.resolve.toolstate import ToolState, field_diffs
from replay_sim.store import Recording

__all__ = [
    "differences_from",
    "miss_reason",
    "near_misses",
    "strict_miss",
    "structural_miss",
    "violation_reason",
]


def miss_reason(
    state: ToolState, normalised: dict[str, Any], what: str, index: Callable[[], IndexSet]
) -> str:
    """Why no recording of a known tool answers: other identifiers, or free text too far."""
    if not state.group(normalised):
        return f"no recording of {what} has these identifiers and values"
    same = sorted(k for k in normalised if k not in state.free_text)
    recorded = f"recordings of {what}" + (f" with the same {', '.join(same)}" if same else "")
    if state.semantic and (code := state.code_text(normalised)):
        return (
            f"{recorded} differ in {', '.join(code)}, which must match exactly: it is shaped like "
            "code (SQL, an expression, a pattern or a path), whose smallest change can flip the answer"
        )
    if not state.semantic:  # free text compared exactly: say why
        if state.echoed:
            why = f"the tool echoes {', '.join(sorted(state.echoed))} in its answers"
        elif not state.schema.read_only:
            why = "the tool changes state"
        else:
            why = "the matching config turns meaning-matching off for it"
        return f"{recorded} differ in free text, which must match exactly: {why}"
    try:
        threshold = state.threshold(index())
    except ReplaySimError as exc:
        return f"{recorded} differ in free text; {exc}"
    calibration = state.calibration
    if calibration is not None and not calibration.calibrated and state.override.threshold is None:
        return (
            f"{recorded} differ in free text, and there is no recorded evidence to calibrate "
            f"{state.schema.name}'s threshold: {calibration.near} pair(s) of its recordings with "
            f"different free text and different answers lie within {calibration.band:g} below it "
            f"({calibration.needed} needed), so it is not compared by meaning"
        )
    if threshold > 1.0:
        return f"{recorded} differ in free text, which must match exactly for this tool"
    return f"{recorded} differ in free text by more than the tool's threshold ({threshold:.3f})"


def structural_miss(
    tools: Mapping[str, Any] | None,
    server: str,
    method: str,
    name: str,
    key: str,
    exact: Sequence[Recording],
    what: str,
) -> Resolution:
    """A miss outside the tools/call tiers: resources, prompts, completions, unknown tools."""
    if exact:
        return Resolution(
            Tier.MISS, 0.0, key=key, problem=Problem.OTHER_STATE, step=key,
            reason=f"{what} was recorded, but only after state changes this episode did not make",
        )  # fmt: skip
    if method == "tools/call":
        if tools is None:
            reason = f"unknown tool {name!r}: server {server!r} has no recorded tools/list"
        else:
            known = ", ".join(sorted(tools)) or "none"
            reason = f"unknown tool {name!r} on {server!r} (recorded tools: {known})"
        return Resolution(Tier.MISS, 0.0, key=key, reason=reason, problem=Problem.UNKNOWN_TOOL, step=key)
    reason = f"no recording of {what} (exact match only for {method})"
    return Resolution(Tier.MISS, 0.0, key=key, reason=reason, step=key)


def strict_miss(what: str, key: str, step: str, *, recorded: bool) -> Resolution:
    """The miss of a call on a server a sandbox runs: no canonical or semantic tier is tried.

    Those tiers answer from recordings of *other* calls, trusting what the recordings show the tool
    ignores; with the real server at hand, its own answer is the faithful one.
    """
    if recorded:
        reason = f"{what} was recorded, but not from the state this episode is in"
        return Resolution(Tier.MISS, 0.0, None, [], reason, key, Problem.OTHER_STATE, step)
    reason = f"no recording of {what} with these arguments (a sandbox answers it: no near match is used)"
    return Resolution(Tier.MISS, 0.0, None, [], reason, key, step=step)


def near_misses(
    state: ToolState,
    normalised: dict[str, Any],
    index: Callable[[], IndexSet],
    embedder: Embedder,
    k: int = 3,
) -> list[Candidate]:
    """The ``k`` recordings of the tool nearest to the call, with the fields that differ."""
    if not state.recordings:
        return []
    try:
        vectors = index()
        vector = embedder.encode([call_text(normalised, state.free_text)])[0]
        scored = vectors.search(state.server, state.schema.name, vector, k)
    except ReplaySimError:
        scored = state.lexical_nearest(normalised, k)
    return [
        Candidate(
            rid,
            round(score, 6),
            [FieldDiff(*d) for d in field_diffs(state.normalised[rid], normalised)],
            private=rid in state.private,
        )
        for rid, score in scored
        if rid in state.normalised
    ]


def violation_reason(judgement: Judgement, what: str) -> str:
    """Why a call whose arguments violate the inputSchema is not answered from other recordings."""
    refusal = judgement.refusal
    if refusal is not None:
        shown = (
            ""
            if judgement.refused_by is None
            else f" (recording #{judgement.refused_by.id} shows it refused)"
        )
        return f"arguments of {what} violate its inputSchema: {refusal.describe()}{shown}"
    return (
        f"no recording of {what} with these arguments, which may violate its inputSchema "
        f"({judgement.describe()}): servers coerce or refuse such values and no recording shows what "
        "this one does, so only a recording of this very call answers it"
    )


def differences_from(recording: Recording, arguments: dict[str, Any]) -> list[FieldDiff]:
    """The arguments in which a recording answering a call differs from it, as sent."""
    return [FieldDiff(*d) for d in field_diffs(normalize(recording.arguments), normalize(arguments))]
