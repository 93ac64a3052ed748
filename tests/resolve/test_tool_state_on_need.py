"""A tool's matching state is built by its first call that needs it, in that call's thread, not by the
warm-up (issue 22: 30 s of warm-up CPU at 100,000 recordings that an exact-hit replay never needed)."""

from __future__ import annotations

from pathlib import Path

from resolver_helpers import REPO, calibrated_store

from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver


def test_the_warm_up_builds_no_tool_state_and_a_tools_first_canonical_call_builds_it_off_the_loop(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    build_index(store, embedder=embedder, directory=tmp_path / "index")
    resolver = Resolver(store, embedder=embedder, index_dir=tmp_path / "index")
    resolver.warm()
    assert resolver.prepared_tools == 0
    recorded = {"name": "search", "arguments": {"query": "where is my order", "repo_path": REPO}}
    exact = resolver.resolve_now("demo", "tools/call", recorded)
    assert exact is not None and exact.tier is Tier.EXACT  # no tool state needed
    defaulted = {"name": "search", "arguments": {**recorded["arguments"], "limit": 5}}  # the schema default
    assert resolver.resolve_now("demo", "tools/call", defaulted) is None  # an event loop hands it on
    assert resolver.prepared_tools == 0
    assert resolver.resolve("demo", "tools/call", defaulted).tier is Tier.CANONICAL  # a worker builds it
    assert resolver.prepared_tools == 1
    again = resolver.resolve_now("demo", "tools/call", defaulted)
    assert again is not None and again.tier is Tier.CANONICAL  # built once: answered at once now
