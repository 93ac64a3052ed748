"""The SkyRL-gym environment of server/README.md ("Training with episode URLs"), run as documented.

The README's ``replay_env.py`` block is executed as it stands; two environments (two rollouts)
then step through the counter store interleaved, each creating its episode in ``init`` and ending
it in ``close``, each step on an MCP session of its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clients_helpers import ANSWERS, STEPS

from replay_sim import ReplayServer

README = Path(__file__).resolve().parents[2] / "server" / "README.md"


def documented(first_line: str) -> dict[str, Any]:
    """Run the README's python block that starts with ``first_line``; returns its names."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    [code] = [b for b in blocks if b.startswith(first_line)]
    names: dict[str, Any] = {"__name__": "replay_env"}
    exec(compile(code, f"{README}:{first_line}", "exec"), names)
    return names


def test_the_documented_skyrl_environment_keeps_each_rollouts_history(sim: ReplayServer) -> None:
    env_class = documented("# replay_env.py")["ReplayToolEnv"]
    envs = {who: env_class(sim.url, "demo", seed=1) for who in ("a", "b")}
    for env in envs.values():
        prompt = [{"role": "user", "content": "count"}]
        assert env.init(prompt)[0] == prompt
    episodes = {who: env.episode for who, env in envs.items()}
    assert len(set(episodes.values())) == 2 and all(sim.replay.episodes.get(e) for e in episodes.values())
    seen = []
    for who, tool in STEPS:
        action = f"I will call it. <tool_call>{json.dumps({'name': tool, 'arguments': {}})}</tool_call>"
        output = envs[who].step(action)
        assert not output["done"] and output["metadata"]["replay"]["status"] == "exact"
        seen.append(output["observations"][0]["content"])
    assert seen == ANSWERS
    final = envs["a"].step("The counter is 1.")
    assert final["done"] and final["observations"] == []
    for env in envs.values():
        env.close()
    assert not any(sim.replay.episodes.get(e) for e in episodes.values())  # ended, state freed
