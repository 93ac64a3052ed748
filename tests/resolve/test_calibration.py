"""Matching config files and threshold calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replay_sim.errors import ConfigError
from replay_sim.resolve.calibration import MatchConfig, ToolOverride, calibrate_threshold, reflected_fields


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("", MatchConfig()),
        ("[defaults]\n", MatchConfig()),
        ("[defaults]\nfloor = 0.95\n", MatchConfig(floor=0.95)),
        ("[defaults]\nmargin = 0.05\nsemantic = false\n", MatchConfig(margin=0.05, semantic=False)),
        ("[defaults]\nreflect_fraction = 0.5\n", MatchConfig(reflect_fraction=0.5)),
        (
            '[tools."memory/search_nodes"]\nsemantic = false\n',
            MatchConfig(tools={"memory/search_nodes": ToolOverride(semantic=False)}),
        ),
        (
            '[tools."*/search"]\nfree_text = ["q"]\nidentifiers = ["id"]\nthreshold = 0.97\n',
            MatchConfig(
                tools={"*/search": ToolOverride(free_text=("q",), identifiers=("id",), threshold=0.97)}
            ),
        ),
    ],
)
def test_a_config_file_may_leave_out_any_default(tmp_path: Path, toml: str, expected: MatchConfig) -> None:
    path = tmp_path / "replay-sim.toml"
    path.write_text(toml)
    assert MatchConfig.load(path) == expected


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[defaults]\nfloor = 'high'\n", "[defaults]"),
        ("[defaults]\nceiling = 1\n", "unknown keys ['ceiling']"),
        ("defaults = 3\n", "must be tables"),
        ("tools = 3\n", "must be tables"),
        ("[defaults]\nsemantic = 'false'\n", "expected true or false"),
        ('[tools."search"]\nsemantic = false\n', "<server>/<tool>"),
        ('[tools."a/search"]\nwhatever = 1\n', "unknown keys ['whatever']"),
        ('[tools."a/search"]\nfree_text = "query"\n', "list of field names"),
        ('[tools."a/search"]\nread_only = 1\n', "expected true or false"),
        ("not toml at all = = =\n", "cannot read"),
    ],
)
def test_a_bad_config_file_is_a_config_error_naming_the_problem(
    tmp_path: Path, toml: str, words: str
) -> None:
    path = tmp_path / "replay-sim.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=r"replay-sim\.toml") as caught:
        MatchConfig.load(path)
    assert words in str(caught.value)


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read matching config"):
        MatchConfig.load(tmp_path / "absent.toml")


def test_the_threshold_sits_a_margin_above_the_closest_conflicting_pair() -> None:
    vectors = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=np.float32)
    texts, answers = ["a", "b", "c"], ["x", "y", "y"]
    found = calibrate_threshold(vectors, texts, answers, floor=0.5, margin=0.02)
    assert found.conflict == pytest.approx(0.8)  # a vs b: different answers
    assert found.threshold == pytest.approx(0.82)


def test_pairs_with_equal_text_or_equal_answers_never_raise_the_threshold() -> None:
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    found = calibrate_threshold(vectors, ["a", "a", "c"], ["x", "y", "y"], floor=0.9, margin=0.02)
    assert found.threshold == pytest.approx(0.9)


def _recorded_pairs(*pairs: tuple[float, bool]) -> tuple[np.ndarray, list[str], list[str]]:
    """Recordings in pairs of texts ``(cosine, answers differ)``, each pair orthogonal to the others."""
    vectors = np.zeros((2 * len(pairs), 2 * len(pairs)), dtype=np.float32)
    texts, answers = [], []
    for k, (cosine, differ) in enumerate(pairs):
        vectors[2 * k, 2 * k] = 1.0
        vectors[2 * k + 1, 2 * k], vectors[2 * k + 1, 2 * k + 1] = cosine, np.sqrt(1 - cosine**2)
        texts += [f"t{k}a", f"t{k}b"]
        answers += [f"a{k}", f"b{k}" if differ else f"a{k}"]
    return vectors, texts, answers


@pytest.mark.parametrize(
    ("pairs", "threshold", "near", "calibrated"),
    [
        # Recordings far apart tell nothing about texts at 0.9: the floor is not evidence.
        ([(0.3, True), (0.2, True)], 0.9, 0, False),
        # Two pairs that differ in answer within 0.1 below the threshold: calibrated.
        ([(0.85, True), (0.86, True)], 0.9, 2, True),
        # One is not enough: a single pair may be a quirk of one text.
        ([(0.85, True), (0.3, True)], 0.9, 1, False),
        # Close pairs with the same answer are no evidence of where answers change.
        ([(0.88, False), (0.87, False)], 0.9, 0, False),
        # The threshold rises above the closest conflict; evidence is counted below *it*.
        ([(0.95, True), (0.9, True)], 0.97, 2, True),
        ([(0.95, True), (0.8, True)], 0.97, 1, False),
    ],
)
def test_a_threshold_is_calibrated_only_with_conflicting_pairs_near_it(
    pairs: list[tuple[float, bool]], threshold: float, near: int, calibrated: bool
) -> None:
    vectors, texts, answers = _recorded_pairs(*pairs)
    found = calibrate_threshold(vectors, texts, answers, floor=0.9, margin=0.02, band=0.1, pairs=2)
    assert found.threshold == pytest.approx(threshold, abs=1e-5)
    assert (found.near, found.calibrated) == (near, calibrated)


def test_recordings_of_one_text_pair_count_as_one_pair_of_evidence() -> None:
    vectors, texts, answers = _recorded_pairs((0.85, True))
    repeated = np.vstack([vectors, vectors[:1]])  # the first text recorded again, another answer
    found = calibrate_threshold(repeated, [*texts, texts[0]], [*answers, "c"], floor=0.9, margin=0.02)
    assert found.near == 1 and not found.calibrated


def test_the_evidence_rule_is_configurable() -> None:
    config = MatchConfig.from_dict({"defaults": {"evidence_pairs": 1, "evidence_band": 0.2}})
    assert (config.evidence_pairs, config.evidence_band) == (1, 0.2)
    assert MatchConfig.from_dict(config.as_dict()) == config
    with pytest.raises(ConfigError, match="whole number"):
        MatchConfig.from_dict({"defaults": {"evidence_pairs": 1.5}})


def test_a_field_the_results_echo_is_found() -> None:
    samples = [({"q": "Alice"}, "found alice"), ({"q": "zzz"}, "nothing"), ({"q": "Bob"}, "bob is here")]
    assert reflected_fields(samples, ["q"], 0.25) == {"q"}
    assert reflected_fields(samples, ["q"], 0.9) == set()


def test_the_shipped_example_matching_config_loads() -> None:
    config = MatchConfig.load(Path(__file__).resolve().parents[2] / "server" / "match.example.toml")
    assert config.override("memory", "search_nodes").free_text == ("query",)
    assert MatchConfig.from_dict(config.as_dict()) == config
