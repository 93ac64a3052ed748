"""Reading a recorder config file (TOML) into a :class:`~replay_sim.record.config.RecorderConfig`.

The format is drawn in :mod:`replay_sim.record.config`'s docstring (``server/record.example.toml``
is the annotated version). Every mistake raises :class:`~replay_sim.errors.ConfigError` naming the
file, the entry and what is wrong.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from replay_sim.errors import ConfigError
from replay_sim.record.config import DEFAULT_TIMEOUT, RecorderConfig, UpstreamSpec
from replay_sim.record.containment import CONTAINMENT_KEYS, containment_keys
from replay_sim.record.isolation import Isolation
from replay_sim.redaction import DEFAULT_KEY_GLOBS, REDACTED, Redactor

__all__ = ["load_config", "parse_config"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SERVER_KEYS = {
    "command", "args", "env", "cwd", "url", "headers", "timeout", "startup_timeout", "explore", "reset",
    "sandbox", "isolation", "state", "mounts",
    "miss", *CONTAINMENT_KEYS,
}  # fmt: skip
_REDACTION_KEYS = {"keys", "patterns", "replacement"}


def load_config(path: str | Path) -> RecorderConfig:
    """Read and validate a recorder config file.

    Args:
        path: The TOML file.

    Returns:
        The parsed config.

    Raises:
        ConfigError: The file is missing, not TOML, or an entry is invalid (names file and entry).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the recorder config: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, source=str(path))


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> RecorderConfig:
    """Validate an already-parsed config mapping (see the module docstring for the format).

    Raises:
        ConfigError: Naming ``source``, the entry and the problem.
    """
    unknown = set(data) - {"servers", "redaction"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}; expected [servers.NAME], [redaction]"
        )
    servers_table = data.get("servers")
    if not isinstance(servers_table, dict) or not servers_table:
        raise ConfigError(
            f"{source}: no upstreams; add at least one [servers.NAME] table with command or url"
        )
    servers: dict[str, UpstreamSpec] = {}
    for name, entry in servers_table.items():
        servers[name] = _server(name, entry, f"{source}: [servers.{name}]")
    return RecorderConfig(servers, _redactor(data.get("redaction", {}), f"{source}: [redaction]"))


def _server(name: str, entry: Any, where: str) -> UpstreamSpec:
    if not _NAME.match(name):
        raise ConfigError(
            f"{where}: a server name may use only letters, digits, '_', '.', '-' (it is a URL path)"
        )
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table with command or url")
    unknown = set(entry) - _SERVER_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_SERVER_KEYS)}")
    if ("command" in entry) == ("url" in entry):
        raise ConfigError(f"{where}: needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
    explore, sandbox = entry.get("explore", False), entry.get("sandbox", False)
    for key, value in (("explore", explore), ("sandbox", sandbox)):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key!r} must be true or false")
    reset = _string(entry, "reset", where) if "reset" in entry else None
    isolation = _isolation(entry, where)
    if "url" in entry:
        url = _string(entry, "url", where)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: 'url' must start with http:// or https://, got {url!r}")
        for key in ("args", "env", "cwd"):
            if key in entry:
                raise ConfigError(f"{where}: {key!r} applies to a command, not a url")
        if sandbox and reset is None:
            raise ConfigError(
                f"{where}: 'sandbox' needs a 'reset' command for a url upstream: its state outlives a session"
            )
        return _spec(
            where,
            url=url,
            headers=_strings(entry, "headers", where),
            timeout=_timeout(entry, where),
            startup_timeout=_seconds(entry, "startup_timeout", where) or 30.0,
            explore=explore,
            reset=reset,
            sandbox=sandbox,
            **isolation,
            **_miss(entry, where, sandbox),
            **containment_keys(entry, where, sandbox=sandbox),
        )
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: 'args' must be a list of strings")
    if "headers" in entry:
        raise ConfigError(f"{where}: 'headers' applies to a url, not a command")
    cwd = _string(entry, "cwd", where) if "cwd" in entry else None
    return _spec(
        where,
        command=_string(entry, "command", where),
        args=tuple(args),
        env=_strings(entry, "env", where),
        cwd=cwd,
        timeout=_timeout(entry, where),
        startup_timeout=_seconds(entry, "startup_timeout", where) or 30.0,
        explore=explore,
        reset=reset,
        sandbox=sandbox,
        **isolation,
        **_miss(entry, where, sandbox),
        **containment_keys(entry, where, sandbox=sandbox),
    )


