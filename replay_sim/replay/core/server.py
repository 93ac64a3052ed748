"""The MCP SDK server that stands in for one recorded server.

It looks like the recorded one — server info, capabilities, instructions, and the recorded listings
of tools, resources, templates and prompts — and hands every replayed request (``tools/call``,
``resources/read``, ``prompts/get``, ``completion/complete``) to one answering function.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.caching import CACHEABLE_METHODS, CacheHint
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from replay_sim.protocol import LISTING_FIELDS
from replay_sim.replay.core.surface import Surface
from replay_sim.replay.core.wire import Initialize, PassThrough, hand_over

__all__ = ["Answerer", "build_server"]

Answerer = Callable[[str, str, ServerRequestContext[Any, Any]], Awaitable[dict[str, Any]]]
"""``answer(server, method, ctx)``: the result's wire JSON for a replayed request (raises ``MCPError``)."""


def build_server(surface: Surface, answer: Answerer) -> Server[Any]:
    """An MCP server with the recorded face of ``surface``, answering replayed requests with ``answer``.

    Args:
        surface: What the recorded server showed its clients.
        answer: Answers ``tools/call``, ``resources/read``, ``prompts/get`` and ``completion/complete``.

    Returns:
        The low-level SDK server, ready to run over stdio or in a session manager.
    """
    info, caps, listings = surface.record.info, surface.record.capabilities, surface.listings
    name = surface.record.name

    def listing(method: str) -> Any:
        async def handler(ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
            return hand_over(ctx, dict(listings.get(method) or {LISTING_FIELDS[method]: []}))

        return handler

    def replayed(method: str) -> Any:
        async def handler(ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
            return hand_over(ctx, await answer(name, method, ctx))

        return handler

    handlers: dict[str, Any] = {}
    if "tools" in caps or "tools/list" in listings:
        handlers |= {"on_list_tools": listing("tools/list"), "on_call_tool": replayed("tools/call")}
    if "resources" in caps or "resources/list" in listings:
        handlers |= {
            "on_list_resources": listing("resources/list"),
            "on_list_resource_templates": listing("resources/templates/list"),
            "on_read_resource": replayed("resources/read"),
        }
    if "prompts" in caps or "prompts/list" in listings:
        handlers |= {"on_list_prompts": listing("prompts/list"), "on_get_prompt": replayed("prompts/get")}
    if "completions" in caps:
        handlers["on_completion"] = replayed("completion/complete")
    # Modern-era clients need freshness hints on listings; "immediately stale" is always true.
    hints: Any = {method: CacheHint() for method in CACHEABLE_METHODS}
    server: Server[Any] = Server(
        str(info.get("name") or name),
        version=str(info.get("version") or ""),
        title=info.get("title"),
        description=info.get("description"),
        instructions=surface.record.instructions,
        website_url=info.get("websiteUrl"),
        icons=[types.Icon.model_validate(i) for i in info.get("icons") or []] or None,
        cache_hints=hints,
        on_list_tools=handlers.get("on_list_tools"),
        on_call_tool=handlers.get("on_call_tool"),
        on_list_resources=handlers.get("on_list_resources"),
        on_list_resource_templates=handlers.get("on_list_resource_templates"),
        on_read_resource=handlers.get("on_read_resource"),
        on_list_prompts=handlers.get("on_list_prompts"),
        on_get_prompt=handlers.get("on_get_prompt"),
        on_completion=handlers.get("on_completion"),
        # 2026-era Mcp-Param-* headers are checked against the listed schema; looked up here rather
        # than by the SDK running the tools/list handler for every call.
        get_tool_input_schema=lambda tool: (surface.tools.get(tool) or {}).get("inputSchema"),
    )

    async def empty(ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return {}

    async def discover(ctx: ServerRequestContext[Any, Any], params: Any) -> types.DiscoverResult:
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=types.ServerCapabilities.model_validate(caps),
            instructions=surface.record.instructions,
        )

    server.add_request_handler("server/discover", types.RequestParams, discover)
    if "logging" in caps:
        server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, empty)
    if (caps.get("resources") or {}).get("subscribe"):
        server.add_request_handler("resources/subscribe", types.SubscribeRequestParams, empty)
        server.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams, empty)
    # Tracing middleware costs more than a replayed answer; the recorded identity answers initialize.
    server.middleware = [Initialize(surface), PassThrough()]
    return server
