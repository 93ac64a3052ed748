"""Each tool's matching state, built once on first need and forgotten when its recordings change.

A :class:`~replay_sim.resolve.toolstate.ToolState` is read from every recording of its tool (30 s of
CPU at 100,000 recordings), so it is built when a call of the tool first needs it, by one thread
while the others wait for it, and never on an event loop: within
:meth:`~replay_sim.resolve.resolver.Resolver.resolve_now` (:meth:`ToolStates.inline`), a call that
would build one raises :class:`Deferred` and goes to a worker thread instead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.toolstate import ToolState
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store

__all__ = ["Deferred", "ToolStates"]


class Deferred(Exception):
    """Within :meth:`ToolStates.inline`: the call needs more than what is built already."""


class ToolStates:
    """The built matching states of a resolver's tools.

    Args:
        store: The recording store.
        config: The matching config.
        state_of: The state a recording was made from (the resolver's lookup).
        need: Called before a state is built (waits for the warm-up it needs).
        version: The store's version as the resolver last read it; a state built while it changed
            is used but not kept.
    """

    def __init__(
        self,
        store: Store,
        config: MatchConfig,
        state_of: Callable[[Recording], Any],
        need: Callable[[], None],
        version: Callable[[], object],
    ) -> None:
        self.store = store
        self.config = config
        self.state_of = state_of
        self.need = need
        self.version = version
        self._states: dict[tuple[str, str], ToolState] = {}
        self._lock = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._inline = threading.local()  # .on: within inline(), which defers what is not built

    def __len__(self) -> int:
        return len(self._states)

    def get(self, server: str, tool: str, schema: ToolSchema) -> ToolState:
        """The tool's matching state, built now if it must be.

        Raises:
            Deferred: Within :meth:`inline`, when it is not built yet.
        """
        state = self._states.get((server, tool))
        if state is None:
            self.need()
            self.defer_inline()  # read from every recording of the tool: not on an event loop
            with self._building(server, tool):
                state = self._states.get((server, tool))  # another thread may have built it
                if state is None:
                    version = self.version()
                    recordings = self.store.recordings(server, method="tools/call", name=tool)
                    state = ToolState(server, schema, recordings, self.config, self.state_of)
                    if self.version() == version:  # else the store changed meanwhile
                        self._states[(server, tool)] = state
        return state

    def kept(self, server: str, tool: str) -> ToolState | None:
        """The tool's state if it is built (nothing is built)."""
        return self._states.get((server, tool))

    def forget(self, tools: Iterable[tuple[str, str]] | None = None) -> None:
        """Forget the states of ``tools`` (None: of every tool)."""
        if tools is None:
            self._states.clear()
        for tool in tools or ():
            self._states.pop(tool, None)

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """Within this block (in this thread), what would build or embed raises :class:`Deferred`."""
        self._inline.on = True
        try:
            yield
        finally:
            self._inline.on = False

    def defer_inline(self) -> None:
        """Raise :class:`Deferred` when inside :meth:`inline`.

        Raises:
            Deferred: Inside :meth:`inline`.
        """
        if getattr(self._inline, "on", False):
            raise Deferred

    def _building(self, server: str, tool: str) -> threading.Lock:
        """The lock under which one tool's state is built (once, not by each waiting call)."""
        with self._lock:
            return self._locks.setdefault((server, tool), threading.Lock())
