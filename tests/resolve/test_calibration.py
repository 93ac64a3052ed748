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
    threshold, worst = calibrate_threshold(vectors, texts, answers, floor=0.5, margin=0.02)
    assert worst == pytest.approx(0.8)  # a vs b: different answers
    assert threshold == pytest.approx(0.82)


def test_pairs_with_equal_text_or_equal_answers_never_raise_the_threshold() -> None:
    vectors = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    threshold, _ = calibrate_threshold(vectors, ["a", "a", "c"], ["x", "y", "y"], floor=0.9, margin=0.02)
    assert threshold == pytest.approx(0.9)


def test_a_field_the_results_echo_is_found() -> None:
    samples = [({"q": "Alice"}, "found alice"), ({"q": "zzz"}, "nothing"), ({"q": "Bob"}, "bob is here")]
    assert reflected_fields(samples, ["q"], 0.25) == {"q"}
    assert reflected_fields(samples, ["q"], 0.9) == set()


def test_the_shipped_example_matching_config_loads() -> None:
    config = MatchConfig.load(Path(__file__).resolve().parents[2] / "server" / "match.example.toml")
    assert config.override("memory", "search_nodes").free_text == ("query",)
    assert MatchConfig.from_dict(config.as_dict()) == config
