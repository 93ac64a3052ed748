"""Calibrated confidence: learned by leave-one-out from a real store, gating answers at an operating point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replay_sim.canonical import call_key
from replay_sim.replay.core.provenance import match_of, provenance
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.features import FEATURES
from replay_sim.resolve.confidence.forming import form
from replay_sim.resolve.confidence.learning import learn
from replay_sim.resolve.confidence.leaveoneout import Example, validated
from replay_sim.resolve.confidence.model import MODEL_FILE, PRIOR, ConfidenceModel, fit
from replay_sim.resolve.confidence.reliability import Scored, ece, reliability, render_calibration
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.evaluate import Grade, Report
from replay_sim.resolve.lineage import DIVERGED
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from tests.resolver_helpers import confidence_store, record_x, x_tool

SESSIONS = 6


@pytest.fixture(scope="module")
def learned(
    tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> tuple[Path, Path]:
    """A store, and its index folder with the confidence model learned at build."""
    from replay_sim.store import Store

    folder = tmp_path_factory.mktemp("confidence")
    db = confidence_store(folder / "r.db", SESSIONS)
    with Store(db) as store:
        Resolver(store, embedder=embedder, index_dir=folder / "index").index()
        learn(store, folder / "index")
    return db, folder / "index"


def _resolve(
    db: Path, index: Path, embedder: SentenceTransformerEmbedder, x: object, name: str, **options: object
) -> Resolution:
    """Resolve ``name(x)`` in an episode that called ``pure(7)`` first (for ``pure``), or ``counter(0)``
    more often than any recorded session (for ``counter``): every recording of the tool was made
    from another state."""
    from replay_sim.store import Store

    store = Store(db)
    resolver = Resolver(store, embedder=embedder, index_dir=index, **options)  # type: ignore[arg-type]
    history = [call_key("srv", "tools/call", "pure", {"x": 7})]
    if name == "counter":
        history = [call_key("srv", "tools/call", "counter", {"x": 0})] * (SESSIONS + 1)
    return resolver.resolve("srv", "tools/call", {"name": name, "arguments": {"x": x}}, history)


def _features(resolver: Resolver, name: str, arguments: dict[str, object], history: list[str]) -> set[str]:
    """The features of the best candidate the store holds for ``name(arguments)`` after ``history``."""
    formed = form(resolver, "srv", "tools/call", name, dict(arguments), resolver.lookup.trail(history))
    assert formed is not None
    x = resolver.confidence.features(resolver, formed, "tools/call")
    return {f.name for f, on in zip(FEATURES, x, strict=True) if on}


def test_index_build_keeps_the_learned_model_in_the_index_folder(learned: tuple[Path, Path]) -> None:
    _, index = learned
    model = ConfidenceModel.load(index)
    assert (index / MODEL_FILE).is_file() and model is not None
    assert model.source == "learned" and model.examples > 0 and 0 < model.positives < model.examples
    # Its own calibration, for the dashboard: one server, so each tool is scored by a model of the other.
    summary = model.calibration
    assert summary is not None and summary["validated"] == "by tool" and summary["folds"] == 2
    assert sum(b[2] for b in summary["bins"]) == summary["examples"] == model.examples
    assert 0.0 <= summary["ece"] <= 1.0


def test_a_state_independent_tool_gets_a_high_confidence_and_a_disagreeing_one_a_low_one(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    db, index = learned
    pure = _resolve(db, index, embedder, 100, "pure")
    counter = _resolve(db, index, embedder, 0, "counter")
    # Both are strict misses (recorded only from other states), with their best candidate's confidence.
    assert pure.tier is Tier.MISS and counter.tier is Tier.MISS
    assert pure.confidence is not None and counter.confidence is not None
    assert pure.confidence >= 0.9, pure.drivers
    assert counter.confidence <= 0.5, counter.drivers
    # counter(0)'s recordings say 1, 2, 3…, each made after more calls of counter, which changes state.
    from replay_sim.store import Store

    resolver = Resolver(Store(db), embedder=embedder, index_dir=index)
    history = [call_key("srv", "tools/call", "counter", {"x": 0})] * (SESSIONS + 1)
    assert {"call_varies", "gap_writes", "tool_inconsistent"} <= _features(
        resolver, "counter", {"x": 0}, history
    )


def test_a_stateful_tools_strict_hit_from_the_episodes_own_state_keeps_a_high_confidence(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    """``counter(0)`` answers 1, 2, 3… across states, but every recording made after two calls of it
    said 3: the strict resolver matched that state, so the other states' answers say nothing
    against it, and an explicit operating point below the strict default must not refuse it."""
    from replay_sim.store import Store

    db, index = learned
    history = [call_key("srv", "tools/call", "counter", {"x": 0})] * 2
    params = {"name": "counter", "arguments": {"x": 0}}
    for point in (None, 0.95, 0.9):
        resolver = Resolver(Store(db), embedder=embedder, index_dir=index, min_confidence=point)
        hit = resolver.resolve("srv", "tools/call", params, history)
        assert hit.tier is Tier.EXACT and hit.recording is not None, (point, hit.reason)
        assert "3" in str(hit.recording.result)
        assert hit.confidence is not None and hit.confidence >= 0.95, hit.drivers
        drivers = dict(hit.drivers)
        assert "call_agrees" in drivers  # the recordings from this state agree: 3 each time
        assert "call_disagrees" not in drivers and "tool_inconsistent" not in drivers


def test_an_episode_that_lost_track_of_its_state_doubts_every_recording(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    """After a state change no recording followed (a ``DIVERGED`` step), the episode's state is one
    nobody recorded: a candidate says ``diverged`` and is doubted more than after a recorded one."""
    from replay_sim.store import Store

    db, index = learned
    resolver = Resolver(Store(db), embedder=embedder, index_dir=index)
    step = call_key("srv", "tools/call", "pure", {"x": 7})
    known = resolver.resolve("srv", "tools/call", {"name": "pure", "arguments": {"x": 100}}, [step])
    lost = resolver.resolve("srv", "tools/call", {"name": "pure", "arguments": {"x": 100}}, [DIVERGED + step])
    assert "diverged" in _features(resolver, "pure", {"x": 100}, [DIVERGED + step])
    assert "diverged" not in _features(resolver, "pure", {"x": 100}, [step])
    assert known.confidence is not None and lost.confidence is not None
    assert lost.confidence < known.confidence


def test_an_operating_point_serves_a_confident_candidate_and_refuses_a_doubtful_one(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    db, index = learned
    served = _resolve(db, index, embedder, 100, "pure", min_confidence=0.9)
    assert served.tier is Tier.EXACT and served.recording is not None
    assert served.recording.result is not None and "100" in str(served.recording.result)
    assert served.step == served.recording.key  # the episode follows the recording it was served
    refused = _resolve(db, index, embedder, 0, "counter", min_confidence=0.9)
    assert refused.tier is Tier.MISS and refused.recording is None


def test_without_an_operating_point_the_strict_tiers_decide_and_the_provenance_says_how_sure(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    from replay_sim.store import Store

    db, index = learned
    resolver = Resolver(Store(db), embedder=embedder, index_dir=index)
    hit = resolver.resolve("srv", "tools/call", {"name": "pure", "arguments": {"x": 1}}, [])
    assert hit.tier is Tier.EXACT and hit.confidence is not None and hit.confidence > 0.9
    match = provenance(hit, None)
    assert match["confidence"] == hit.confidence and match["drivers"]
    assert match_of({"_meta": {"replay-sim/match": match}}).confidence == hit.confidence  # type: ignore[union-attr]
    # A hit below a per-tool operating point goes to the miss policy, naming why.
    strict = MatchConfig.from_dict({"tools": {"srv/pure": {"min_confidence": 1.0}}})
    refused = Resolver(Store(db), config=strict, embedder=embedder, index_dir=index).resolve(
        "srv", "tools/call", {"name": "pure", "arguments": {"x": 1}}, []
    )
    assert refused.tier is Tier.MISS and "below the operating point 1.0" in refused.reason
    assert refused.candidates and refused.candidates[0].recording_id == hit.recording.id  # type: ignore[union-attr]


def test_a_request_may_ask_for_its_own_operating_point(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    from replay_sim.store import Store

    db, index = learned
    resolver = Resolver(Store(db), embedder=embedder, index_dir=index, min_confidence=0.5)
    params = {"name": "pure", "arguments": {"x": 1}}
    assert resolver.resolve("srv", "tools/call", params, []).hit
    assert not resolver.resolve("srv", "tools/call", params, [], min_confidence=1.0).hit


def test_the_fit_holds_each_weight_to_its_sign_and_pulls_toward_the_prior() -> None:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 2, size=(400, len(FEATURES))).astype(float)
    disagrees = [f.name for f in FEATURES].index("call_disagrees")
    labels = rows[:, disagrees]  # disagreement "predicts" being right: the sign forbids learning that
    _, weights = fit(rows, labels)
    assert weights[disagrees] <= 0.0
    for feature, weight in zip(FEATURES, weights, strict=True):
        assert feature.sign == 0 or feature.sign * weight >= 0
    assert fit(np.zeros((0, len(FEATURES))), np.zeros(0)) == (PRIOR.bias, PRIOR.weights)


def test_a_model_file_round_trips_and_a_broken_one_falls_back_to_none(tmp_path: Path) -> None:
    model = ConfidenceModel(1.5, tuple(0.1 * i for i in range(len(FEATURES))), 10, 7, {"s\tt": (2, 1)})
    model.save(tmp_path)
    loaded = ConfidenceModel.load(tmp_path)
    assert loaded is not None and loaded.tools == {"s\tt": (2, 1)} and loaded.examples == 10
    assert loaded.predict(np.ones(len(FEATURES))) == pytest.approx(
        model.predict(np.ones(len(FEATURES))), 1e-5
    )
    (tmp_path / MODEL_FILE).write_text("{not json")
    assert ConfidenceModel.load(tmp_path) is None


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([(0.95, True)] * 19 + [(0.95, False)], 0.0),
        ([(0.9, False)] * 10, 0.9),
        ([(0.25, True), (0.25, False), (0.75, True), (0.75, True)], 0.25),
        ([], 0.0),
    ],
)
def test_expected_calibration_error(pairs: list[tuple[float, bool]], expected: float) -> None:
    assert ece(pairs) == pytest.approx(expected)


def test_reliability_rows_count_every_answer_once() -> None:
    pairs = [(0.05, False), (0.55, True), (1.0, True), (0.99, False)]
    rows = reliability(pairs)
    assert sum(r[2] for r in rows) == len(pairs) and rows[-1][:3] == (0.9, 1.0, 2)


def test_a_request_names_its_own_operating_point_in_meta_over_real_http(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    import shutil

    import anyio
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from replay_sim.listener import serving_in_thread
    from replay_sim.protocol import MATCH_META_KEY, MIN_CONFIDENCE_META_KEY
    from replay_sim.replay.core.replay import Replay
    from replay_sim.replay.http.app import create_app
    from replay_sim.store import ServerRecord, Store

    db, index = learned
    store = Store(shutil.copy(db, tmp_path / "served.db"))  # the same recordings, served: a server row
    store.put_server(ServerRecord("srv", {"name": "srv", "version": "1"}, {"tools": {}}))
    replay = Replay(store, resolver=Resolver(store, embedder=embedder, index_dir=index))

    async def calls(url: str) -> tuple[dict[str, object], dict[str, object]]:
        async with Client(f"{url}/episodes/e1/mcp/srv") as client:
            plain = await client.call_tool("pure", {"x": 1})
            strict = await client.call_tool("pure", {"x": 1}, meta={MIN_CONFIDENCE_META_KEY: 1.0})
            with pytest.raises(MCPError, match="must be a number in"):
                await client.call_tool("pure", {"x": 1}, meta={MIN_CONFIDENCE_META_KEY: "high"})
            return plain.meta[MATCH_META_KEY], strict.meta[MATCH_META_KEY]  # type: ignore[index]

    with serving_in_thread(create_app(replay)) as url:
        plain, strict = anyio.run(calls, url)
    assert plain["status"] == "exact"  # the strict tiers decide: its exact repeat is served
    assert strict["status"] == "miss"  # below this request's own operating point (the fast path too)


def test_once_the_store_grows_a_tools_evidence_is_counted_from_the_store_not_the_model(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """The model keeps each tool's repeated-call counts for the store it was learned on; recordings
    added while serving (sandbox answers, backfill, an import) must count at once."""
    from replay_sim.store import Store

    db, index = tmp_path / "r.db", tmp_path / "index"
    with Store(db) as store:
        store.put_listing(
            "srv", "tools/list", {"tools": [x_tool("read", {"readOnlyHint": True}), x_tool("poke")]}
        )
        for i in range(1, 5):
            record_x(store, f"s{i}", "poke", i, "ok")
            record_x(store, f"s{i}", "read", 100, "100")
            record_x(store, f"s{i}", "read", 200, "200")
        Resolver(store, embedder=embedder, index_dir=index).index()
        model = learn(store, index)
    assert model.learned_on is not None and model.tools is not None
    assert model.tools["srv\tread"] == (2, 0)  # read(100) and read(200), each recorded alike four times
    params = {"name": "read", "arguments": {"x": 100}}
    history = [call_key("srv", "tools/call", "poke", {"x": i}) for i in (1, 2)]  # a state never recorded
    with Store(db) as store:
        resolver = Resolver(store, embedder=embedder, index_dir=index)
        before = resolver.resolve("srv", "tools/call", params, history)
        seen_before = _features(resolver, "read", params["arguments"], history)
        # Later, read(300) is answered two ways from the initial state: the tool is not consistent.
        record_x(store, "late-1", "read", 300, "300")
        record_x(store, "late-2", "read", 300, "301")
        after = resolver.resolve("srv", "tools/call", params, history)
        seen_after = _features(resolver, "read", params["arguments"], history)
    assert before.tier is Tier.MISS and after.tier is Tier.MISS  # a candidate from another state
    assert "tool_consistent" in seen_before and "tool_inconsistent" not in seen_before
    assert "tool_inconsistent" in seen_after and "tool_consistent" not in seen_after
    assert after.confidence is not None and before.confidence is not None
    assert after.confidence < before.confidence


def test_the_calibration_table_shows_every_baseline_beside_the_operating_points() -> None:
    cache, naive, strict = Report(), Report(), Report()
    for grade, n in ((Grade.CORRECT_HIT, 3), (Grade.WRONG_HIT, 1)):
        for _ in range(n):
            cache.add("c", grade)
            naive.add("c", Grade.WRONG_HIT if grade is Grade.CORRECT_HIT else grade)
    strict.add("c", Grade.CORRECT_HIT)
    scored = [Scored(None, strict, [(0.99, True)]), Scored(0.0, strict, [(0.99, True), (0.2, False)])]
    table = render_calibration(scored, {"exact-only cache": cache, "naive NN @0.9": naive})
    rows = table.splitlines()
    assert rows[2] == "| exact-only cache | 3 | 1 | 0 | 75.0% | 100.0% | — |"
    assert rows[3] == "| naive NN @0.9 | 0 | 4 | 0 | 0.0% | 100.0% | — |"
    assert rows[4].startswith("| strict tiers (default) | 1 | 0 | 0 | 100.0% |")
    assert "ECE 0.105, 2 answers" in table  # the reliability of the loosest point


def test_the_base_stays_near_the_prior_when_no_example_is_an_exact_repeat_from_its_own_state() -> None:
    """The base is the confidence of an exact repeat from the episode's state; a store recording each
    call once per state holds no example of one, so the other candidates' outcomes must move their
    own features' weights, not the base (which would refuse every strict hit at 0.99)."""
    rng = np.random.default_rng(1)
    names = [f.name for f in FEATURES]
    rows = np.zeros((300, len(FEATURES)))
    kinds = rng.integers(0, 3, size=300)  # canonical (all right), nearest (mostly wrong), other state
    rows[kinds == 0, names.index("canonical")] = 1
    rows[kinds == 1, names.index("nearest")] = 1
    rows[kinds == 2, names.index("other_state")] = 1
    labels = np.where(kinds == 0, 1.0, (rng.random(300) < 0.1).astype(float))
    bias, weights = fit(rows, labels)
    assert bias >= PRIOR.bias - 0.5, bias  # an exact repeat from this state stays near 0.998
    assert weights[names.index("nearest")] < PRIOR.weights[names.index("nearest")]  # learned lower


