"""The exploration ledger: which variant calls a store's recordings show were already asked.

The recorder's explorer (:mod:`replay_sim.record.explore`) asks a real server variants of a
read-only call — the call with one argument spelled otherwise (:mod:`replay_sim.variants`) — until
the answers settle each difference, within a budget. What it has asked is not kept anywhere but
in the recordings themselves: every variant is recorded (origin ``explore``) right after the call
it varies, in the same session, with nothing that changes state in between. So the ledger is
derived, not stored: one home of truth, and a store imported from JSONL or merged from several
recorders carries its ledger with it.

A recorded call ``V`` of origin ``explore`` is a variant of ``O`` when ``O`` is the nearest earlier
call of the same tool in ``V``'s session, looking back over explore calls only (and the one client
call before them), that succeeded, and from whose arguments one :class:`~replay_sim.variants.Transform`
of one argument makes ``V``'s arguments (``Transform.vary_call`` with the tool's listed schema).
Effect probes (the call itself asked again, earlier reads) vary nothing and are not variants.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.store.records import Origin, Recording
from replay_sim.store.store import Store
from replay_sim.variants import Transform

__all__ = ["Asked", "explored"]

_LOOK_BACK = 256  # explore calls between a variant and its original, at most (a session's explore burst)


@dataclass(frozen=True, slots=True)
class Asked:
    """One recorded variant call and the call it varied (both from one state)."""

    tool: str
    argument: str
    transform: Transform
    original: Recording
    variant: Recording


def explored(
    store: Store, server: str, schemas: Mapping[str, dict[str, Any]] | None = None
) -> Iterator[Asked]:
    """Every recorded variant call of ``server``'s tools, with the call it varied, in recorded order.

    Args:
        store: The recording store.
        server: Recorded server name.
        schemas: Tool name -> listed ``inputSchema`` (the variants were made with it; default: the
            store's recorded ``tools/list`` of ``server``).
    """
    if schemas is None:
        schemas = _listed(store, server)
    sessions: dict[str, list[Recording]] = defaultdict(list)
    explores = False
    for rec in store.recordings(server, method="tools/call"):
        if rec.session is not None:
            sessions[rec.session].append(rec)
            explores = explores or rec.origin == Origin.EXPLORE
    if not explores:
        return
    for calls in sessions.values():
        calls.sort(key=lambda r: (r.seq or 0, r.id))
        for i, rec in enumerate(calls):
            if rec.origin != Origin.EXPLORE:
                continue
            found = _original(calls, i, schemas.get(rec.name))
            if found is not None:
                original, argument, transform = found
                yield Asked(rec.name, argument, transform, original, rec)


def _original(
    calls: list[Recording], i: int, schema: dict[str, Any] | None
) -> tuple[Recording, str, Transform] | None:
    """The call ``calls[i]`` varies, and how; None when it varies none (an effect probe)."""
    variant = calls[i]
    wanted = canonical_json(variant.arguments)
    for j in range(i - 1, max(-1, i - 1 - _LOOK_BACK), -1):
        before = calls[j]
        if before.name == variant.name and not before.failed:
            for argument in before.arguments:
                for transform in Transform:
                    varied = transform.vary_call(before.arguments, argument, schema)
                    if varied is not None and canonical_json(varied) == wanted:
                        return before, argument, transform
        if before.origin != Origin.EXPLORE:
            return None  # the client's call: nothing before it was asked with this variant
    return None


def _listed(store: Store, server: str) -> dict[str, dict[str, Any]]:
    tools = (store.listings(server).get("tools/list") or {}).get("tools")
    found: dict[str, dict[str, Any]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            schema = tool.get("inputSchema")
            found[tool["name"]] = schema if isinstance(schema, dict) else {}
    return found
