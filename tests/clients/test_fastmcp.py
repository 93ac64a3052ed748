"""fastmcp's ``Client``, by episode URL and by the ``mcpServers`` config an episode hands out."""

from __future__ import annotations

import anyio
import pytest
from clients_helpers import ANSWERS, STEPS, answered_alone
from fastmcp import Client

from replay_sim import ReplayServer, match_of


def test_fastmcp_clients_on_two_episode_urls_each_get_their_own_history(sim: ReplayServer) -> None:
    a, b = sim.episode(), sim.episode()

    async def rollouts() -> list[str]:
        async with Client(a.url("demo")) as client_a, Client(b.url("demo")) as client_b:
            clients = {"a": client_a, "b": client_b}
            seen = []
            for who, tool in STEPS:
                result = await clients[who].call_tool(tool, {})
                match = match_of(result)
                assert match is not None and match.status == "exact"
                seen.append(result.content[0].text)
            return seen

    assert anyio.run(rollouts) == ANSWERS
    assert answered_alone(a, b)


def test_fastmcp_takes_an_episodes_mcp_servers_config(sim: ReplayServer) -> None:
    a, b = sim.episode(), sim.episode()

    async def rollouts() -> list[str]:
        # A multi-server config: fastmcp names each tool <server>_<tool>.
        async with Client(a.mcp_servers_json()) as client_a, Client(b.mcp_servers_json()) as client_b:
            names = {t.name for t in await client_a.list_tools()}
            assert {"demo_counter", "demo_increment", "other_ping"} <= names
            clients = {"a": client_a, "b": client_b}
            return [(await clients[w].call_tool(f"demo_{t}", {})).content[0].text for w, t in STEPS]

    assert anyio.run(rollouts) == ANSWERS
    assert answered_alone(a, b)


@pytest.mark.parametrize("transport", ["http", "streamable-http"])
def test_the_config_transport_names_are_ones_fastmcp_accepts(sim: ReplayServer, transport: str) -> None:
    from fastmcp.mcp_config import MCPConfig

    config = MCPConfig.from_dict(sim.episode().mcp_servers_json(transport))
    assert sorted(config.mcpServers) == ["demo", "other"]