def test_the_models_own_calibration_is_scored_on_a_fixed_sample_of_a_large_store() -> None:
    rng = np.random.default_rng(2)
    found = [
        Example(
            f"s{i % 3}", "t", i, "exact", False, rng.integers(0, 2, len(FEATURES)).astype(float), bool(i % 2)
        )
        for i in range(120)
    ]
    first, again = validated(found, sample=40), validated(found, sample=40)
    assert first is not None and first == again  # the same store gives the same file (snapshot id)
    assert first["examples"] == 40 and sum(b[2] for b in first["bins"]) == 40
    assert first["validated"] == "by server" and first["folds"] == 3
    whole = validated(found)
    assert whole is not None and whole["examples"] == 120


def test_a_sandboxed_servers_miss_is_judged_only_when_served_as_a_miss_and_never_by_a_guess(
    learned: tuple[Path, Path], embedder: SentenceTransformerEmbedder
) -> None:
    """A sandbox answers it: no confidence is formed on its way there. Served as a miss after all,
    it carries its exact recording's (from another state); the tool's matching state (read from all
    its recordings, again after each batch of sandbox answers) is not built to form a canonical or
    nearest candidate. With an operating point it is judged at once (it may be served by it)."""
    from replay_sim.store import Store

    db, index = learned
    resolver = Resolver(Store(db), embedder=embedder, index_dir=index)
    resolver.lookup.answer_strictly({"srv"})
    history = [call_key("srv", "tools/call", "pure", {"x": 7})]
    params = {"name": "pure", "arguments": {"x": 100}}
    miss = resolver.resolve("srv", "tools/call", params, history)
    assert miss.tier is Tier.MISS and miss.confidence is None  # the sandbox's to answer
    judge = resolver.confidence.judge_miss
    served = judge(resolver, "srv", "tools/call", "pure", {"x": 100}, history, miss)
    assert served.confidence is not None and served.drivers  # its exact recording's, from another state
    assert resolver.tool_states.kept("srv", "pure") is None
    at_a_point = resolver.resolve("srv", "tools/call", params, history, min_confidence=0.999)
    assert at_a_point.confidence == served.confidence
