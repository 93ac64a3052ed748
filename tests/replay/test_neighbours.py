"""A big miss never stalls its neighbours: the work a miss costs is done off the event loop.

Real HTTP on 127.0.0.1 and the real embedding model. The model is wrapped so that encoding the big
miss's text (its nearest recordings are searched by embedding) holds until the neighbour's hit has
been answered, 20 s at most: the hit must be answered while the miss is still held — an order, not
a timing. Done on the event loop, the held encoding holds every other request with it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import numpy as np
import pytest
from replay_helpers import build_store, payload, raw_session, tool_call

from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolver import Resolver

pytestmark = pytest.mark.anyio

BIG = "lorem ipsum " * (4_000_000 // 12)  # a 4 MB argument (the SDK takes bodies up to 4 MiB)


class HeldEmbedder:
    """The real model; encoding a text over 10,000 characters waits for :attr:`release` (20 s at most)."""

    def __init__(self, model: SentenceTransformerEmbedder) -> None:
        self.model = model
        self.model_id = model.model_id
        self.dimension = model.dimension
        self.holding = threading.Event()
        """Set once a long text's encoding is held."""
        self.release = threading.Event()
        self.held = threading.Event()
        """Set once the hold is over (released, or 20 s passed)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if any(len(text) > 10_000 for text in texts):
            self.holding.set()
            self.release.wait(20)
            self.held.set()
        return self.model.encode(texts)


async def test_while_a_4_mb_miss_is_handled_another_sessions_exact_hit_is_answered_first(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = build_store(tmp_path / "replay.db")
    held = HeldEmbedder(embedder)
    replay = Replay(store, resolver=Resolver(store, index_dir=None, embedder=held))
    replay.resolver.warm()
    answered: list[str] = []
    with serving_in_thread(create_app(replay)) as base:
        async with httpx2.AsyncClient(timeout=60) as http:
            big_url, hit_url = f"{base}/episodes/big/mcp/demo", f"{base}/episodes/other/mcp/demo"
            big_session, hit_session = await raw_session(http, big_url), await raw_session(http, hit_url)

            async def call(url: str, headers: dict[str, str], params: dict[str, Any], label: str) -> None:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
                response = await http.post(url, json=body, headers=headers)
                assert response.status_code == 200, (response.status_code, response.text[:300])
                answer = payload(response)
                answered.append(f"{label}:{answer['result']['_meta']['replay-sim/match']['status']}")

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call, big_url, big_session, tool_call("echo", message=BIG), "big")
                    await anyio.to_thread.run_sync(held.holding.wait, 30)  # the miss is being handled
                    await call(hit_url, hit_session, tool_call("echo", message="hello"), "hit")
                    answered.append("while held" if not held.held.is_set() else "after the hold")
                    held.release.set()
    assert answered == ["hit:exact", "while held", "big:miss"]
    store.close()
