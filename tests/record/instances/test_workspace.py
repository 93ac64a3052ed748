"""An instance's workspace and launch: copies made and named, wrappers chosen by what the machine allows."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay_sim.errors import UpstreamError
from replay_sim.record.config_file import parse_config
from replay_sim.record.instances.workspace import Launcher, prepare

PLAIN = Launcher(setpriv=None, unshare=None, namespaces=False)


@pytest.mark.parametrize(
    ("launcher", "binds", "argv"),
    [
        (PLAIN, [], ["srv", "-v"]),
        (Launcher("/s", None, False), [], ["/s", "--pdeathsig", "KILL", "--", "srv", "-v"]),
        (
            Launcher("/s", "/u", True),
            [],
            [
                "/s",
                "--pdeathsig",
                "KILL",
                "--",
                "/u",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--",
                "srv",
                "-v",
            ],
        ),
        (
            Launcher(None, "/u", True),
            [("/copy", "/data")],
            [
                "/u",
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                "<script>",
                "replay-sim-mount",
                "/work",
                "/copy",
                "/data",
                "--",
                "srv",
                "-v",
            ],
        ),
    ],
)
def test_an_instance_is_launched_through_the_wrappers_this_machine_allows(
    launcher: Launcher, binds: list[tuple[str, str]], argv: list[str]
) -> None:
    got = launcher.argv(["srv", "-v"], cwd="/work", binds=binds)
    assert [("<script>" if part.startswith("cwd=$1") else part) for part in got] == argv


def test_mount_isolation_where_namespaces_are_not_allowed_is_an_error_saying_what_to_use() -> None:
    with pytest.raises(UpstreamError, match=r"needs private mount namespaces .* use 'state' or 'exclusive'"):
        Launcher("/s", "/u", False).argv(["srv"], cwd=None, binds=[("/copy", "/data")])


def test_a_state_instance_gets_a_copy_named_in_its_command_args_env_and_cwd(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    (pristine / "db").mkdir(parents=True)
    (pristine / "db" / "rows").write_text("1\n")
    entry = {
        "command": "{state}/bin",
        "args": ["--db", "{state}/db"],
        "env": {"HOME": "{state}"},
        "cwd": "{state}",
    }
    spec = parse_config({"servers": {"s": {**entry, "sandbox": True, "state": str(pristine)}}}).servers["s"]
    workspace = prepare("s", "s-1", spec, PLAIN, tmp_path / "instances")
    copy = str(workspace.root / "state")
    launched = workspace.spec
    assert (launched.command, launched.args, dict(launched.env), launched.cwd) == (
        f"{copy}/bin", ("--db", f"{copy}/db"), {"HOME": copy}, copy,
    )  # fmt: skip
    assert (workspace.root / "state" / "db" / "rows").read_text() == "1\n"
    assert launched.describe() == spec.describe()  # messages name the server's command as configured
    workspace.remove()
    assert not workspace.root.exists() and pristine.exists()


def test_a_missing_pristine_state_names_the_server_and_key_and_leaves_no_directory(tmp_path: Path) -> None:
    entry = {"command": "srv", "env": {"DATA": "{state}"}, "sandbox": True, "state": str(tmp_path / "nope")}
    spec = parse_config({"servers": {"s": entry}}).servers["s"]
    with pytest.raises(UpstreamError, match=r"sandbox 's': cannot copy state '.*nope' .* fix 'state'"):
        prepare("s", "s-1", spec, PLAIN, tmp_path / "instances")
    assert list((tmp_path / "instances").iterdir()) == []
