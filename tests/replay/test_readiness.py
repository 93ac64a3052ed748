"""Readiness tells the truth (issue 20, items 4 and 6): ready means every tier answers at its usual
speed; a call that needs what still loads waits a bounded time; a failed warm-up is said and retried."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx2
import numpy as np
import pytest
from mcp import Client
from replay_helpers import build_store, match_of
from resolver_helpers import GatedEmbedder, calibrated_store, search

import replay_sim
from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _replay(tmp_path: Path, model: Any, **options: Any) -> Replay:
    store = calibrated_store(tmp_path / "r.db")
    return Replay(store, resolver=Resolver(store, embedder=model, index_dir=tmp_path / "index"), **options)


def test_ready_is_503_naming_what_loads_until_the_model_is_loaded_while_exact_hits_are_answered(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    model = GatedEmbedder(embedder)
    replay = _replay(tmp_path, model)
    with serving_in_thread(create_app(replay), wait_ready=False) as url:
        assert model.waiting.wait(60)  # the warm-up is loading the model (held at the gate)
        waiting = httpx2.get(f"{url}/api/ready", timeout=30)
        assert waiting.status_code == 503
        assert waiting.json()["waiting_for"] == ["loading the index"]

        async def exact() -> dict[str, Any]:
            async with Client(f"{url}/mcp/demo", mode="legacy") as client:
                return match_of(await client.call_tool("search", search("where is my order")["arguments"]))

        assert anyio.run(exact)["status"] == "exact"  # answered while the model loads
        model.gate.set()
        assert replay.resolver.warmup.wait(60)
        ready = httpx2.get(f"{url}/api/ready", timeout=30)
        assert ready.status_code == 200
        assert ready.json()["ready"] is True and ready.json()["waiting_for"] == []


@pytest.mark.anyio
async def test_a_call_needing_the_model_before_ready_waits_a_bounded_time_then_says_the_replay_is_starting(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    model = GatedEmbedder(embedder)
    replay = _replay(tmp_path, model, warm_wait=0.2)
    replay.resolver.warm(wait=False)
    trail = replay.histories.history("episode-1")
    assert trail is not None
    with anyio.fail_after(60):
        await anyio.to_thread.run_sync(model.waiting.wait)
        answer = await replay.resolve(
            "demo", "tools/call", search("How do I reset my password?"), trail.trail("demo")
        )
        assert answer.resolution.tier is Tier.MISS and not answer.resolution.step  # history untouched
        assert "the replay is still starting (loading the index" in str(answer.reply)
        assert replay.metrics.recent_misses() == []  # not a miss of the recordings: nothing kept
        model.gate.set()
        await anyio.to_thread.run_sync(replay.resolver.warmup.wait)
        later = await replay.resolve("demo", "tools/call", search("How do I reset my password?"), ())
    assert later.resolution.tier is Tier.SEMANTIC


class FailingOnce:
    """The real model, whose first encode fails as a process out of file descriptors does."""

    def __init__(self, model: SentenceTransformerEmbedder) -> None:
        self.model = model
        self.failed = threading.Event()

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def dimension(self) -> int:
        return self.model.dimension

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not self.failed.is_set():
            self.failed.set()
            raise OSError(24, "Too many open files")
        return self.model.encode(texts)


def test_a_failed_warm_up_is_logged_reported_by_readiness_and_tried_again(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    model = FailingOnce(embedder)
    replay = _replay(tmp_path, model)
    seen: list[dict[str, Any]] = []
    logs = caplog.at_level(logging.WARNING, logger="replay_sim")
    with logs, serving_in_thread(create_app(replay), wait_ready=False) as url:
        assert model.failed.wait(60)
        deadline = time.monotonic() + 120
        while not replay.resolver.warmup.done:  # between the failure and the retry it says why
            assert time.monotonic() < deadline, "the warm-up was not tried again"
            answer = httpx2.get(f"{url}/api/ready", timeout=30)
            if answer.status_code == 503 and "failed" in " ".join(answer.json()["waiting_for"]):
                seen.append(answer.json())
            replay.resolver.warmup.wait(0.05)
        assert httpx2.get(f"{url}/api/ready", timeout=30).status_code == 200  # retried and loaded
    assert seen, "readiness never reported the failed warm-up"
    assert "failed 1 time(s), last with OSError: [Errno 24] Too many open files; trying again" in str(
        seen[0]["waiting_for"]
    )
    assert any("the warm-up (index) failed (attempt 1)" in r.message for r in caplog.records)
    assert replay.resolver.warmup.attempts == 2


def test_serving_returns_only_once_ready_unless_asked_not_to_wait(tmp_path: Path) -> None:
    build_store(tmp_path / "serving.db").close()
    with replay_sim.serving(tmp_path / "serving.db", index_dir=tmp_path / "index") as sim:
        assert httpx2.get(f"{sim.url}/api/ready", timeout=30).status_code == 200
        assert sim.replay.resolver.warmup.done
    with replay_sim.serving(tmp_path / "serving.db", index_dir=tmp_path / "index", wait_ready=False) as sim:
        assert httpx2.get(f"{sim.url}/api/health", timeout=30).status_code == 200


class LoadedOnEncode:
    """The real model, saying it is loaded only once something was encoded (as a fresh model is)."""

    def __init__(self, model: SentenceTransformerEmbedder) -> None:
        self.model = model
        self.encoded = 0

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def dimension(self) -> int:
        return self.model.dimension

    @property
    def loaded(self) -> bool:
        return self.encoded > 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.encoded += 1
        return self.model.encode(texts)


def test_ready_needs_the_index_not_the_model_or_tool_states_which_the_first_semantic_call_loads(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    build_index(store, embedder=embedder, directory=tmp_path / "index")  # as `index build` does
    model = LoadedOnEncode(embedder)
    replay = Replay(store, resolver=Resolver(store, embedder=model, index_dir=tmp_path / "index"))
    with serving_in_thread(create_app(replay)) as url:
        ready = httpx2.get(f"{url}/api/ready", timeout=30)
        assert ready.status_code == 200 and ready.json()["waiting_for"] == []
        assert ready.json()["embedding_model"].startswith("not loaded: the first call that embeds")
        assert ready.json()["tools_prepared"] == 0
        assert model.encoded == 0  # the warm-up loaded the index alone

        async def semantic() -> dict[str, Any]:
            async with Client(f"{url}/mcp/demo", mode="legacy") as client:
                return match_of(
                    await client.call_tool("search", search("How do I reset my password?")["arguments"])
                )

        assert anyio.run(semantic)["status"] == "semantic"
        after = httpx2.get(f"{url}/api/ready", timeout=30).json()
        assert after["embedding_model"] == "loaded" and after["tools_prepared"] == 1


@pytest.mark.anyio
async def test_a_call_needing_the_model_once_ready_waits_a_bounded_time_while_it_loads_then_says_so(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    build_index(store, embedder=embedder, directory=tmp_path / "index")  # ready needs no model then
    model = GatedEmbedder(embedder)  # loading until the gate opens (a minute, on a busy machine)
    resolver = Resolver(store, embedder=model, index_dir=tmp_path / "index")
    replay = Replay(store, resolver=resolver, warm_wait=0.2)
    resolver.warm()
    with anyio.fail_after(60):
        answer = await replay.resolve("demo", "tools/call", search("How do I reset my password?"), ())
        assert answer.resolution.tier is Tier.MISS
        assert "the embedding model is still loading" in str(answer.reply)
        assert replay.metrics.recent_misses() == []  # not a miss of the recordings: nothing kept
        model.gate.set()  # the load the first call began goes on and ends
        later = await replay.resolve("demo", "tools/call", search("How do I reset my password?"), ())
    assert later.resolution.tier is Tier.SEMANTIC
