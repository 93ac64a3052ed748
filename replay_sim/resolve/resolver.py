"""The resolver: which recording answers a call (exact → canonical → semantic → miss).

On a server a sandbox runs (:attr:`~replay_sim.resolve.lineage.StateLookup.strict`) only the
exact tier answers, from exactly the episode's state; every other call goes to the sandbox. The
tiered lookup (its answers are :mod:`replay_sim.resolve.resolution` types):

1. **exact** — the call's key equals a recorded call's key;
2. **canonical** — equal after normalising the arguments against the tool's inputSchema;
3. **semantic** — same tool, every identifier argument equal after normalisation, free text
   close by embedding cosine above the tool's calibrated threshold (read-only tools only: a
   state-changing call answered "by meaning" would leave the replayed state unknowable);
4. **miss** — with the three nearest recordings and the fields that differ.

Every hit must also come from the right *state*: a recording is eligible only when the
state-changing calls made before it in its recorded session equal those this episode made (see
:mod:`replay_sim.resolve.lineage`). Among eligible recordings the one whose session prefix best matches
the episode's history wins; ties go to the earliest, so the same call sequence always yields the
same answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from replay_sim.canonical import call_identity, call_key
from replay_sim.errors import ReplaySimError, StoreError
from replay_sim.resolve.build import LiveIndex
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.judge import Confidence
from replay_sim.resolve.embedders import index_embedder
from replay_sim.resolve.embedding import MAX_TEXT_CHARS, CachedEmbedder, Embedder
from replay_sim.resolve.index import DEFAULT_INDEX_DIR, IndexSet, call_text
from replay_sim.resolve.lineage import DIVERGED, StateLookup, Trail
from replay_sim.resolve.reasons import (
    differences_from,
    miss_reason,
    near_misses,
    strict_miss,
    structural_miss,
    violation_reason,
)
from replay_sim.resolve.resolution import Problem, Resolution, Tier
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.toolstate import ToolState
from replay_sim.resolve.toolstates import Deferred, ToolStates
from replay_sim.resolve.warmup import Warmup
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store
from replay_sim.store.changes import Mark, changes_since

__all__ = ["Resolver"]

_RECORDED_NOW = frozenset({Tier.LIVE, Tier.SANDBOX, Tier.SYNTHETIC})
"""Tiers whose recording the miss policy has just stored."""


class Resolver:
    """Answers calls from a store.

    Args:
        store: The recording store.
        config: Matching config (thresholds, per-tool overrides); defaults apply when None.
        embedder: Embedding model for the semantic tier (default: the model the index in
            ``index_dir`` names, else the packaged MiniLM; loaded lazily).
        index_dir: Where the vector index lives; None keeps it in memory.
        semantic: Enable the semantic tier.
        canonical: Enable the canonical tier.
        auto_index: Build or update a missing/stale index on first need; when False a missing or
            stale index is a :class:`~replay_sim.errors.VectorIndexError` (reported in the miss reason).
        cache_size: Entries of the in-memory exact-key cache.
        min_confidence: The operating point (:mod:`replay_sim.resolve.confidence`): answers whose
            learned confidence is below it miss, candidates at or above it are served; None keeps
            the matching config's, and without either the strict tiers decide alone.
    """

    def __init__(
        self,
        store: Store,
        *,
        config: MatchConfig | None = None,
        embedder: Embedder | None = None,
        index_dir: Path | None = DEFAULT_INDEX_DIR,
        semantic: bool = True,
        canonical: bool = True,
        auto_index: bool = True,
        cache_size: int = 65536,
        min_confidence: float | None = None,
    ) -> None:
        self.store = store
        self.config = config or MatchConfig()
        self._embedder = embedder
        self._cached: CachedEmbedder | None = None
        self.semantic = semantic and self.config.semantic
        self.canonical = canonical
        self.schemas = RecordedSchemas(store, self.config)
        self.lookup = StateLookup(store, self.schemas, cache_size, self.config)
        self.live_index = LiveIndex(store, self.schemas, index_dir, auto_build=auto_index)
        self._version: Mark | None = None
        self._builder: CachedEmbedder | None = None
        self.warmup = Warmup(self._warm_up)
        self.tool_states = ToolStates(
            store, self.config, self.lookup.state_of, self.warmup.need, self.version
        )
        self.confidence = Confidence.load(index_dir, self.config, min_confidence)

    # -- caches -----------------------------------------------------------------------------

    def catch_up(self) -> None:
        """Forget store-derived caches that calls added since (by this process or another) touch.

        Run on each resolve; also in a writer's thread, right after it appends (off the answer path),
        so that the next call finds nothing to forget.

        Another process may be recording into the served store: a commit of its calls makes the
        tools, keys and sessions it touched be read again, not every tool's state
        (:func:`~replay_sim.store.changes.changes_since`); a change of anything else, or of what
        is learned of the tools' effects, forgets everything (a stale cache would be a wrong answer).
        """
        try:
            self._version, appended = changes_since(self.store, self._version)
        except StoreError:  # a closed store: keep serving from what is cached
            return
        if appended is not None:
            with contextlib.suppress(StoreError):  # else: forget everything
                if not appended or self.lookup.forget(appended):
                    self.tool_states.forget(appended.tools)
                    return
        self.schemas.clear()
        self.tool_states.forget()
        self.lookup.clear()

    def version(self) -> Mark | None:
        """The store's version as this resolver last read it (what its caches hold)."""
        return self._version

    @property
    def embedder(self) -> CachedEmbedder:
        """The query embedder: the model behind a bounded in-memory cache that also reads the store's.

        Query embeddings are never written to the store (serving writes nothing); an embedder
        given as a :class:`CachedEmbedder` is used as it is. Without one, queries are embedded by
        the model the persisted index names (:func:`~replay_sim.resolve.embedders.index_embedder`).

        Raises:
            VectorIndexError: The index names a model this replay-sim does not know.
        """
        if self._cached is None:
            given = self._embedder
            self._cached = (
                given
                if isinstance(given, CachedEmbedder)
                else CachedEmbedder(
                    given or index_embedder(self.live_index.directory), self.store, store_writes=False
                )
            )
        return self._cached

    def tool_schema(self, server: str, tool: str) -> ToolSchema | None:
        """The recorded schema of a tool, or None when unknown.

        Config overrides are applied, and ``read_only`` says what the tool's effect is, declared or
        learned from the recordings (:meth:`~replay_sim.resolve.lineage.StateLookup.effects`).
        """
        schema = self.schemas(server, tool)
        return None if schema is None else self.lookup.effective(server, schema)

    def index(self) -> IndexSet:
        """The vector index, current with the store (built or updated if needed and allowed).

        Raises:
            VectorIndexError: The index is missing or stale and ``auto_index`` is False.
        """
        self.warmup.need()
        if self._builder is None:  # an index build caches the recordings' embeddings in the store
            self._builder = self.embedder.writing()
        return self.live_index.current(self._builder)

    @property
    def model_loaded(self) -> bool:
        """Whether the embedding model is loaded (an embedder that says nothing of it counts as loaded)."""
        model = self._embedder if self._cached is None else self._cached.embedder
        if model is None:
            return False  # the default model, not even asked for yet
        return bool(getattr(model, "loaded", True))

    def warm(self, *, wait: bool = True, then: Callable[[], None] | None = None) -> None:
        """Load the vector index in a background thread (building it first if it must).

        Exact hits need nothing else. A tool's first canonical or semantic call builds that tool's
        matching state (its canonical forms and calibrated threshold, :class:`ToolState`) and the
        first call that embeds a query loads the model (seconds), each in that call's worker
        thread (see :meth:`resolve_now`), never on an event loop. An index that must be built
        first loads the model to embed the recordings. Started once; later calls only wait.

        Args:
            wait: Return only once it is done.
            then: Called once it is done (in its thread; at once when it is done already).
        """
        self.warmup.start(then)
        if wait:
            self.warmup.wait()

    def _warm_up(self) -> None:
        # Only the index — not the model (the first call that embeds a query loads it) nor the tools'
        # matching state (:meth:`tool_state`) — and not even that when a sandbox answers every
        # recorded server's calls no recording does (none of them needs an embedding).
        if not self.semantic:
            return
        try:
            strict = self.lookup.strict
            if strict and {server for server, _, _ in self.store.names()} <= strict:
                return
            self.index()
        except ReplaySimError:
            return  # reported on each call that needs the index, in its miss reason

    @property
    def prepared_tools(self) -> int:
        """How many tools' matching state (canonical forms, thresholds) is built so far."""
        return len(self.tool_states)

    def tool_state(self, server: str, tool: str, schema: ToolSchema) -> ToolState:
        """The tool's matching state (:class:`~replay_sim.resolve.toolstates.ToolStates`)."""
        return self.tool_states.get(server, tool, schema)

    # -- episodes ------------------------------------------------------------------------------

    def advance(self, trail: Trail, resolution: Resolution) -> None:
        """Add a resolved call to an episode's trail (what the next call is resolved against)."""
        if resolution.tier in _RECORDED_NOW:  # the store grew: its key may be cached as unrecorded
            self.catch_up()
        if resolution.step:
            recording, mutating = resolution.recording, None
            if resolution.tier is Tier.SANDBOX and recording is not None and recording.key == resolution.step:
                mutating = self.lookup.changed_by(recording)  # recorded off the answer path: maybe not yet
            self.lookup.advance(trail, resolution.step, mutating)

    # -- resolution ------------------------------------------------------------------------------

    def resolve_now(self, server: str, method: str, params: Any, history: Sequence[str] | Trail = (),
                    min_confidence: float | None = None) -> Resolution | None:  # fmt: skip
        """:meth:`resolve` of a call exact or canonical lookups settle, else None.

        An event loop answers those at once and hands every other call to a thread: one that needs
        what the warm-up (:meth:`warm`) still loads, one whose tool's matching state is not built
        yet (read from all the tool's recordings), and one that needs an embedding — a semantic
        match, or a miss's nearest recordings — whose cost grows with the call (a 4 MB miss must
        not hold up other sessions' hits).
        """

        def inline() -> Resolution | None:
            try:
                with self.tool_states.inline():
                    return self.resolve(server, method, params, history, min_confidence)
            except Deferred:
                return None

        return self.warmup.attempt(inline)

    def resolve(
        self,
        server: str,
        method: str,
        params: Any,
        history: Sequence[str] | Trail = (),
        min_confidence: float | None = None,
    ) -> Resolution:
        """Find the recording that answers a call.

        Args:
            server: Recorded server name.
            method: MCP method (``tools/call``, ``resources/read``, ``prompts/get``, ``completion/complete``).
            params: Request params, wire JSON (anything else is a miss, never an exception).
            history: The episode's trail, or its steps so far (``Resolution.step``), oldest first.
            min_confidence: This call's own operating point (a request's ``_meta``), if any.

        Returns:
            A :class:`Resolution`; ``tier`` is ``miss`` when nothing answers the call.
        """
        if not isinstance(params, dict):
            return Resolution(
                Tier.MISS, 0.0, reason="params must be a JSON object", problem=Problem.INVALID_ARGUMENTS
            )
        if method in ("tools/call", "prompts/get") and not isinstance(params.get("arguments") or {}, dict):
            return Resolution(
                Tier.MISS,
                0.0,
                reason=f"{method} arguments must be a JSON object",
                problem=Problem.INVALID_ARGUMENTS,
            )
        try:
            name, arguments = call_identity(method, params)
            key = call_key(server, method, name, arguments)
        except (ValueError, TypeError, RecursionError) as exc:
            return Resolution(
                Tier.MISS,
                0.0,
                reason=f"arguments are not valid JSON: {exc}",
                problem=Problem.INVALID_ARGUMENTS,
            )
        try:
            self.catch_up()  # before the trail: its steps are judged with what the store holds now
            trail = self.lookup.trail(history)
            found = self._resolve(server, method, name, arguments, key, trail)
            return self.confidence.judge(self, server, method, name, arguments, trail, found, min_confidence)
        except ReplaySimError as exc:
            return Resolution(Tier.MISS, 0.0, reason=str(exc), key=key)

    def _resolve(
        self, server: str, method: str, name: str, arguments: dict[str, Any], key: str, trail: Trail
    ) -> Resolution:
        what = f"{method} {name!r} on {server!r}"
        if trail.diverged:
            blamed = trail.blamed or "an earlier call that may change state"
            return Resolution(
                Tier.MISS, 0.0, key=key, problem=Problem.DIVERGED, step=DIVERGED + key,
                reason=f"no recording of {what} for this state: this episode's earlier call {blamed}, "
                "was never answered from a recording, so the server's state is unknown",
            )  # fmt: skip
        exact = self.lookup.by_key(key)
        if exact:
            chosen = self.lookup.choose(exact, trail)
            if chosen is not None:
                return Resolution(Tier.EXACT, 1.0, chosen, key=key, step=chosen.key)
        schema = self.tool_schema(server, name) if method == "tools/call" else None
        if method != "tools/call" or schema is None:
            return structural_miss(self.schemas.tools(server), server, method, name, key, exact, what)
        if server in self.lookup.strict:  # a sandbox can run it: only an exact repeat, never a guess
            step = DIVERGED + key if self.lookup.may_change(server, name, arguments) else key
            return strict_miss(what, key, step, recorded=bool(exact))
        state = self.tool_state(server, name, schema)
        # Schema violations the recordings do not show accepted: servers coerce or refuse them.
        judgement = state.evidence.judge(arguments)
        normalised = state.normalise(arguments)
        same_state_miss = bool(exact)
        if self.canonical:
            found = state.canonical.get(call_key(server, method, name, normalised), [])
            if judgement.unproven:  # only a recording that made the same violations says what happens
                found = [r for r in found if state.evidence.same_violations(judgement, r)]
            chosen = self.lookup.choose(found, trail)
            if chosen is not None:
                if chosen.key == key:
                    return Resolution(Tier.EXACT, 1.0, chosen, key=key, step=chosen.key)
                differences = differences_from(chosen, arguments)
                return Resolution(
                    Tier.CANONICAL, 1.0, chosen, key=key, step=chosen.key, differences=differences
                )
            same_state_miss = same_state_miss or bool(found)
        self.tool_states.defer_inline()  # what follows embeds the call: not on an event loop
        if self.semantic and not judgement.unproven and state.semantic_ready(normalised, MAX_TEXT_CHARS):
            hit = self._semantic(state, normalised, trail)
            if hit is not None:
                differences = differences_from(hit[0], arguments)
                return Resolution(
                    Tier.SEMANTIC, hit[1], hit[0], key=key, step=hit[0].key, differences=differences
                )
        refused = judgement.refusal is not None  # a refused call changes nothing
        changes = self.lookup.changes_state(server, name, arguments)  # by the call's kind, if learned so
        step = DIVERGED + key if changes and not refused else key
        candidates = near_misses(state, normalised, self.index, self.embedder)
        if same_state_miss:
            reason = f"{what} was recorded, but only after state changes this episode did not make"
            return Resolution(Tier.MISS, 0.0, None, candidates, reason, key, Problem.OTHER_STATE, step)
        if judgement.unproven:
            reason = violation_reason(judgement, what)
            return Resolution(Tier.MISS, 0.0, None, candidates, reason, key, Problem.INVALID_ARGUMENTS, step)
        reason = miss_reason(state, normalised, what, self.index)
        if judgement.violations:  # diagnosable: the values a schema check would have refused
            broken = "; ".join(v.describe() for v in judgement.violations)
            reason += (
                f" (the arguments may violate its inputSchema: {broken} — values of a kind the "
                "recordings show the server accepting)"
            )
        return Resolution(Tier.MISS, 0.0, None, candidates, reason, key, step=step)

    def _semantic(
        self, state: ToolState, normalised: dict[str, Any], trail: Trail
    ) -> tuple[Recording, float] | None:
        """The best same-identifier recording above the tool's threshold, from this episode's state."""
        group = state.group(normalised)
        if not group:
            return None
        index = self.index()
        threshold = state.threshold(index)
        if threshold > 1.0:
            return None
        vector = self.embedder.encode([call_text(normalised, state.free_text)])[0]
        for recording_id, score in index.search(state.server, state.schema.name, vector, len(group), group):
            if score < threshold:
                break
            chosen = self.lookup.choose(state.same_call(recording_id), trail)
            # Never a recording whose text is code, or whose arguments the server may have refused.
            if chosen is None or state.code_text(state.normalised[chosen.id]):
                continue
            if state.evidence.proven(chosen):
                return chosen, round(score, 6)
        return None
