"""Which store files passed their integrity check, unchanged since: a replay's start skips the check again.

``PRAGMA integrity_check`` reads every page of a store and looks every row up in every index:
0.23 s at 100,000 recordings, on every open — paid by each of a trainer's thousands of stdio
replay starts of the same file. Once a file has passed it, its *stamp* is kept in the user's
cache folder (``$XDG_CACHE_HOME/replay-sim/verified``, else ``~/.cache/replay-sim/verified``):
the file's identity (device, inode), size, modification and status-change times, and the same of
its write-ahead log when that holds anything. Any write to the file or its log — by SQLite, by
another program, a copy over it, a restore — changes its size or its times (the status-change
time cannot be set back by a program), so a store written since is checked again, and stamped
again when it passes. What a stamp cannot see is a file damaged without being written (the
medium failing under it); ``REPLAY_SIM_VERIFY=always`` checks on every open, as before.

A stamp is a small file named after the store's real path, replaced atomically; a cache folder
that cannot be written only means the check runs every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

__all__ = ["VERIFY_ENV", "Stamp", "remember", "stamp_of", "verified"]

VERIFY_ENV = "REPLAY_SIM_VERIFY"
"""Environment variable: ``always`` runs the integrity check on every open (no stamps read)."""

Stamp = tuple[int, ...]
"""What a store file and its write-ahead log looked like when it passed (see the module docs)."""


def _folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "replay-sim" / "verified"


def _file(path: Path) -> Path:
    return _folder() / hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:32]


def stamp_of(path: Path) -> Stamp | None:
    """The stamp of the store file at ``path`` as it is now (None: it cannot be read)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    stamp = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)
    try:
        log = os.stat(f"{path}-wal")
    except FileNotFoundError:
        return stamp  # an absent log and an empty one hold the same: nothing
    except OSError:
        return None
    if log.st_size == 0:
        return stamp
    return (*stamp, log.st_ino, log.st_size, log.st_mtime_ns, log.st_ctime_ns)


def verified(path: Path, stamp: Stamp | None) -> bool:
    """Whether the file at ``path``, now looking like ``stamp``, passed its check looking so."""
    if stamp is None or os.environ.get(VERIFY_ENV) == "always":
        return False
    try:
        return _file(path).read_text() == repr(stamp)
    except (OSError, UnicodeDecodeError):
        return False


def remember(path: Path, stamp: Stamp) -> None:
    """Keep that the file at ``path``, looking like ``stamp``, passed its integrity check."""
    target = _file(path)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(repr(stamp))
        os.replace(partial, target)
    except OSError:  # not kept: the next open checks again
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
