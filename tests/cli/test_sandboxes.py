"""The CLI's sandbox pool: built from a recorder config's sandboxes, refused without one."""

from __future__ import annotations

import pytest

from replay_sim.cli.sandboxes import sandbox_pool
from replay_sim.errors import ConfigError
from replay_sim.record.config_file import parse_config


def test_the_pool_serves_the_configs_sandboxes_with_the_limits_given() -> None:
    config = parse_config({"servers": {"plain": {"command": "a"}, "box": {"command": "b", "sandbox": True}}})
    pool = sandbox_pool(config, pool=2, max_instances=5, idle_timeout=60)
    assert pool.servers() == frozenset({"box"})
    assert (pool.pool, pool.max_instances, pool.idle_timeout) == (2, 5, 60)


def test_a_config_without_sandboxes_or_with_bad_limits_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"at least one server declared `sandbox = true` \(its servers: plain\)"
    ):
        sandbox_pool(parse_config({"servers": {"plain": {"command": "a"}}}))
    config = parse_config({"servers": {"box": {"command": "b", "sandbox": True}}})
    with pytest.raises(ConfigError, match="max_instances ≥ 1"):
        sandbox_pool(config, max_instances=0)
