"""What a confined launch hides, reveals, binds and hands over, for the paths its config names.

:func:`plan` turns an instance's config and placement into its :class:`~.confine.Confinement`:
the replay's own paths covered; the paths under a private directory (``/tmp``) that its command
line, working directory or recordings name revealed copy-on-write; its home, working directory
and Python environment handed to its uid; the directories its command line names given to it
whole; and the closed directories on the way to its program opened for it to pass.
"""

from __future__ import annotations

import os
import shutil
import stat
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from replay_sim.record.instances.confine import PRIVATE, Confinement, Placement, private
from replay_sim.record.instances.environment import environment_paths

if TYPE_CHECKING:
    from replay_sim.record.config import UpstreamSpec

__all__ = ["plan"]


def plan(
    root: Path, spec: UpstreamSpec, placement: Placement, named: list[str], cwd: str | None,
    binds: list[tuple[str, str]],
) -> Confinement:  # fmt: skip
    """What a confined launch hides, reveals, binds and hands over, for the paths its config names.

    Args:
        root: The instance's workspace (its parent, where every instance's workspace is, is hidden).
        spec: The server's spec.
        placement: Its uid, the paths it must not see and those its recordings name.
        named: Its command, args and env values (absolute paths among them, or after an ``=`` in
            one, under a private directory such as ``/tmp`` are revealed copy-on-write and given).
        cwd: Its working directory (None: the replay's), revealed and handed to it.
        binds: ``(copy, path)`` of its own copies.
    """
    named = [_named_path(value) for value in named]
    workdir = os.path.abspath(cwd) if cwd else os.getcwd()
    hidden = list(dict.fromkeys(os.path.abspath(p) for p in (*placement.hidden, str(root.parent))))
    hidden = [p for p in hidden if p not in PRIVATE and p != "/"]  # those are fresh already

    def under(path: str, tops: list[str]) -> bool:
        return any(path == top or path.startswith(top.rstrip("/") + "/") for top in tops)

    reveal: list[str] = []
    # A path not there yet (a state file the server makes on its first write): its folder.
    recorded = [p if os.path.exists(p) else os.path.dirname(p) for p in placement.recorded]
    absent = [os.path.dirname(p) for p in named if os.path.isabs(p) and not os.path.exists(p)]
    for value in [*named, *absent, workdir, *recorded]:
        path = os.path.normpath(value) if os.path.isabs(value) else ""
        if not path or not private(path) or under(path, [*hidden, str(root)]) or not os.path.exists(path):
            continue
        path = path if os.path.isdir(path) else os.path.dirname(path)
        if not private(path) or path in PRIVATE:
            continue
        if not under(path, reveal):
            reveal = [r for r in reveal if not under(r, [path])] + [path]
    home = os.environ.get("HOME", "/root") if "HOME" not in spec.env else spec.env["HOME"]
    folders, files = environment_paths(named)  # its own Python environment's
    owned = [p for p in dict.fromkeys([home, workdir, *folders]) if p != "/" and not under(p, hidden)]
    bound = [path for _, path in binds]
    # A directory revealed under /tmp holds the state the server was started with or recorded using
    # (its state file's folder, a repository its calls name): it wrote there when recorded, so it may here.
    given = [p for p in [*_given([*named, *reveal]), *files] if not under(p, [*hidden, *bound, str(root)])]
    reach = [d for d in _closed_ancestors([*named, workdir]) if not under(d, hidden)]
    return Confinement(
        root, placement.uid, spec.containment, hidden=tuple(hidden), reveal=tuple(reveal),
        binds=tuple(binds), owned=tuple(owned), given=tuple(given), reach=tuple(reach), cwd=workdir,
    )  # fmt: skip


def _named_path(value: str) -> str:
    """The path an argument names: itself, or the absolute path after its first ``=`` (an option
    ``--db-path=/srv/shop.db``, or a variable ``MEMORY_FILE_PATH=/tmp/m.jsonl`` for ``env(1)``)."""
    _, equals, tail = value.partition("=")
    return tail if equals and not os.path.isabs(value) and os.path.isabs(tail) else value


_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/sys", "/dev", "/boot",
           "/opt", "/var/lib", "/snap", "/root/.pyenv")  # fmt: skip
_GIVEN_ENTRIES = 20_000  # a named directory holding more is not copied up (it stays the host's, read-only)


def _given(named: list[str]) -> list[str]:
    """The directories a command line names that its instance is given as its own (copied up whole):
    existing, absolute, outside the system's directories, and of at most ``_GIVEN_ENTRIES`` entries."""
    found: list[str] = []
    for value in named:
        path = os.path.normpath(value) if os.path.isabs(value) else ""
        if not path or path == "/" or not os.path.isdir(path) or path in found:
            continue
        if any(path == s or path.startswith(s + "/") for s in _SYSTEM) or path.count("/") < 2:
            continue  # a system directory, or a top-level one (/srv, /home): not the server's own data
        entries = 0
        for _, dirs, files in os.walk(path):
            entries += len(dirs) + len(files)
            if entries > _GIVEN_ENTRIES:
                break
        if entries <= _GIVEN_ENTRIES:
            found.append(path)
    return found


def _closed_ancestors(named: list[str]) -> list[str]:
    """Directories others may not enter on the way to the programs and paths named (and interpreters)."""
    paths = []
    for value in named:
        found = shutil.which(value) if not os.path.isabs(value) and os.sep not in value else value
        if found and os.path.isabs(found) and os.path.exists(found):
            paths += [found, os.path.realpath(found), *_interpreter(os.path.realpath(found))]
    closed: dict[str, None] = {}
    for path in paths:
        for parent in Path(path).parents:
            with suppress(OSError):
                if parent != Path("/") and not parent.stat().st_mode & stat.S_IXOTH:
                    closed[str(parent)] = None
    return list(closed)


def _interpreter(program: str) -> list[str]:
    """A script's interpreter from its ``#!`` line (its real path too), or nothing."""
    try:
        with open(program, "rb") as f:
            line = f.readline(256)
    except OSError:
        return []
    words = line[2:].split() if line.startswith(b"#!") else []
    if not words:
        return []
    interpreter = os.fsdecode(words[0])
    return [interpreter, os.path.realpath(interpreter)] if os.path.isabs(interpreter) else []
