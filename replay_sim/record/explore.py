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
times.

Which tools are read-only is itself asked first (:mod:`replay_sim.record.effect_probes`): a tool
annotated read-only whose repeated call answers differently keeps hidden state, and its variants
are never asked (each would change what the client sees next); a tool with no annotation that the
answers show to change nothing has its variants asked too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from replay_sim.record.effect_probes import EffectProbes
from replay_sim.variants import MIN_EVIDENCE, Transform

__all__ = ["Explorer", "Variant"]


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

    def variants(self, tool: str, arguments: dict[str, Any]) -> list[Variant]:
        """The variant calls to make after a successful call of read-only ``tool``."""
        found = []
        for name, value in arguments.items():
            for transform in Transform:
                key = (tool, name, transform)
                if key in self._settled or self._asked[key] >= self.budget:
                    continue
                varied = transform.vary(value)
                if varied is not None:
                    found.append(Variant(tool, name, transform, {**arguments, name: varied}))
        return found

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
