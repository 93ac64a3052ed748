"""A store's tool effects: every tool's verdict on a recorded server, and keeping them in the store.

Which tools change state decides which recordings were made from an episode's state
(:mod:`replay_sim.resolve.lineage`). A tool's effect is declared (the matching config, the listed
annotations) or learned from the recordings by :func:`replay_sim.effects.learn`; this module reads
what it learns from out of a store (:func:`recorded_effects`), and keeps the verdicts in the
store's meta so that a replay reads them back instead of learning them on every start
(:func:`remembered_effects`, :func:`keep_effects`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from replay_sim.canonical import answer_text
from replay_sim.effects import Declaration, Effect, Learner, Verdict, declare, kind_of
from replay_sim.errors import StoreError
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.effectcalls import dry_run, server_runs
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.schema import ToolSchema
from replay_sim.store import Store
from replay_sim.store.derived import PerServer

__all__ = [
    "EFFECTS_META_PREFIX",
    "blockers",
    "dry_run",
    "keep_effects",
    "recorded_effects",
    "remembered_effects",
    "store_effects",
]

EFFECTS_META_PREFIX = "effects:"
"""Meta key prefix (then the server's name) of the verdicts a store keeps (:func:`remembered_effects`)."""


def recorded_effects(
    store: Store, server: str, schema: Callable[[str, str], Any], config: MatchConfig | None = None
) -> dict[str, Verdict]:
    """Every tool's effect on one recorded server, declared or learned (:func:`replay_sim.effects.learn`).

    Args:
        store: The recording store.
        server: Recorded server name.
        schema: ``(server, tool) -> ToolSchema | None`` (annotations).
        config: The matching config, whose ``read_only`` overrides any annotation or evidence.

    Returns:
        Verdicts by tool name: every listed tool and every tool recorded.
    """
    return _learned(store, server, schema, config or MatchConfig())[0]


def _learned(
    store: Store, server: str, schema: Callable[[str, str], Any], config: MatchConfig
) -> tuple[dict[str, Verdict], dict[str, Declaration]]:
    """:func:`recorded_effects`, and the declarations they were learned with."""
    learner, lock = _learners.of(store, server)  # each batch of answers is judged alone
    with lock:  # runs read in one order are judged in it: a later read extends an earlier one
        runs, called = server_runs(store, server)  # each call read and derived once per store
        declared = _declarations(server, called, schema, config)
        return learner.learn(runs, declared), declared


_learners: PerServer[tuple[Learner, threading.Lock]] = PerServer(lambda: (Learner(), threading.Lock()))


def _declarations(
    server: str, called: Iterable[str], schema: Callable[[str, str], Any], config: MatchConfig
) -> dict[str, Declaration]:
    """The declared effect of every tool called or listed (every listed tool gets a verdict)."""
    names = set(called)
    listed = getattr(schema, "tools", None)
    if callable(listed):
        names |= set(listed(server) or ())
    declared: dict[str, Declaration] = {}
    for name in names:
        tool = schema(server, name)
        declared[name] = declare(
            None if tool is None else tool.annotations, config.override(server, name).read_only
        )
    return declared


@functools.cache
def _learner() -> str:
    """A digest of the code that decides a verdict ("" when it cannot be read: nothing is kept).

    Kept verdicts learned by other code are learned again, so a change of what the evidence
    means never leaves a store answering with verdicts the running code would not reach.
    """
    digest = hashlib.sha256()
    try:
        # The modules' source, named (a function may be wrapped): the calls' reading, deriving and judging.
        for module in (answer_text.__module__, ToolSchema.__module__, server_runs.__module__, __name__):
            digest.update(Path(str(sys.modules[module].__file__)).read_bytes())
        for source in sorted(Path(str(sys.modules["replay_sim.effects"].__file__)).parent.glob("*.py")):
            digest.update(source.read_bytes())  # the effects package: every module of it
    except (OSError, KeyError):
        return ""
    return digest.hexdigest()[:16]


def _declared_json(declared: dict[str, Declaration]) -> dict[str, list[Any]]:
    return {t: [str(d.effect), d.fixed, d.source, d.reason] for t, d in sorted(declared.items())}


def remembered_effects(
    store: Store,
    server: str,
    schema: Callable[[str, str], Any],
    config: MatchConfig | None = None,
    *,
    wait: bool = False,
) -> dict[str, Verdict]:
    """:func:`recorded_effects`, kept in the store's meta: learned once per state of the store.

    The verdicts kept under :data:`EFFECTS_META_PREFIX` + ``server`` are used when nothing they
    were learned from moved: the server's calls (append-only: their fingerprint), every tool's
    declaration (listings and the matching config) and the code that learns them. Otherwise they
    are learned again, and kept when the store is writable and no other process is writing it
    (a server never waits to keep them; with ``wait``, another writer's lock is waited for).

    Args and returns: as :func:`recorded_effects`.
    """
    config = config or MatchConfig()
    learner = _learner()
    basis = store.fingerprint(server)  # read before the calls: calls added meanwhile leave it stale
    key = EFFECTS_META_PREFIX + server
    kept: Any = store.meta(key) if learner else None
    try:
        if kept["calls"] == basis and kept["learner"] == learner:
            declared = _declared_json(_declarations(server, kept["declared"], schema, config))
            if declared == kept["declared"]:
                return {t: Verdict.from_dict(v) for t, v in kept["verdicts"].items()}
    except (KeyError, TypeError, ValueError):
        pass  # nothing kept, or not in this form: learned again
    verdicts, declarations = _learned(store, server, schema, config)
    if learner and not store.readonly:
        entry = {
            "calls": basis,
            "learner": learner,
            "declared": _declared_json(declarations),
            "verdicts": {t: v.as_dict() for t, v in verdicts.items()},
        }
        with contextlib.suppress(StoreError):  # another process is writing: learned again next time
            store.set_meta(key, entry, wait=wait)
    return verdicts


def keep_effects(store: Store, config: MatchConfig | None = None) -> None:
    """Learn every recorded server's tool effects and keep them in the store (:func:`remembered_effects`).

    ``replay-sim index build``, ``import`` and ``snapshot freeze`` call it, so a replay started
    after them — or serving the store meanwhile — reads the verdicts back instead of learning them
    (0.25 s a 10,000-call server). Verdicts kept already and still current are left as they are;
    another writer's lock is waited for. Called within a transaction, they are kept in its commit.

    Args:
        store: The recording store; a read-only one keeps nothing.
        config: The matching config the replay will be served with (another one learns again).
    """
    if store.readonly:
        return
    schemas = RecordedSchemas(store, config)
    servers = {s.name for s in store.servers()} | {server for server, _, _ in store.names()}
    for server in sorted(servers):
        remembered_effects(store, server, schemas, config, wait=True)


def store_effects(store: Store, config: MatchConfig | None = None) -> dict[str, dict[str, Verdict]]:
    """Every recorded server's tools and their effects (:func:`recorded_effects`), by server name."""
    schemas = RecordedSchemas(store, config)
    servers = sorted({s.name for s in store.servers()} | {row["server"] for row in store.stats()})
    return {server: recorded_effects(store, server, schemas, config) for server in servers}


def blockers(store: Store, effects: dict[str, dict[str, Verdict]]) -> list[tuple[str, str, int]]:
    """The tools (or a tool's kinds of call: ``query [select]``) of unknown effect that block the most
    recorded answers, most first.

    A recording made after a call of a tool of unknown effect in its session is served only to an
    episode that made the same calls (and never to a request with no history): the tool counts as
    changing state until evidence settles it.

    Args:
        store: The recording store.
        effects: Every server's tool effects (:func:`store_effects`).

    Returns:
        ``(server, tool, recorded answers made after one of its calls)``, most first.
    """
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for server, verdicts in effects.items():
        unknown = {
            t: v
            for t, v in verdicts.items()
            if v.effect is Effect.UNKNOWN or any(k.effect is Effect.UNKNOWN for _, k in v.kinds)
        }
        if not unknown:
            continue
        sessions: dict[Any, list[tuple[int, int, str | None, bool]]] = defaultdict(list)
        for rid, method, name, _, arguments, result, error, session, seq in store.outcomes(server):
            failed = error is not None or bool((result or {}).get("isError"))
            blocker = None  # the tool (or the tool's kind of call: `query [select]`) of unknown effect
            if method == "tools/call" and not failed and not dry_run(name, arguments) and name in unknown:
                kind = kind_of(arguments) if unknown[name].kinds else None
                if unknown[name].of_kind(kind).effect is Effect.UNKNOWN:
                    blocker = name if unknown[name].of_kind(kind) is unknown[name] else f"{name} [{kind}]"
            sessions[session if session is not None else ("", rid)].append((seq or 0, rid, blocker, failed))
        for calls in sessions.values():
            before: set[str] = set()
            for _, _, blocker, failed in sorted(calls, key=lambda c: (c[0], c[1])):
                if not failed:
                    for tool in before:
                        counts[(server, tool)] += 1
                if blocker is not None:
                    before.add(blocker)
    return sorted(((s, t, n) for (s, t), n in counts.items()), key=lambda row: (-row[2], row[0], row[1]))
