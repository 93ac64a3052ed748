"""The tool schemas a store recorded, with the matching config's overrides applied.

The one place that reads a server's recorded ``tools/list`` from a store and turns it into
:class:`~replay_sim.schema.ToolSchema` objects for matching: the resolver, the index build and the
evaluator all look schemas up here. (Parsing a listing is :func:`replay_sim.schema.tool_schemas`.)
"""

from __future__ import annotations

from replay_sim.resolve.calibration import MatchConfig
from replay_sim.schema import ToolSchema, tool_schemas
from replay_sim.store import Store

__all__ = ["RecordedSchemas"]


class RecordedSchemas:
    """``(server, tool) -> ToolSchema`` from a store's recorded listings (cached per server).

    Args:
        store: The recording store.
        config: Per-tool overrides (free-text and identifier fields, read-only); defaults when None.
    """

    def __init__(self, store: Store, config: MatchConfig | None = None) -> None:
        self.store = store
        self.config = config or MatchConfig()
        self._tools: dict[str, dict[str, ToolSchema] | None] = {}

    def __call__(self, server: str, tool: str) -> ToolSchema | None:
        """The schema of one tool, or None when the server or the tool was never listed."""
        tools = self.tools(server)
        return None if tools is None else tools.get(tool)

    def tools(self, server: str) -> dict[str, ToolSchema] | None:
        """Every recorded tool of ``server`` by name, or None when it has no recorded ``tools/list``."""
        if server not in self._tools:
            listing = self.store.listings(server).get("tools/list")
            self._tools[server] = (
                None
                if listing is None
                else {name: self.config.apply(server, s) for name, s in tool_schemas(listing).items()}
            )
        return self._tools[server]

    def clear(self) -> None:
        """Forget what was read (the store changed)."""
        self._tools.clear()
