"""The 100,000-recording case: does anything on the hot path grow with the store?

A store is generated (10 servers x 10 read-only tools, sessions of 10 calls, arguments shaped like
a real search tool's: a ``project`` identifier, an integer ``limit`` and a free-text ``query``), and
the same shape at 1,000 recordings is the baseline. Reported, in one run:

- index build time of the big store, and embedding throughput of the model (texts/s);
- exact-tier and semantic-tier resolve p50 on the big store versus the small one (target <= 1.2x);
- start to first exact answer of ``replay-sim serve`` on the big store, over HTTP (target <= 0.5 s)
  and stdio (<= 0.3 s), with a bare SDK server's start in the same run, and the warm-up CPU after
  the first answer (see :mod:`bench.startup`).

The free text comes from a vocabulary of 1,000 questions (50 topics x 5 phrasings x 4 places), so
the 100,000 call texts need only 1,000 embeddings: the embedding cache dedups identical texts and
the bench runs in minutes. Embedding 100,000 *distinct* texts would take ~100,000 / (the
throughput reported) seconds on this machine.

Run with ``python -m bench scale`` (``REPLAY_SIM_BENCH_RECORDINGS`` changes the big store's size).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from bench import startup
from replay_sim.replay.stdio.start.write import write_start_table
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import CachedEmbedder, default_embedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.tooleffects import keep_effects
from replay_sim.store import ServerRecord, Store

SERVERS = 10
TOOLS_PER_SERVER = 10
SESSION_CALLS = 10
PROJECTS = ["atlas", "borealis", "cygnus", "draco", "eridanus"]
LIMITS = [10, 25]
TOPICS = [
    "password", "refund", "order", "invoice", "shipping", "account", "login", "discount", "warranty",
    "return", "subscription", "billing address", "credit card", "gift card", "delivery date",
    "tracking number", "cancellation", "exchange", "coupon", "loyalty points", "newsletter",
    "two-factor authentication", "profile picture", "email address", "phone number", "payment method",
    "receipt", "tax invoice", "bulk order", "pre-order", "backorder", "price match", "store pickup",
    "damaged item", "missing package", "wrong size", "gift wrapping", "membership", "trial period",
    "data export", "account deletion", "privacy settings", "notification settings", "api key",
    "team members", "user roles", "audit log", "usage limits", "storage quota", "support ticket",
]  # fmt: skip
ASKS = [
    "how do I change my {}",
    "where can I see my {}",
    "problem with my {}",
    "question about the {}",
    "help with {}",
]
PLACES = ["", " in the mobile app", " on the website", " for my company account"]


def question(index: int) -> str:
    """The ``index``-th question of the 1,000-question vocabulary."""
    topic = TOPICS[index % len(TOPICS)]
    ask = ASKS[(index // len(TOPICS)) % len(ASKS)]
    place = PLACES[(index // (len(TOPICS) * len(ASKS))) % len(PLACES)]
    return ask.format(topic) + place


VOCABULARY = len(TOPICS) * len(ASKS) * len(PLACES)


def tool_spec(name: str) -> dict[str, Any]:
    """A read-only search tool with an identifier, a number and free text."""
    return {
        "name": name,
        "description": f"Search {name.split('_', 1)[-1]} records.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "project": {"type": "string", "description": "Which project to search"},
                "limit": {"type": "integer", "default": 10},
                "query": {"type": "string", "description": "What to look for, in plain words"},
            },
            "required": ["project", "query"],
        },
        "annotations": {"readOnlyHint": True},
    }


def tool_names(server: int) -> list[str]:
    """The tools of server ``server``."""
    return [f"search_s{server}_t{t}" for t in range(TOOLS_PER_SERVER)]


def answer(tool: str, project: str, limit: int, text: str) -> dict[str, Any]:
    """The recorded result: it depends on every argument (and does not echo the question)."""
    article = zlib.crc32(f"{tool}|{project}|{text}".encode())
    body = f"{project}: {limit} articles, best match KB-{article:08x}"
    return {"content": [{"type": "text", "text": body}], "isError": False}


def generate(path: Path, recordings: int, servers: int = SERVERS, seed: int = 0) -> Store:
    """Write a store of ``recordings`` calls over ``servers`` servers x 10 tools (one transaction).

    Args:
        path: The new store's file.
        recordings: How many tools/call recordings.
        servers: How many servers (each with 10 tools).
        seed: Makes the store reproducible.

    Returns:
        The open store.
    """
    rng = random.Random(seed)
    store = Store(path)
    with store.transaction("generate"):
        for s in range(servers):
            server = f"svc{s}"
            store.put_server(ServerRecord(server, {"name": server, "version": "1"}, {"tools": {}}))
            store.put_listing(server, "tools/list", {"tools": [tool_spec(t) for t in tool_names(s)]})
        for i in range(recordings):
            session_no = i // SESSION_CALLS
            s = session_no % servers
            server, session = f"svc{s}", f"sess-{session_no}"
            if i % SESSION_CALLS == 0:
                store.start_session(server, session)
            tool = rng.choice(tool_names(s))
            arguments = {
                "project": rng.choice(PROJECTS),
                "limit": rng.choice(LIMITS),
                "query": question(rng.randrange(VOCABULARY)),
            }
            store.record_call(
                server,
                "tools/call",
                {"name": tool, "arguments": arguments},
                result=answer(tool, arguments["project"], arguments["limit"], arguments["query"]),
                session=session,
                seq=i % SESSION_CALLS,
                latency_ms=5.0,
            )
    return store


def recorded_calls(store: Store, count: int, seed: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """``count`` recorded calls of ``count`` different sessions, each ``(server, params)``.

    Different sessions, so that each call's session history is read once, in a big store as in a
    small one (the small store has 100 sessions: ask for at most 100).
    """
    rng = random.Random(seed)
    sessions = rng.sample(range(len(store.sessions())), count)
    found = []
    for number in sessions:
        recordings = store.recordings(session=f"sess-{number}")
        rec = recordings[rng.randrange(len(recordings))]
        found.append((rec.server, rec.params))
    return found


def paraphrases(store: Store, count: int, seed: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """``count`` never-recorded rewordings of recorded calls (capitalised, with question marks)."""
    calls = recorded_calls(store, count, seed)
    out = []
    for i, (server, params) in enumerate(calls):
        arguments = dict(params["arguments"])
        arguments["query"] = arguments["query"].capitalize() + "?" * (1 + i % 3) + " " * (i // 3 % 2)
        out.append((server, {"name": params["name"], "arguments": arguments}))
    return out


def _p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _timed(resolver: Resolver, server: str, params: dict[str, Any]) -> tuple[float, Tier]:
    started = time.perf_counter()
    found = resolver.resolve(server, "tools/call", params, [])
    return time.perf_counter() - started, found.tier


def resolve_p50(stores: dict[str, tuple[Store, Path]], calls: int = 100) -> dict[str, dict[str, Any]]:
    """Exact and semantic resolve p50 (ms) per store, interleaved call by call, resolvers warm (every
    tool called once before).

    Exact: recorded calls of different sessions, each resolved once (nothing about it cached) and
    again (cached). Semantic: never-recorded rewordings, so each one embeds its query.
    """
    resolvers, work = {}, {}
    for name, (store, index_dir) in stores.items():
        started = time.perf_counter()
        resolvers[name] = Resolver(store, index_dir=index_dir)
        resolvers[name].warm()
        work[name] = (recorded_calls(store, calls), paraphrases(store, calls), time.perf_counter() - started)
        # Warm as a serving replay is once each tool has been called: a tool's first canonical or
        # semantic call builds its matching state (a rewording of its own: no query embedding cached).
        for server, method, tool in sorted(store.names()):
            recorded = store.recordings(server, method=method, name=tool)[0].params
            arguments = {**recorded["arguments"], "query": recorded["arguments"]["query"] + " please"}
            resolvers[name].resolve(server, method, {"name": tool, "arguments": arguments}, [])
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
    tiers: dict[str, list[Tier]] = {name: [] for name in stores}
    for label in ("exact_first", "exact_again", "semantic"):
        for i in range(calls):
            for name, resolver in resolvers.items():
                exact, reworded, _ = work[name]
                server, params = (reworded if label == "semantic" else exact)[i]
                elapsed, tier = _timed(resolver, server, params)
                samples[name].setdefault(label, []).append(elapsed)
                if label == "semantic":
                    tiers[name].append(tier)
                else:
                    assert tier is Tier.EXACT
    return {
        name: {
            **{label: _p50_ms(found) for label, found in samples[name].items()},
            "semantic_hits": tiers[name].count(Tier.SEMANTIC),
            "warm_up_s": work[name][2],
        }
        for name in stores
    }


def embedding_throughput(texts: list[str], rounds: int = 3) -> dict[str, float]:
    """Texts/s of the packaged model on ``texts`` (all distinct), per thread count and batch size.

    Best of ``rounds`` interleaved rounds: other processes on a shared machine only ever slow a
    round down. Also checks that the vectors do not depend on the setting (they would change
    answers and snapshot ids).
    """
    import torch

    model = default_embedder()
    model.encode(["load the model"])
    threads, batch_size = torch.get_num_threads(), model.batch_size
    rates: dict[str, float] = {}
    reference = None
    try:
        for _ in range(rounds):
            for count in sorted({1, os.cpu_count() or 1}):
                torch.set_num_threads(count)
                for batch in (64, 256):
                    model.batch_size = batch
                    started = time.perf_counter()
                    vectors = model.encode(texts)
                    rate = len(texts) / (time.perf_counter() - started)
                    label = f"{count} thread(s), batch {batch}"
                    rates[label] = max(rates.get(label, 0.0), rate)
                    reference = vectors if reference is None else reference
                    if not np.array_equal(vectors, reference):
                        rates[label + " (other vectors!)"] = rate
    finally:
        torch.set_num_threads(threads)
        model.batch_size = batch_size
    return rates


def main() -> None:
    """Generate the stores, build their indexes and print every figure."""
    recordings = int(os.environ.get("REPLAY_SIM_BENCH_RECORDINGS", "100000"))
    folder = Path(tempfile.mkdtemp(prefix="replay-sim-scale-"))
    try:
        started = time.perf_counter()
        big = generate(folder / "big.db", recordings)
        small = generate(folder / "small.db", 1000, servers=1)
        print(f"   generated {recordings:,} recordings (10 servers x 10 tools) and 1,000 (1 x 10) in "
              f"{time.perf_counter() - started:.0f} s; free text from {VOCABULARY:,} questions")  # fmt: skip
        rates = embedding_throughput([question(i) for i in range(VOCABULARY)])
        shown = ", ".join(f"{k} {v:,.0f} texts/s" for k, v in rates.items())
        print(f"   embedding throughput, model loaded: {shown}")
        started = time.perf_counter()
        embedder = CachedEmbedder(default_embedder(), big)
        build_index(big, embedder=embedder, directory=folder / "big-index")
        built = time.perf_counter() - started
        keep_effects(big)  # as `replay-sim index build` does
        big.copy_to(folder / "served.db")  # served as built (the resolvers below read and write big)
        started = time.perf_counter()
        answered = write_start_table(folder / "served.db", folder / "big-index")  # as `index build` does
        print(f"   stdio start table: {answered:,} calls in {time.perf_counter() - started:.1f} s")
        print(f"   index build, {recordings:,} recordings: {built:.1f} s ({recordings / built:,.0f} calls/s; "
              f"{embedder.encoded:,} texts embedded, {embedder.reused:,} from the cache)")  # fmt: skip
        build_index(small, directory=folder / "small-index")
        found = resolve_p50({"big": (big, folder / "big-index"), "small": (small, folder / "small-index")})
        for label in ("exact_first", "exact_again", "semantic"):
            ratio = found["big"][label] / found["small"][label]
            print(f"   {label} p50: {found['big'][label]:.3f} ms at {recordings:,} vs "
                  f"{found['small'][label]:.3f} ms at 1,000 (ratio {ratio:.2f}; target <= 1.2)")  # fmt: skip
        print(f"   semantic hits: {found['big']['semantic_hits']} and {found['small']['semantic_hits']} "
              f"of 100; resolver warm-up (index, model, every tool's threshold): "
              f"{found['big']['warm_up_s']:.1f} s and {found['small']['warm_up_s']:.1f} s")  # fmt: skip
        ((server, params),) = recorded_calls(big, 1, seed=3)
        big.close()
        small.close()
        served = (folder / "served.db", folder / "big-index", server, params["name"], params["arguments"])
        first = startup.compare(*served)
        stdio = startup.compare_stdio(*served)
        startup.report(first, stdio, f"{recordings:,} recordings (tool effects kept by the build)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
