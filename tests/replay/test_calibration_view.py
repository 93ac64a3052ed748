"""The calibration view (``/api/calibration``) and the dashboard's reliability diagram, over real HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from replay_helpers import CHROMIUM, render_dashboard
from resolver_helpers import confidence_store

from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.learning import learn
from replay_sim.resolve.confidence.population import summary
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store


@pytest.fixture(scope="module")
def learned(
    tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> tuple[Path, Path]:
    """A store and its index folder, the confidence model learned as ``index build`` learns it."""
    folder = tmp_path_factory.mktemp("calibration-view")
    db = confidence_store(folder / "r.db")
    with Store(db) as store:
        Resolver(store, embedder=embedder, index_dir=folder / "index").index()
        learn(store, folder / "index")
    return db, folder / "index"


def _served(db: Path, index: Path | None, embedder: SentenceTransformerEmbedder, **options: object) -> Replay:
    store = Store(db)
    return Replay(store, resolver=Resolver(store, embedder=embedder, index_dir=index, **options))  # type: ignore[arg-type]


def test_the_calibration_api_serves_the_models_reliability_diagram_and_the_operating_points(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    db, index = learned
    config = MatchConfig.from_dict({"tools": {"srv/counter": {"min_confidence": 0.99}}})
    replay = _served(db, index, embedder, config=config, min_confidence=0.9)
    with serving_in_thread(create_app(replay)) as url:
        view = httpx2.get(f"{url}/api/calibration", timeout=30).json()
        page = httpx2.get(f"{url}/", timeout=30).text
        script = httpx2.get(f"{url}/static/dashboard.js", timeout=30).text
    assert view["model"] == "learned" and view["examples"] > 0
    assert view["min_confidence"] == 0.9 and view["per_tool"] == {"srv/counter": 0.99}
    assert {w["feature"] for w in view["weights"]} >= {"other_state"}  # the learned weights, named
    diagram = view["reliability"]
    assert diagram["validated"] == "by tool" and diagram["examples"] == view["examples"]
    assert diagram["bins"] and sum(b[2] for b in diagram["bins"]) == diagram["examples"]
    for low, high, n, mean, accuracy in diagram["bins"]:
        assert low <= mean <= high and 0.0 <= accuracy <= 1.0 and n > 0
    assert 0.0 <= diagram["ece"] <= 1.0
    assert 'id="reliability"' in page and "/api/calibration" in script  # the dashboard draws it
    # And the population the model was fitted toward: real servers, each scored without its own.
    population = view["population"]
    assert population["validated"] == "by server" and population["folds"] == 15
    assert sum(b[2] for b in population["bins"]) == population["examples"] > 0


def test_without_a_learned_model_the_calibration_api_says_it_serves_the_populations(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    db, _ = learned
    with serving_in_thread(create_app(_served(db, None, embedder))) as url:
        view = httpx2.get(f"{url}/api/calibration", timeout=30).json()
    assert view["model"] == "population" and view["examples"] == view["population"]["examples"] > 0
    assert view["reliability"] == view["population"] and view["min_confidence"] is None


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_the_dashboard_draws_the_reliability_diagram(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    db, index = learned
    replay = _served(db, index, embedder)
    bins = replay.resolver.confidence.model.calibration["bins"]  # type: ignore[index]
    with serving_in_thread(create_app(replay)) as url:
        done = render_dashboard(url)
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-ready="1"' in dom, dom[:2000]
    assert "validated by tool" in dom and "ECE " in dom and "operating point strict tiers" in dom
    shown = summary()
    assert shown is not None and f"fitted toward {shown['examples']} answers of 15 real servers" in dom
    for low, *_ in bins:  # a table row per bin
        assert f'<tr data-bin="{low:.1f}">' in dom
    assert dom.count("data-bin=") == 2 * len(bins)  # and a bar
    assert dom.count("<circle") == len(bins)  # and a dot at (mean confidence, accuracy)


def test_a_served_store_that_grows_serves_the_refitted_models_confidences_over_real_http(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    """Sandbox answers or a backfill grow the served store: the model is refitted in the background
    and the answers after it carry its confidences; ``/api/calibration`` says how it was updated."""
    import shutil
    import time

    import anyio
    from mcp import Client
    from resolver_helpers import record_x

    from replay_sim.protocol import MATCH_META_KEY
    from replay_sim.store import ServerRecord

    db, index = shutil.copy(learned[0], tmp_path / "served.db"), tmp_path / "index"
    shutil.copytree(learned[1], index)
    with Store(db) as store:  # the same recordings, served: a server row
        store.put_server(ServerRecord("srv", {"name": "srv", "version": "1"}, {"tools": {}}))
    replay = _served(db, index, embedder)
    judge = replay.resolver.confidence
    assert judge.growth is not None
    judge.growth.interval = 0.0
    learned_model = judge.model

    async def confidence(url: str, episode: str) -> float:
        async with Client(f"{url}/episodes/{episode}/mcp/srv") as client:
            answer = await client.call_tool("pure", {"x": 100})
            return float(answer.meta[MATCH_META_KEY]["confidence"])  # type: ignore[index]

    with serving_in_thread(create_app(replay)) as url:
        before = anyio.run(confidence, url, "e1")
        for i in range(1, 7):  # pure(100) answered six other ways, recorded into the served store
            record_x(replay.store, f"q{i}", "pure", 100, f"other {i}")
        grown = anyio.run(confidence, url, "e2")  # the old model, judging the grown evidence
        deadline = time.monotonic() + 60
        while (view := httpx2.get(f"{url}/api/calibration", timeout=30).json())["model"] != "incremental":
            assert time.monotonic() < deadline, view
            time.sleep(0.05)
        after = anyio.run(confidence, url, "e3")
    assert view["update"] == {"where": "serving", "kept": learned_model.examples, "formed": 6, "refits": 1}
    assert view["examples"] == learned_model.examples + 6
    assert judge.model is not learned_model and judge.model.learned_on != learned_model.learned_on
    assert before >= 0.9 and after < grown, (before, grown, after)
