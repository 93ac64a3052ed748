"""The CLI's sandbox pool: built from a recorder config's sandboxes, refused without one or when the
start checks fail; and ``record --config`` refusing what only a sandbox fills."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay_sim.cli import cli
from replay_sim.cli.sandboxes import check_sandboxes
from replay_sim.errors import ConfigError
from replay_sim.record.config_file import parse_config
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.store import Origin, Store


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


def _recorded(path: Path, *servers: str) -> Store:
    store = Store(path)
    for server in servers:
        store.record_call(server, "tools/call", {"name": "t", "arguments": {}}, result={"content": []})
    return store


def test_start_checks_pass_for_a_recorded_sandbox_whose_command_and_state_exist(tmp_path: Path) -> None:
    (tmp_path / "pristine").mkdir()
    config = parse_config(
        {"servers": {"memory": {"command": sys.executable, "args": ["{state}/x"], "sandbox": True,
                                "state": str(tmp_path / "pristine")}}}
    )  # fmt: skip
    with _recorded(tmp_path / "r.db", "memory") as store:
        check_sandboxes(config, ["memory"], store)


def test_start_checks_name_a_missing_command_a_missing_state_and_an_unrecorded_server(tmp_path: Path) -> None:
    config = parse_config(
        {"servers": {
            "memory": {"command": "no-such-command-xyz", "sandbox": True},
            "files": {"command": str(tmp_path / "nope"), "args": ["{state}"], "sandbox": True,
                      "state": str(tmp_path / "missing")},
        }}
    )  # fmt: skip
    with _recorded(tmp_path / "r.db", "memory", "file") as store, pytest.raises(ConfigError) as refused:
        check_sandboxes(config, ["memory", "files"], store)
    said = str(refused.value)
    assert said.startswith("--miss sandbox cannot start: ")
    assert "sandbox 'memory': its command 'no-such-command-xyz' is not on PATH" in said
    assert f"sandbox 'files': its command '{tmp_path / 'nope'}' does not exist" in said
    assert f"sandbox 'files': its state directory {tmp_path / 'missing'} does not exist" in said
    assert "sandbox 'files' was never recorded (recorded: file, memory); recorded as 'file'?" in said


def test_a_server_recorded_under_the_name_record_derived_from_its_command_is_the_hint(tmp_path: Path) -> None:
    config = parse_config({"servers": {"mem": {"command": "mcp-server-memory", "sandbox": True}}})
    with _recorded(tmp_path / "r.db", "mcp-server-memory") as store, pytest.raises(ConfigError) as refused:
        check_sandboxes(config, ["mem"], store)
    assert "recorded as 'mcp-server-memory'? name its table [servers.mcp-server-memory]" in str(refused.value)


def test_record_refuses_state_placeholders_it_cannot_fill(tmp_path: Path) -> None:
    (tmp_path / "pristine").mkdir()
    config = tmp_path / "recorder.toml"
    config.write_text(
        f'[servers.memory]\ncommand = "npx"\nenv = {{ MEMORY_FILE_PATH = "{{state}}/memory.jsonl" }}\n'
        f'sandbox = true\nstate = "{tmp_path / "pristine"}"\n'
    )
    result = CliRunner().invoke(cli, ["record", "--config", str(config), "--db", str(tmp_path / "r.db")])
    assert isinstance(result.exception, ConfigError)
    assert "[servers.memory] uses {state} in env, which only a sandbox instance fills" in str(
        result.exception
    )
    assert not (tmp_path / "r.db").exists()


def test_only_the_real_servers_recordings_name_the_paths_under_tmp_shown_to_its_instances(
    tmp_path: Path,
) -> None:
    from replay_sim.record.instances.building import (
        _recorded_paths,  # the rule itself: what a pool's instances are shown
    )

    config = parse_config({"servers": {"git": {"command": "g", "sandbox": True}, "other": {"command": "o"}}})
    with Store(tmp_path / "replay.db") as store:
        for origin, arguments in (
            (Origin.LIVE, {"repo_path": "/tmp/recorded/repo", "files": ["/srv/not-private", "notes"]}),
            (Origin.IMPORT, {"repo_path": "file:///tmp/imported/../imported/x.txt"}),
            (Origin.SANDBOX, {"repo_path": "/tmp/an-episode-asked-this"}),  # an episode's: never shown
        ):
            params = {"name": "git_status", "arguments": arguments}
            store.record_call("git", "tools/call", params, result={"content": []}, origin=origin)
        store.record_call("other", "tools/call", {"name": "t", "arguments": {"p": "/tmp/o"}}, result={})
    assert _recorded_paths(tmp_path / "replay.db", config) == {
        "git": ("/tmp/recorded/repo", "/tmp/imported/x.txt")
    }


def test_start_checks_name_the_folders_under_tmp_the_recordings_name_when_none_exists(tmp_path: Path) -> None:
    gone = (
        tmp_path / "wiped"
    )  # as /tmp is after a reboot: the state the recordings were made from is not there
    config = parse_config({"servers": {"editor": {"command": sys.executable, "sandbox": True}}})
    with Store(tmp_path / "r.db") as store:
        for name in ("notes.txt", "todo.md"):
            params = {"name": "read", "arguments": {"file_path": f"{gone}/editor/{name}"}}
            store.record_call("editor", "tools/call", params, result={"content": []})
        with pytest.raises(ConfigError) as refused:
            check_sandboxes(config, ["editor"], store)
        said = str(refused.value)
        assert (
            f"sandbox 'editor': its recordings name paths in {gone}/editor, none of which exists here" in said
        )
        (gone / "editor").mkdir(parents=True)
        check_sandboxes(config, ["editor"], store)  # there (its files may be new ones its calls write)
