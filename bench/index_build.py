"""Index build speed on distinct, realistic call texts: each lever measured on its own, in one run.

The texts are the shipped dev sets' recorded calls (``fixtures/probes*/recordings.jsonl``: git,
filesystem, memory, sqlite, a text editor, calculators …) with their arguments varied — other
words in a query, other file names in a path, other numbers — until ``N`` are distinct, so the
embedding cache helps nothing. Reported, in one process, interleaved rounds (best of each: other
processes on a shared machine only ever slow a round down), as texts/s and texts per CPU-second
(what a busy machine's share of a core does not hide), each with its ratio to the first row (how
``index build`` embedded before):

- the model, as the index build called it (chunks of 512 recordings, batch 64, one thread);
- each lever alone: texts sorted by length across the build, batch size, two threads
  (``OMP_WAIT_POLICY`` as set), the tokenizer's share, a dynamically int8-quantised copy;
  with each one's largest difference from the reference vectors;
- ``build_index`` end to end on a store of those calls: the default model and the opt-in
  ``minilm-static`` embedding, its token table cold and then warm (each into a fresh store, so
  nothing comes from the embedding cache).

Run with ``python -m bench index_build`` (``REPLAY_SIM_BENCH_TEXTS`` sets N, default 1,000).
"""

from __future__ import annotations

import copy
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import CachedEmbedder, SentenceTransformerEmbedder
from replay_sim.resolve.index import call_text
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.static_embedding import StaticEmbedder
from replay_sim.store import Store
from replay_sim.store.interchange import import_jsonl

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SOURCES = [FIXTURES / "probes" / "recordings.jsonl", FIXTURES / "probes2" / "recordings.jsonl"]
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "orbit",
    "launch",
    "window",
    "notes",
    "report",
    "budget",
    "quarterly",
    "summary",
    "user",
    "account",
    "project",
    "data",
    "archive",
    "release",
    "draft",
    "review",
    "invoice",
    "customer",
    "widget",
    "sales",
    "north",
    "south",
]


def _vary(value: Any, rng: random.Random) -> Any:
    """The same argument with other words, file names or numbers (its shape kept)."""
    if isinstance(value, str):
        if value.startswith("/"):
            head, _, tail = value.rpartition("/")
            return f"{head}/{rng.choice(WORDS)}{rng.randrange(1000)}-{tail}"
        words = value.split()
        at = rng.randrange(len(words) + 1)
        return " ".join(words[:at] + [rng.choice(WORDS) for _ in range(rng.randrange(1, 4))] + words[at:])
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value + rng.randrange(-50, 1000)
    if isinstance(value, float):
        return round(value * rng.random() * 3, 3)
    if isinstance(value, list):
        return [_vary(v, rng) for v in value]
    if isinstance(value, dict):
        return {k: _vary(v, rng) for k, v in value.items()}
    return value


def distinct_calls(count: int, seed: int = 7) -> list[str]:
    """JSONL lines: the fixtures' servers and listings, then ``count`` varied calls, all distinct texts."""
    head: list[str] = []
    calls: list[dict[str, Any]] = []
    for source in SOURCES:
        for line in source.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("type") == "call" and record.get("method") == "tools/call":
                calls.append(record)
            elif record.get("type") in ("server", "listing"):
                head.append(line)
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        record = copy.deepcopy(rng.choice(calls))
        record["params"]["arguments"] = _vary(record["params"].get("arguments") or {}, rng)
        text = json.dumps(record["params"], sort_keys=True)
        if text in seen:
            continue
        seen.add(text)
        record["session"], record["seq"] = f"bench-{len(out)}", 0
        out.append(json.dumps(record))
    return head + out


def store_of(path: Path, lines: list[str]) -> Store:
    """A new store holding ``lines``."""
    store = Store(path)
    import_jsonl(store, path.with_suffix(".jsonl"), lines)
    return store


def texts_of(store: Store) -> list[str]:
    """The call texts an index build of ``store`` embeds, in its order."""
    schemas = RecordedSchemas(store)
    out = []
    for rec in store.recordings(method="tools/call"):
        schema = schemas(rec.server, rec.name)
        out.append(call_text(rec.arguments, (schema.free_text or frozenset()) if schema else frozenset()))
    return out


