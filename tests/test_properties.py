"""Property tests (hypothesis): canonical keys and the resolver never raise on any JSON value.

Canonicalisation is idempotent and independent of dict key order; the resolver answers any JSON
params with a :class:`Resolution` (a miss at worst), never an exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resolver_helpers import demo_store

from replay_sim.canonical import call_identity, call_key, canonical_json, normalize
from replay_sim.resolve.resolution import Resolution, Tier
from replay_sim.resolve.resolver import Resolver

SETTINGS = settings(max_examples=200, deadline=None)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: big ints included
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # any unicode, combining marks and unpaired-surrogate-free code points
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


def _reversed_order(value: Any) -> Any:
    """The same JSON value with every object's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {k: _reversed_order(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_order(v) for v in value]
    return value


@SETTINGS
@given(json_values)
def test_canonical_json_never_raises_and_is_json(value: Any) -> None:
    text = canonical_json(value)
    assert isinstance(text, str)
    json.loads(text)


@SETTINGS
@given(json_values)
def test_normalize_is_idempotent(value: Any) -> None:
    once = normalize(value)
    assert normalize(once) == once


@SETTINGS
@given(json_values)
def test_canonical_json_of_its_own_parse_is_identical(value: Any) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


@SETTINGS
@given(json_objects)
def test_keys_are_stable_under_dict_key_order(arguments: dict[str, Any]) -> None:
    shuffled = _reversed_order(arguments)
    assert canonical_json(shuffled) == canonical_json(arguments)
    assert call_key("demo", "tools/call", "t", shuffled) == call_key("demo", "tools/call", "t", arguments)
    name, args = call_identity("tools/call", {"name": "t", "arguments": arguments})
    assert call_key("demo", "tools/call", name, args) == call_key("demo", "tools/call", "t", arguments)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_cleanly(bad: float) -> None:
    for value in (bad, [bad], {"x": bad}):
        with pytest.raises(ValueError, match="JSON has no"):
            normalize(value)
        with pytest.raises(ValueError):
            canonical_json(value)
        with pytest.raises(ValueError):
            call_key("demo", "tools/call", "t", {"v": value})


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[Resolver]:
    store = demo_store(Path(tmp_path_factory.mktemp("props")) / "props.db")
    yield Resolver(store, embedder=embedder, index_dir=None)


tool_names = st.sampled_from(["search", "echo", "read_file", "write_file", "nosuch"]) | st.text(max_size=10)
tool_params = st.fixed_dictionaries({"name": tool_names, "arguments": json_objects}) | json_objects


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool_params)
def test_resolver_never_raises_on_any_json_params(resolver: Resolver, params: dict[str, Any]) -> None:
    found = resolver.resolve("demo", "tools/call", params)
    assert isinstance(found, Resolution)
    assert isinstance(found.tier, Tier)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(json_values)
def test_resolver_never_raises_on_any_json_value_as_params(resolver: Resolver, params: Any) -> None:
    found = resolver.resolve("demo", "tools/call", params)
    assert isinstance(found, Resolution)
    assert isinstance(found.tier, Tier)


def test_resolver_still_finds_the_recording_exactly(resolver: Resolver) -> None:
    found = resolver.resolve("demo", "tools/call", {"name": "echo", "arguments": {"message": "hello world"}})
    assert found.tier is Tier.EXACT
