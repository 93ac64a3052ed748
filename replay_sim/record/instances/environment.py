"""The folders of a sandboxed program's own Python environment, handed to its instance's uid.

A server may write next to its own code when it starts: ``excel-mcp-server`` opens a log file
(``excel-mcp.log``) in its virtual environment's ``lib/python3.11``. Recorded as root, it could; a
confined instance sees the host read-only under a private copy-on-write layer, but runs as an
unprivileged uid, and the host's folders and files are root's: it could not start. So the program's
own environment is copied up on its layer owned by its uid (:func:`environment_paths`): the folders
of the virtual environment's skeleton above its packages (the folder holding ``pyvenv.cfg``,
``bin``, ``lib``, ``lib/python3.X``, ``site-packages``…) and of the program's own package, and the
regular files lying directly in the skeleton's folders (a log left there by an earlier run, the
scripts in ``bin``) — never the packages' files. The server may then create and append to files
there, on its layer, thrown away with it; its packages stay the host's, read-only, and nothing
reaches the host. A copy-up of a folder copies no file, so this costs a few folders and small files
per start, not the environment's size.
"""

from __future__ import annotations

import os
import re
import shutil
from functools import lru_cache

__all__ = ["environment_paths"]

_FOLDERS = 2_000  # folders handed over per environment, at most (a package's tree is small)
_FILE_BYTES = 16 << 20  # bytes of the skeleton's files handed over, at most (each is copied up)
_ENTRY = re.compile(rb"^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


def environment_paths(named: list[str]) -> tuple[list[str], list[str]]:
    """The folders and the files to hand over for the programs among ``named`` (a command, its arguments).

    For each program (found on ``PATH`` when not a path) in a Python virtual environment: the
    environment's folders outside ``site-packages``, ``site-packages`` itself, and the folders of
    the package its console script imports (``from excel_mcp.__main__ import app``); the regular
    files directly in the folders outside ``site-packages`` (none when they hold too many bytes).
    """
    folders: dict[str, None] = {}
    files: dict[str, None] = {}
    for value in named:
        program = shutil.which(value) if not os.path.isabs(value) and os.sep not in value else value
        if program and os.path.isabs(program) and os.path.isfile(program):
            found = _paths(os.path.realpath(program))
            folders |= dict.fromkeys(found[0])
            files |= dict.fromkeys(found[1])
    return list(folders), list(files)


@lru_cache(maxsize=64)
def _paths(program: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    prefix = _venv(program)
    if prefix is None:
        return (), ()
    folders: list[str] = []
    packages: list[str] = []
    files: list[str] = []
    size = 0
    for top, dirs, names in os.walk(prefix):
        folders.append(top)
        if os.path.basename(top) == "site-packages":
            packages.append(top)
            dirs.clear()  # the environment's other packages are not the program's
            continue
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                files.append(path)
                size += os.path.getsize(path)
        if len(folders) > _FOLDERS:
            return (), ()
    for site in packages:
        for package in _imported(program):
            for top, _, _ in os.walk(os.path.join(site, package)):
                folders.append(top)
                if len(folders) > _FOLDERS:
                    return (), ()
    return tuple(folders), tuple(files) if size <= _FILE_BYTES else ()


def _venv(program: str) -> str | None:
    """The nearest folder above ``program`` holding a ``pyvenv.cfg``, or None."""
    folder = os.path.dirname(program)
    while folder != os.path.dirname(folder):
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return folder
        folder = os.path.dirname(folder)
    return None


def _imported(program: str) -> list[str]:
    """The top-level packages a console script imports (none for a binary or a large file)."""
    try:
        with open(program, "rb") as f:
            head = f.read(4096)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    return list(dict.fromkeys(name.decode() for name in _ENTRY.findall(head) if name not in (b"re", b"sys")))
