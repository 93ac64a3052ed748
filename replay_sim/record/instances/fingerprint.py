"""The fingerprint of what a sandbox instance is made of: its server's config and the code behind it.

Every session an instance answers is marked with it (:mod:`replay_sim.store.sources`), so the
answers of one config — a wrong one that shared state, say — can be taken back with
``replay-sim forget --fingerprint``. It covers:

- every key of the server's config table (:class:`~replay_sim.record.config.UpstreamSpec`'s
  fields, those added later too; environment and header values only as digests: they may be secrets);
- the server's code: the content of its command and of every argument naming an existing file
  (the script an interpreter runs, the ``dist/index.js`` of an npm server), and the names and sizes
  of the files in its ``state`` directory;
- replay-sim's own: its version and the source of the instance code (this package).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
from pathlib import Path
from typing import Any

from replay_sim.record.config import UpstreamSpec

__all__ = ["fingerprint_detail", "sandbox_fingerprint"]

_MAX_FILE = 64 * 1024 * 1024  # larger files are fingerprinted by size and modification time
_MAX_STATE_FILES = 10_000


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


@functools.lru_cache(maxsize=256)
def _file(path: str, size: int, mtime: int) -> str:
    """A file's content digest (cached by path, size and modification time)."""
    if size > _MAX_FILE:
        return f"size:{size}:mtime:{mtime}"
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _code(path: str) -> str | None:
    """The digest of a file, or None when ``path`` names none."""
    try:
        found = os.stat(path)
    except (OSError, ValueError):
        return None
    if not Path(path).is_file():
        return None
    try:
        return _file(path, found.st_size, found.st_mtime_ns)
    except OSError:
        return None


def _state(directory: str) -> str | None:
    """A digest of a state directory's file names and sizes (not their content: it may be large)."""
    root = Path(directory)
    if not root.is_dir():
        return None
    listed = []
    for n, path in enumerate(sorted(root.rglob("*"))):
        if n >= _MAX_STATE_FILES:
            break
        if path.is_file():
            listed.append(f"{path.relative_to(root)}\t{path.stat().st_size}")
    return _digest("\n".join(listed))


@functools.cache
def _replay_sim() -> dict[str, str]:
    """replay-sim's version and the digest of the instance code's source."""
    try:
        version = importlib.metadata.version("replay-sim")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    sources = sorted(Path(__file__).parent.glob("*.py"))
    return {"version": version, "instances": _digest(b"".join(p.read_bytes() for p in sources))}


def fingerprint_detail(name: str, spec: UpstreamSpec) -> dict[str, Any]:
    """What :func:`sandbox_fingerprint` is taken over, JSON-ready (secrets as digests)."""
    config: dict[str, Any] = {}
    for item in dataclasses.fields(spec):
        value = getattr(spec, item.name)
        if item.name in ("env", "headers"):
            value = {k: _digest(str(v)) for k, v in sorted(dict(value).items())}
        elif isinstance(value, tuple):
            value = list(value)
        elif value is not None and not isinstance(value, str | int | float | bool | list | dict):
            value = str(value)
        config[item.name] = value
    code: dict[str, str] = {}
    command = spec.command and (shutil.which(spec.command) or spec.command)
    for path in [command, *spec.args] if command else []:
        found = _code(path)
        if found is not None:
            code[path] = found
    state = _state(spec.state) if spec.state else None
    return {"server": name, "config": config, "code": code, "state": state, "replay_sim": _replay_sim()}


def sandbox_fingerprint(name: str, spec: UpstreamSpec) -> str:
    """The fingerprint (16 hex digits) of a sandbox server's config and code."""
    return _digest(json.dumps(fingerprint_detail(name, spec), sort_keys=True, default=str))
