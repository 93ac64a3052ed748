"""The recorder config's sandbox isolation keys: what each sandbox gets, each mistake named in one line."""

from __future__ import annotations

from typing import Any

import pytest

from replay_sim.errors import ConfigError
from replay_sim.record.config_file import parse_config
from replay_sim.record.isolation import Isolation

MEMORY = {"command": "mcp-server-memory", "env": {"MEMORY_FILE_PATH": "{state}/memory.jsonl"}}


def _server(**entry: Any) -> dict[str, Any]:
    return {"servers": {"s": entry}}


@pytest.mark.parametrize(
    ("entry", "isolation"),
    [
        ({"command": "srv", "sandbox": True}, Isolation.PROCESS),
        ({"command": "srv", "sandbox": True, "reset": "rm -f db"}, Isolation.EXCLUSIVE),
        ({**MEMORY, "sandbox": True, "state": "/srv/pristine"}, Isolation.STATE),
        ({"command": "srv", "sandbox": True, "mounts": ["/srv/repo"]}, Isolation.MOUNT),
        ({"url": "http://127.0.0.1:1/mcp", "sandbox": True, "reset": "true"}, Isolation.EXCLUSIVE),
        ({"command": "srv", "sandbox": True, "reset": "true", "isolation": "process"}, Isolation.PROCESS),
        ({"command": "srv"}, None),
    ],
)
def test_a_sandbox_gets_the_isolation_its_config_names_or_implies(
    entry: dict[str, Any], isolation: Any
) -> None:
    assert parse_config(_server(**entry)).servers["s"].isolation is isolation


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"command": "srv", "sandbox": True, "isolation": "chroot"}, "'isolation' must be one of"),
        ({"command": "srv", "sandbox": True, "isolation": ["state"]}, "'isolation' must be one of"),
        ({"command": "srv", "isolation": "process"}, "'isolation' applies to a sandbox: add sandbox = true"),
        ({**MEMORY, "state": "/srv/p"}, "'state' applies to a sandbox"),
        ({**MEMORY, "sandbox": True, "state": "pristine"}, "'state' must be an absolute path"),
        ({**MEMORY, "sandbox": True, "state": ""}, "'state' must be a non-empty string"),
        ({**MEMORY, "sandbox": True}, "'env' uses {state} but no 'state' directory is given"),
        ({"command": "srv", "sandbox": True, "state": "/srv/p"}, "no command, args, env or cwd uses {state}"),
        (
            {**MEMORY, "sandbox": True, "state": "/p", "isolation": "mount"},
            "'state' needs isolation = \"state\"",
        ),
        ({"command": "srv", "sandbox": True, "isolation": "state"}, "isolation = \"state\" needs a 'state'"),
        ({"command": "srv", "sandbox": True, "isolation": "mount"}, "isolation = \"mount\" needs 'mounts'"),
        ({"command": "srv", "sandbox": True, "mounts": "/srv"}, "'mounts' must be a non-empty list"),
        ({"command": "srv", "sandbox": True, "mounts": ["srv"]}, "'mounts' entries must be absolute paths"),
        ({"command": "srv", "sandbox": True, "mounts": ["/"]}, "'mounts' entries must be absolute paths"),
        ({"command": "srv", "sandbox": True, "mounts": ["/a", "/a"]}, "'mounts' lists a path twice"),
        ({"command": "srv", "sandbox": True, "isolation": "exclusive"}, "needs a 'reset' command"),
        (
            {"url": "http://127.0.0.1:1/mcp", "sandbox": True, "reset": "true", "isolation": "process"},
            'a url upstream can only be "exclusive"',
        ),
    ],
)
def test_a_bad_isolation_setting_is_one_config_error_naming_the_server_and_key(
    entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_server(**entry), source="rec.toml")
    assert str(caught.value).startswith("rec.toml: [servers.s]: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
