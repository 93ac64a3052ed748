"""Two interleaved rollouts through LangChain's MCP adapters; run in their own venv (they need mcp<2).

Usage: ``python langchain_rollouts.py URL_A URL_B STEPS_JSON`` (the episode URLs of one server and
``[["a", "increment"], ...]``). Loads each episode's tools with ``MultiServerMCPClient``, invokes the
steps in order and prints ``{"tools": [...], "answers": [...]}`` as JSON. Each tool invocation
opens an MCP session of its own: only the episode URL ties a rollout's calls together.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient


def _text(output: Any) -> str:
    """The text of a tool's output: a string, or content blocks (``[{"type": "text", "text": ...}]``)."""
    if isinstance(output, tuple):  # (content, artifact)
        output = output[0]
    if isinstance(output, list):
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in output)
    return str(output)


async def main(url_a: str, url_b: str, steps: list[list[str]]) -> dict[str, Any]:
    tools = {}
    for who, url in (("a", url_a), ("b", url_b)):
        client = MultiServerMCPClient({"demo": {"url": url, "transport": "http"}})
        tools[who] = {tool.name: tool for tool in await client.get_tools()}
    answers = [_text(await tools[who][name].ainvoke({})) for who, name in steps]
    return {"tools": sorted(tools["a"]), "answers": answers}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
