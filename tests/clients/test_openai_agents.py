"""The OpenAI Agents SDK's streamable-HTTP MCP server class: tool listing and calls, no LLM."""

from __future__ import annotations

import anyio
from agents.mcp import MCPServerStreamableHttp
from clients_helpers import ANSWERS, STEPS, answered_alone

from replay_sim import ReplayServer, match_of


def test_openai_agents_mcp_servers_on_two_episode_urls_each_get_their_own_history(sim: ReplayServer) -> None:
    a, b = sim.episode(), sim.episode()

    async def rollouts() -> tuple[list[str], list[str]]:
        async with (
            MCPServerStreamableHttp(
                params={"url": a.url("demo")}, name="a", cache_tools_list=True
            ) as server_a,
            MCPServerStreamableHttp(params={"url": b.url("demo")}, name="b") as server_b,
        ):
            listed = [tool.name for tool in await server_a.list_tools()]
            servers = {"a": server_a, "b": server_b}
            seen = []
            for who, tool in STEPS:
                result = await servers[who].call_tool(tool, {})
                assert match_of(result) is not None and not result.is_error
                seen.append(result.content[0].text)
            return listed, seen

    listed, seen = anyio.run(rollouts)
    assert listed == ["echo", "counter", "increment", "slow"]
    assert seen == ANSWERS
    assert answered_alone(a, b)
