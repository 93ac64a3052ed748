"""Asking a real server which argument differences it ignores (the recorder's ``explore`` option).

The resolver answers a call that differs from a recording only in letter case, surrounding
whitespace or array order when recorded pairs *show* the server ignores that difference
(:mod:`replay_sim.resolve.invariance`; the differences are :mod:`replay_sim.variants`). Clients
seldom make such pairs, so a recorder that explores makes them: after a successful call of a
read-only tool, and before it answers the client (so nothing has changed the server's state in
between), it sends the same call again with one argument varied, and records that answer too
(origin ``explore``).

Exploring costs a few calls per tool, not one per call: a (tool, argument, difference) is asked
about only until the answers settle it — refuted by one disagreeing pair, or shown by agreeing
pairs with more different answers than the resolver needs — and at most :attr:`Explorer.budget`
times. What was asked and what it settled belong to the store, not to one recorder process:
:meth:`Explorer.resume` takes in the variants the store's recordings hold
(:func:`replay_sim.store.ledger.explored`), so a new run asks nothing they settle and its budget
counts the calls earlier runs made.

Which tools are read-only is itself asked first (:mod:`replay_sim.record.effect_probes`): a tool
annotated read-only whose repeated call answers differently keeps hidden state, and its variants
are never asked (each would change what the client sees next); a tool with no annotation that the
answers show to change nothing has its variants asked too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import answer_text
from replay_sim.record.effect_probes import EffectProbes
from replay_sim.schema import ToolSchema, tool_schemas
from replay_sim.store import Origin, Recording, Store
from replay_sim.store.ledger import explored
from replay_sim.variants import MIN_EVIDENCE, Transform

__all__ = ["Explorer", "Variant"]

_SEEN_SESSIONS = 256  # recorded sessions the effect probes take in when a run resumes a store


@dataclass(frozen=True, slots=True)
class Variant:
    """One exploring call: the original call's arguments with one argument varied."""

    tool: str
    argument: str
    transform: Transform
    arguments: dict[str, Any]


@dataclass
class Explorer:
    """Decides which variant calls are still worth making, from the answers they got.

    Args:
        budget: Most variant calls per (tool, argument, difference).
        effects: Which tools change state: the effect probes and what their answers show.
    """

    budget: int = 4
    effects: EffectProbes = field(default_factory=EffectProbes)
    _asked: dict[tuple[str, str, Transform], int] = field(default_factory=lambda: defaultdict(int))
    _agreed: dict[tuple[str, str, Transform], set[str]] = field(default_factory=lambda: defaultdict(set))
    _settled: set[tuple[str, str, Transform]] = field(default_factory=set)
    tools: dict[str, ToolSchema] = field(default_factory=dict)
    """The server's listed tools (their input schemas shape the variants)."""

    def declare(self, tools: Mapping[str, ToolSchema]) -> None:
        """Take the server's listed tools (schemas for the variants, annotations for the effect probes)."""
        self.tools = dict(tools)
        self.effects.declare(tools)

    def resume(self, store: Store, server: str) -> int:
        """Take in what ``store`` already holds of ``server``: its listed tools, its latest recorded
        sessions (the effect probes judge them) and every variant asked before (the ledger).

        Returns:
            How many recorded variant calls were taken in.
        """
        self.declare(tool_schemas(store.listings(server).get("tools/list")))
        sessions: dict[str, list[Recording]] = defaultdict(list)
        for rec in store.recordings(server):
            sessions[rec.session if rec.session is not None else f"#{rec.id}"].append(rec)
        # The latest sessions only: the probes' verdicts are worked out again as calls come in.
        latest = sorted(sessions.items(), key=lambda item: max(r.id for r in item[1]))[-_SEEN_SESSIONS:]
        for session, calls in latest:
            for rec in sorted(calls, key=lambda r: (r.seq or 0, r.id)):
                probe = rec.origin == Origin.EXPLORE
                self.effects.observe(session, rec.method, rec.params, rec.result, rec.error, probe)
        schemas = {name: tool.input_schema for name, tool in self.tools.items()}
        taken = 0
        for asked in explored(store, server, schemas):
            original = answer_text(asked.original.result, asked.original.error)
            answer = answer_text(asked.variant.result, asked.variant.error)
            variant = Variant(asked.tool, asked.argument, asked.transform, asked.variant.arguments)
            self.observe(variant, original, answer)
            taken += 1
        return taken

    def variants(
        self, tool: str, arguments: dict[str, Any], input_schema: dict[str, Any] | None = None
    ) -> list[Variant]:
        """The variant calls to make after a successful call of read-only ``tool``.

        Args:
            tool: The tool called.
            arguments: The call's arguments.
            input_schema: The tool's listed ``inputSchema``: with it, a variant of another type
                (``1`` → ``"1"``) or an omitted optional argument is asked where the schema allows
                it, and no variant the schema refuses is ever made.
        """
        found = []
        for name in arguments:
            for transform in Transform:
                if not self.open(tool, name, transform):
                    continue
                varied = transform.vary_call(arguments, name, input_schema)
                if varied is not None:
                    found.append(Variant(tool, name, transform, varied))
        return found

    def open(self, tool: str, argument: str, transform: Transform) -> bool:
        """Whether a difference is still worth asking about: not settled, and within the budget."""
        key = (tool, argument, transform)
        return key not in self._settled and self._asked[key] < self.budget

    async def explore(
        self, variants: Sequence[Variant], original: str, ask: Callable[[dict[str, Any]], Awaitable[str]]
    ) -> None:
        """Ask ``variants`` (from :meth:`variants`) and take in their answers.

        Args:
            variants: The variant calls to make.
            original: The original call's answer, canonical.
            ask: Makes (and records) one call with the given arguments; returns its answer, canonical.
        """
        for variant in variants:
            self.observe(variant, original, await ask(variant.arguments))

    def observe(self, variant: Variant, original: str, answer: str) -> None:
        """Take in a variant's answer; ``original`` is the (successful) original call's. Both canonical."""
        key = (variant.tool, variant.argument, variant.transform)
        self._asked[key] += 1
        if answer != original:
            self._settled.add(key)  # refuted
        else:
            self._agreed[key].add(answer)
            # One more than the resolver needs: an agreeing "nothing found" is a weak witness.
            if len(self._agreed[key]) > MIN_EVIDENCE:
                self._settled.add(key)