def _miss(entry: dict[str, Any], where: str, sandbox: bool) -> dict[str, Any]:
    """The server's own miss policy (``miss = "sandbox"``: ``serve`` answers its misses from sandboxes)."""
    if "miss" not in entry:
        return {}
    miss = _string(entry, "miss", where)
    if miss != "sandbox":
        raise ConfigError(
            f"{where}: 'miss' can only be \"sandbox\" per server (other policies apply to every server: "
            f"serve --miss), not {miss!r}"
        )
    if not sandbox:
        raise ConfigError(f'{where}: miss = "sandbox" needs sandbox = true (its state can be thrown away)')
    return {"miss": miss}


def _spec(where: str, **fields: Any) -> UpstreamSpec:
    """An :class:`UpstreamSpec`; keys it refuses together are a :class:`ConfigError` naming ``where``."""
    try:
        return UpstreamSpec(**fields)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _isolation(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """The sandbox isolation keys (``isolation``, ``state``, ``mounts``), checked one by one.

    Raises:
        ConfigError: A key has the wrong type or value, or they do not fit together (names the key).
    """
    out: dict[str, Any] = {}
    if "isolation" in entry:
        value = entry["isolation"]
        kinds = ", ".join(repr(k.value) for k in Isolation)
        if not isinstance(value, str) or value not in {k.value for k in Isolation}:
            raise ConfigError(f"{where}: 'isolation' must be one of {kinds}, got {value!r}")
        out["isolation"] = Isolation(value)
    if "state" in entry:
        out["state"] = _string(entry, "state", where)
    if "mounts" in entry:
        mounts = entry["mounts"]
        if not isinstance(mounts, list) or not mounts or not all(isinstance(m, str) and m for m in mounts):
            raise ConfigError(f"{where}: 'mounts' must be a non-empty list of absolute paths")
        out["mounts"] = tuple(mounts)
    return out


def _string(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    return value


def _strings(entry: dict[str, Any], key: str, where: str) -> dict[str, str]:
    table = entry.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: {key!r} must be a table of strings, e.g. {key} = {{ NAME = "value" }}')
    out: dict[str, str] = {}
    for name, value in table.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key}.{name} must be a string")
        out[name] = _expand(value, f"{where}: {key}.{name}")
    return out


def _expand(value: str, where: str) -> str:
    def lookup(match: re.Match[str]) -> str:
        var = match.group(1)
        if var not in os.environ:
            raise ConfigError(f"{where}: environment variable {var} is not set")
        return os.environ[var]

    return _VAR.sub(lookup, value)


def _seconds(entry: dict[str, Any], key: str, where: str) -> float | None:
    if key not in entry:
        return None
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        # nan and inf are TOML floats: nan crashed the recorder, inf meant no limit unsaid
        raise ConfigError(f"{where}: {key!r} must be a positive, finite number of seconds, not {value!r}")
    return float(value)


def _timeout(entry: dict[str, Any], where: str) -> float | None:
    """An upstream's request timeout: :data:`DEFAULT_TIMEOUT` when absent, none at all for 0."""
    value = entry.get("timeout")
    if value == 0 and not isinstance(value, bool):
        return None
    given = _seconds(entry, "timeout", where)
    return DEFAULT_TIMEOUT if given is None else given


def _redactor(table: Any, where: str) -> Redactor:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = set(table) - _REDACTION_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_REDACTION_KEYS)}")
    keys = table.get("keys", list(DEFAULT_KEY_GLOBS))
    patterns = table.get("patterns", [])
    for key, value in (("keys", keys), ("patterns", patterns)):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}: {key!r} must be a list of non-empty strings")
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(
                f"{where}: pattern {pattern!r} is not a valid regular expression: {exc}"
            ) from exc
    replacement = table.get("replacement", REDACTED)
    if not isinstance(replacement, str):
        raise ConfigError(f"{where}: 'replacement' must be a string")
    return Redactor(key_globs=keys, patterns=compiled, replacement=replacement)
