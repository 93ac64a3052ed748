"""Resolver benchmarks: exact-tier and semantic-tier latency, index build throughput, 1 M-vector index.

Figures are medians measured in this run, with ratios against a baseline measured alongside:

- exact tier: ``Resolver.resolve`` on recorded calls (warm in-memory key cache) versus the bare
  SQLite key query it replaces. Target: <= 50 µs.
- semantic tier: ``resolve`` of never-seen paraphrases (query embedding included, 2 CPU cores).
  Target: p50 <= 15 ms.
- index build: texts/s embedding from scratch versus rebuilding from the store's embedding cache.
- 1 M synthetic recordings over 1,000 tools: **random unit vectors** (isolates faiss from the
  model): build time, resident memory added, lookup p50 (top-3 in one tool's partition).
"""

from __future__ import annotations

import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from replay_sim.canonical import call_key
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import CachedEmbedder, default_embedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.vectors import FaissIndex
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "fixtures" / "probes" / "recordings.jsonl"
SEARCH = {
    "name": "search",
    "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    "annotations": {"readOnlyHint": True},
}
TOPICS = [
    "password",
    "refund",
    "order",
    "invoice",
    "shipping",
    "account",
    "login",
    "discount",
    "warranty",
    "return",
]
ASKS = [
    "how do I change my {}",
    "where can I see my {}",
    "problem with my {}",
    "question about the {}",
    "help with {}",
]


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def bench_exact(folder: Path) -> None:
    """Exact tier versus the SQLite key query."""
    store = Store(folder / "exact.db")
    import_jsonl(store, RECORDINGS)
    calls = [(r.server, r.method, r.params) for r in store.recordings() if r.method == "tools/call"]
    resolver = Resolver(store, index_dir=None, semantic=False)
    for server, method, params in calls:  # warm the key cache
        resolver.resolve(server, method, params, [])
    ours, base = [], []
    for _ in range(40):
        for server, method, params in calls:
            started = time.perf_counter()
            found = resolver.resolve(server, method, params, [])
            ours.append(time.perf_counter() - started)
            assert found.tier in (Tier.EXACT, Tier.MISS)
            started = time.perf_counter()
            store.recordings(key=call_key(server, method, params["name"], params.get("arguments") or {}))
            base.append(time.perf_counter() - started)
    print(f"   exact tier: p50 {_median_us(ours):.1f} µs per resolve (target <= 50 µs); "
          f"SQLite key query alone {_median_us(base):.1f} µs; "
          f"ratio {statistics.median(ours) / statistics.median(base):.2f}")  # fmt: skip


def _search_store(path: Path, count: int, distinct: bool = False) -> Store:
    store = Store(path)
    store.put_listing("bench", "tools/list", {"tools": [SEARCH]})
    store.start_session("bench", "s")
    for i in range(count):
        query = ASKS[i % len(ASKS)].format(TOPICS[(i // len(ASKS)) % len(TOPICS)])
        query += "" if distinct else f" (case {i})"
        store.record_call("bench", "tools/call", {"name": "search", "arguments": {"query": query}},
                          result={"content": [{"type": "text", "text": f"answer {i}"}]},
                          session="s")  # fmt: skip
    return store


def bench_semantic(folder: Path) -> None:
    """Semantic-tier latency including the query embedding."""
    store = _search_store(folder / "semantic.db", len(ASKS) * len(TOPICS), distinct=True)
    resolver = Resolver(store, index_dir=folder / "semantic-index")
    resolver.resolve("bench", "tools/call", {"name": "search", "arguments": {"query": "warm up"}}, [])
    samples, tiers = [], []
    for i in range(300):
        # 300 distinct texts (50 recorded questions x 6 punctuations): never seen, embedded every time
        query = ASKS[i % 5].format(TOPICS[(i // 5) % 10]).capitalize() + "?" * (1 + i // 50)
        started = time.perf_counter()
        found = resolver.resolve("bench", "tools/call", {"name": "search", "arguments": {"query": query}}, [])
        samples.append(time.perf_counter() - started)
        tiers.append(found.tier)
    print(f"   semantic tier (embedding included): p50 {statistics.median(samples) * 1e3:.2f} ms, "
          f"p90 {np.percentile(samples, 90) * 1e3:.2f} ms (target p50 <= 15 ms); "
          f"{tiers.count(Tier.SEMANTIC)} semantic hits, "
          f"{tiers.count(Tier.MISS)} misses with 3 near misses each")  # fmt: skip


def bench_build(folder: Path) -> None:
    """Index build throughput, cold versus from the embedding cache."""
    store = _search_store(folder / "build.db", 3000)
    schemas = Resolver(store, index_dir=None).tool_schema
    rates = []
    for label in ("cold (model)", "warm (store cache)"):
        shutil.rmtree(folder / "build-index", ignore_errors=True)
        embedder = CachedEmbedder(default_embedder(), store, memory_items=0)
        started = time.perf_counter()
        build_index(store, schemas, embedder, folder / "build-index")
        elapsed = time.perf_counter() - started
        rates.append(3000 / elapsed)
        print(
            f"   index build, {label}: {rates[-1]:,.0f} texts/s "
            f"({embedder.encoded} embedded, {embedder.reused} cached)"
        )
    print(f"   cache speed-up: {rates[1] / rates[0]:.1f}x")


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_million(tools: int = 1000, per_tool: int = 1000, dimension: int = 384) -> None:
    """1 M random unit vectors in 1,000 per-tool partitions (flat: each is under the HNSW threshold)."""
    rng = np.random.default_rng(0)
    before = _rss_mb()
    started = time.perf_counter()
    parts = []
    for t in range(tools):
        vectors = rng.standard_normal((per_tool, dimension), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        part = FaissIndex(dimension)
        part.add(np.arange(t * per_tool, (t + 1) * per_tool), vectors)
        parts.append(part)
    build = time.perf_counter() - started
    memory = _rss_mb() - before
    queries = rng.standard_normal((500, dimension), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    samples = []
    for i, query in enumerate(queries):
        started = time.perf_counter()
        parts[(i * 7919) % tools].search(query, 3)
        samples.append(time.perf_counter() - started)
    print(f"   1M random vectors / {tools} tools: build {build:.1f} s, +{memory:,.0f} MB resident, "
          f"lookup p50 {_median_us(samples):.0f} µs (top-3 in one partition)")  # fmt: skip
    hnsw = FaissIndex(dimension, hnsw_threshold=10_000)
    vectors = rng.standard_normal((50_000, dimension), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    started = time.perf_counter()
    hnsw.add(np.arange(50_000), vectors)
    build = time.perf_counter() - started
    samples = []
    for query in queries:
        started = time.perf_counter()
        hnsw.search(query, 3)
        samples.append(time.perf_counter() - started)
    print(
        f"   one 50k-vector tool partition ({hnsw.kind}): build {build:.1f} s, "
        f"lookup p50 {_median_us(samples):.0f} µs"
    )


def main() -> None:
    """Run every resolver benchmark and print its figures."""
    folder = Path(tempfile.mkdtemp(prefix="replay-sim-bench-"))
    try:
        bench_exact(folder)
        bench_semantic(folder)
        bench_build(folder)
        bench_million()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
