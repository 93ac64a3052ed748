"""The confidence model as the store grows: refitted while a writable store is served, learned
incrementally at ``index build`` (real SQLite store, real embedding model)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from replay_sim.canonical import call_key
from replay_sim.resolve.confidence.features import FEATURES
from replay_sim.resolve.confidence.incremental import EXAMPLES_FILE, Kept
from replay_sim.resolve.confidence.learning import learn
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from tests.resolver_helpers import confidence_store, record_x

SESSIONS = 6
WEIGHT = {f.name: i for i, f in enumerate(FEATURES)}


def _learned(folder: Path, embedder: SentenceTransformerEmbedder) -> tuple[Path, Path]:
    db, index = folder / "r.db", folder / "index"
    confidence_store(db, SESSIONS)
    with Store(db) as store:
        Resolver(store, embedder=embedder, index_dir=index).index()
        learn(store, index)
    return db, index


def _until(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def test_a_served_store_that_grows_gets_its_model_refitted_without_an_index_build(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db, index = _learned(tmp_path, embedder)
    learned = ConfidenceModel.load(index)
    assert learned is not None and learned.source == "learned" and learned.update is None
    params = {"name": "pure", "arguments": {"x": 100}}
    history = [call_key("srv", "tools/call", "pure", {"x": 7})]
    with Store(db) as store:
        resolver = Resolver(store, embedder=embedder, index_dir=index)
        judge = resolver.confidence
        assert judge.growth is not None
        judge.growth.interval = 0.0
        before = resolver.resolve("srv", "tools/call", params, history)
        assert before.confidence is not None and before.confidence >= 0.9, before.drivers  # pure agreed
        # As a serving store grows (sandbox answers, backfill): pure(100) now answered six other ways.
        for i in range(1, 7):
            record_x(store, f"q{i}", "pure", 100, f"other {i}")
        resolver.resolve("srv", "tools/call", params, history)  # sees the growth: a refit is started
        _until(lambda: judge.model.source == "incremental")
        refitted = judge.model
        after = resolver.resolve("srv", "tools/call", params, history)
    # The model's source says how: six new recordings' examples formed, the 39 learned ones kept.
    assert refitted.update == {"where": "serving", "kept": learned.examples, "formed": 6, "refits": 1}
    assert refitted.examples == learned.examples + 6
    assert refitted.learned_on == (learned.learned_on[0] + 6, learned.learned_on[1] + 6)  # type: ignore[index]
    # The new examples are candidates that disagreed: the weight of disagreement moved down (as far
    # as six examples move a weight the population holds as if by 100), and the served confidence
    # (judged with the refitted model) with it.
    disagrees = WEIGHT["call_disagrees"]
    assert refitted.weights[disagrees] < learned.weights[disagrees] - 0.01
    assert dict(after.drivers)["call_disagrees"] == pytest.approx(refitted.weights[disagrees], abs=1e-3)
    assert after.confidence is not None and after.confidence < 0.6 < before.confidence, after.drivers
    # Kept with the index, so the next index build starts from them; the refitted tool is marked stale.
    kept = Kept.load(index)
    on_disk = ConfidenceModel.load(index)
    assert kept is not None and len(kept.examples) == refitted.examples
    assert kept.stale == {("srv", "tools/call", "pure")}
    assert on_disk is not None and on_disk.weights == pytest.approx(refitted.weights, abs=1e-5)


def test_a_read_only_store_never_changes_its_model(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """A served snapshot's store is read-only: its model is what the snapshot id names."""
    db, index = _learned(tmp_path, embedder)
    learned = ConfidenceModel.load(index)
    assert learned is not None
    call = {"name": "pure", "arguments": {"x": 100}}
    with Store(db) as writer, Store(db, readonly=True) as frozen:
        served = Resolver(writer, embedder=embedder, index_dir=index)
        snapshot = Resolver(frozen, embedder=embedder, index_dir=index)
        for resolver in (served, snapshot):
            assert resolver.confidence.growth is not None
            resolver.confidence.growth.interval = 0.0
            resolver.resolve("srv", "tools/call", call)
        record_x(writer, "late", "pure", 100, "other")
        for resolver in (served, snapshot):
            assert resolver.resolve("srv", "tools/call", call).confidence is not None
        _until(lambda: served.confidence.model.source == "incremental")  # the writable one refits
        assert snapshot.confidence.growth.refits == 0  # type: ignore[union-attr]
        assert snapshot.confidence.model.weights == learned.weights
        assert snapshot.confidence.model.source == "learned"


def test_index_build_on_a_grown_store_forms_only_the_new_and_affected_examples(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db, index = _learned(tmp_path, embedder)
    learned = ConfidenceModel.load(index)
    kept = Kept.load(index)
    assert learned is not None and kept is not None and len(kept.examples) == learned.examples
    with Store(db) as store:
        counters = len(store.recordings("srv", name="counter"))
        for n in range(1, SESSIONS + 2):  # one more counting session: only `counter` grew
            record_x(store, f"c{SESSIONS + 1}", "counter", 0, str(n))
        Resolver(store, embedder=embedder, index_dir=index).index()
        shutil.copytree(index, tmp_path / "full")
        grown = learn(store, index)
        full = learn(store, tmp_path / "full", full=True)
    # Every `counter` example is formed again (the new recordings change its neighbours' candidates
    # and counts), none of `pure`'s: the same model a learn from scratch gives.
    assert grown.source == "incremental" and full.source == "learned"
    assert grown.update == {
        "where": "index build",
        "kept": sum(1 for e in kept.examples if e.tool == "pure"),
        "formed": counters + SESSIONS + 1,
        "new": SESSIONS + 1,
    }
    assert grown.examples == full.examples and grown.positives == full.positives
    assert np.allclose(grown.weights, full.weights, atol=1e-3) and abs(grown.bias - full.bias) < 1e-3
    assert grown.calibration == full.calibration
    assert (index / EXAMPLES_FILE).read_text() == (tmp_path / "full" / EXAMPLES_FILE).read_text()


def test_index_build_learns_from_scratch_when_the_kept_examples_do_not_fit_the_store(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """Another matching config (or a recording taken back, another embedding model…): all again."""
    from replay_sim.resolve.calibration import MatchConfig

    db, index = _learned(tmp_path, embedder)
    with Store(db) as store:
        again = learn(store, index)
        other = learn(store, index, MatchConfig(floor=0.8))
    assert again.source == "incremental" and again.update is not None and again.update["formed"] == 0
    assert other.source == "learned" and other.update is None
