"""The confined launch run directly (``confined_argv``): what the program it runs starts with, and a
step that fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

from replay_sim.record.containment import Containment
from replay_sim.record.instances.confine import UID_BASE, Confinement, confined_argv

UID = UID_BASE + 7


def _launch(
    tmp_path: Path, command: list[str], binds: tuple[tuple[str, str], ...] = ()
) -> subprocess.CompletedProcess[str]:
    root = tmp_path / "workspace"
    root.mkdir()
    confinement = Confinement(root, UID, Containment(), binds=binds)
    return subprocess.run(confined_argv(command, confinement), capture_output=True, text=True, timeout=60)


def _status(text: str) -> dict[str, list[str]]:
    return {k: v.split() for k, v in (line.split(":", 1) for line in text.splitlines())}


def test_the_program_starts_as_its_uid_with_no_powers_and_the_signals_an_unconfined_start_has(
    tmp_path: Path,
) -> None:
    done = _launch(tmp_path, ["cat", "/proc/self/status"])  # not Python, which sets its own dispositions
    assert done.returncode == 0, done.stderr
    status = _status(done.stdout)
    assert status["Uid"] == status["Gid"] == [str(UID)] * 4
    assert status["Groups"] == []
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[field] == ["0000000000000000"], field
    # What the steps' interpreter ignores (SIGPIPE, SIGXFSZ) is not passed on: the signals ignored or
    # blocked are those of the same program started unconfined (what the replay was itself given).
    unconfined = _status(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)
    assert (status["SigIgn"], status["SigBlk"]) == (unconfined["SigIgn"], unconfined["SigBlk"])
    assert status["NoNewPrivs"] == ["1"]
    assert status["NSpid"][-1] == "1"  # process 1 of its own PID namespace (``unshare`` execs it)


def test_a_step_that_fails_ends_the_launch_with_one_line_naming_it(tmp_path: Path) -> None:
    done = _launch(tmp_path, ["true"], binds=((str(tmp_path / "no-such-copy"), "/srv/state"),))
    assert done.returncode == 70
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("replay-sim confine: ")
    assert "no-such-copy" in done.stderr