def levers(
    model: SentenceTransformerEmbedder, texts: list[str], rounds: int
) -> list[tuple[str, float, float, float]]:
    """``(lever, texts/s, texts per CPU-second, largest difference from the reference vectors)``."""
    import torch

    st = model.load()
    quantised = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(st), {torch.nn.Linear}, dtype=torch.qint8
    )
    by_length = sorted(texts, key=len)
    back = np.argsort(sorted(range(len(texts)), key=lambda i: len(texts[i])), kind="stable")

    def encode(items: list[str], batch: int = 64, chunk: int = 512, model: Any = st) -> np.ndarray:
        parts = [
            model.encode(
                items[i : i + chunk], batch_size=batch, normalize_embeddings=True, show_progress_bar=False
            )
            for i in range(0, len(items), chunk)
        ]
        return np.concatenate(parts)

    def threads(count: int, run: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        def go() -> np.ndarray:
            torch.set_num_threads(count)
            try:
                return run()
            finally:
                torch.set_num_threads(1)

        return go

    cases: dict[str, Callable[[], np.ndarray]] = {
        "as built before: chunks of 512, batch 64, 1 thread": lambda: encode(texts),
        "sorted by length across the build": lambda: encode(by_length)[back],
        "sorted, batch 16": lambda: encode(by_length, 16)[back],
        "sorted, batch 32": lambda: encode(by_length, 32)[back],
        "sorted, batch 128": lambda: encode(by_length, 128)[back],
        f"sorted, 2 threads (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})": threads(
            2, lambda: encode(by_length)[back]
        ),
        "tokenising alone (fast tokenizer, sorted batches of 64)": lambda: _tokenise(st, by_length),
        "int8 dynamic quantisation (other vectors)": lambda: encode(by_length, model=quantised)[back],
    }
    torch.set_num_threads(1)
    reference = encode(texts)
    best: dict[str, tuple[float, float]] = {}
    worst: dict[str, float] = {}
    for _ in range(rounds):
        for label, run in cases.items():
            wall, cpu = time.perf_counter(), time.process_time()
            vectors = run()
            rates = len(texts) / (time.perf_counter() - wall), len(texts) / (time.process_time() - cpu)
            best[label] = max(best.get(label, (0.0, 0.0)), rates)
            if vectors.shape == reference.shape:
                worst[label] = float(np.abs(vectors - reference).max())
    return [(label, *best[label], worst.get(label, float("nan"))) for label in cases]


def _tokenise(st: Any, texts: list[str]) -> np.ndarray:
    for i in range(0, len(texts), 64):
        st.tokenizer(texts[i : i + 64], padding=True, truncation=True, max_length=st.max_seq_length)
    return np.zeros(0)


def build_rates(
    lines: list[str], other: list[str], folder: Path, model: SentenceTransformerEmbedder
) -> dict[str, tuple[float, float]]:
    """``(texts/s, texts per CPU-second)`` of ``build_index`` into a fresh store, per embedding.

    The static embedding starts with an empty token table (cold), as a new ``index build`` does;
    then builds a store of other calls with the table it filled (warm: what most of a large build
    is, its texts reusing tokens already seen).
    """
    static = StaticEmbedder(model)
    rates = {}
    runs = (
        ("minilm", model, lines),
        ("minilm-static", static, lines),
        ("minilm-static, warm", static, other),
    )
    for name, embedding, calls in runs:
        with store_of(folder / f"{name}.db", calls) as store:
            embedder = CachedEmbedder(embedding, store)
            wall, cpu = time.perf_counter(), time.process_time()
            build_index(store, embedder=embedder, directory=folder / f"{name}-index")
            rates[name] = (
                embedder.encoded / (time.perf_counter() - wall),
                embedder.encoded / (time.process_time() - cpu),
            )
    return rates


def main() -> None:
    """Generate the calls, measure each lever and both builds, print texts/s and ratios."""
    count = int(os.environ.get("REPLAY_SIM_BENCH_TEXTS", "1000"))
    lines = distinct_calls(count)
    with tempfile.TemporaryDirectory(prefix="replay-sim-index-build-") as tmp:
        folder = Path(tmp)
        with store_of(folder / "texts.db", lines) as store:
            texts = texts_of(store)
        lengths = [len(t) for t in texts]
        print(
            f"   {len(texts):,} distinct call texts from the fixtures' calls: "
            f"{statistics.mean(lengths):.0f} characters on average, {max(lengths)} at most",
            flush=True,
        )
        model = SentenceTransformerEmbedder(threads=1)
        model.encode(["load the model"])
        rows = levers(model, texts, rounds=2)
        wall0, cpu0 = rows[0][1:3]
        for label, wall, cpu, diff in rows:
            print(
                f"   {label}: {wall:,.0f} texts/s ({wall / wall0:.2f}x), {cpu:,.0f} per CPU-second "
                f"({cpu / cpu0:.2f}x); vectors differ by {diff:.1e}",
                flush=True,
            )
        built = build_rates(lines, distinct_calls(count, seed=8), folder, model)
        wall0, cpu0 = built["minilm"]
        for name, (wall, cpu) in built.items():
            print(
                f"   index build, {name}: {wall:,.0f} texts/s ({wall / wall0:.2f}x), "
                f"{cpu:,.0f} per CPU-second ({cpu / cpu0:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
