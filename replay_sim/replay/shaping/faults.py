"""Latency and faults injected into replayed answers, deterministically.

Agents trained only on instant, perfect tools break on real ones. A replay can answer as slowly
as the real server did (:class:`Latency`: ``none``, ``recorded``, ``fixed:MS``, ``scale:F``) and
fail some tool calls the way real servers and networks do (:class:`Faults`): a timeout (the
answer held past the client's deadline), a JSON-RPC error, an ``isError`` result, a dropped
connection.

Which call fails is never drawn from a random generator's state: it is a hash of the snapshot (or
store) served, the episode's seed, the server, the tool and the call's index in the episode, so an
episode gets the same faults on every run and on every replica. A faulted call is not applied:
the episode's state stays where it was, and a retry is the next call (drawn afresh).
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import anyio

from replay_sim.errors import ConfigError

__all__ = ["DEFAULT_HOLD", "MAX_HOLD", "FaultKind", "FaultRule", "Faults", "Hangup", "Latency"]

DEFAULT_HOLD = 30.0
"""Seconds a ``timeout`` fault holds the answer by default (then a JSON-RPC timeout error)."""
MAX_HOLD = 3600.0
"""The longest hold allowed: a held call costs a task and a connection until then."""


class FaultKind(StrEnum):
    """How an injected fault fails a tool call."""

    TIMEOUT = "timeout"
    """No answer for ``hold`` seconds (past the client's deadline), then a JSON-RPC timeout error."""
    ERROR = "error"
    """A JSON-RPC error (internal error), as a crashing server answers."""
    IS_ERROR = "is_error"
    """A ``CallToolResult`` with ``isError: true``, as a failing tool answers."""
    DISCONNECT = "disconnect"
    """The HTTP connection is closed before the answer is sent (over stdio: a connection-closed error)."""


@dataclass(frozen=True, slots=True)
class Latency:
    """How long an answer is held before it is sent (``serve --latency``).

    Attributes:
        mode: ``none``, ``recorded`` (each recording's own latency), ``fixed`` or ``scale``.
        value: Milliseconds for ``fixed``, the factor for ``scale``.
    """

    mode: str = "none"
    value: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> Latency:
        """``none``, ``recorded``, ``fixed:MS`` or ``scale:F``.

        Raises:
            ConfigError: Anything else (the message names the accepted forms).
        """
        mode, _, number = spec.strip().partition(":")
        mode = mode.lower()
        if mode in ("none", "recorded") and not number:
            return cls(mode)
        if mode in ("fixed", "scale") and number:
            try:
                value = float(number)
            except ValueError:
                value = math.nan
            if math.isfinite(value) and 0 <= value <= (MAX_HOLD * 1000 if mode == "fixed" else 1000):
                return cls(mode, value)
        raise ConfigError(
            f"latency {spec!r}: expected none, recorded, fixed:MS (milliseconds, 0 to {MAX_HOLD * 1000:g}) "
            "or scale:F (a factor of the recorded latency, 0 to 1000)"
        )

    def seconds(self, recorded_ms: float | None) -> float:
        """The delay of an answer whose recording took ``recorded_ms`` (None: no recording answered)."""
        if self.mode == "fixed":
            return self.value / 1000
        if self.mode in ("recorded", "scale") and recorded_ms:
            return max(0.0, recorded_ms) / 1000 * (self.value if self.mode == "scale" else 1.0)
        return 0.0

    def __str__(self) -> str:
        return self.mode if self.mode in ("none", "recorded") else f"{self.mode}:{self.value:g}"


@dataclass(frozen=True, slots=True)
class FaultRule:
    """The fault rate of some tools and the kinds drawn (each equally likely)."""

    rate: float
    kinds: tuple[FaultKind, ...] = tuple(FaultKind)


@dataclass(frozen=True, slots=True)
class Faults:
    """Which tool calls fail, and how (``serve --faults`` or a ``[faults]`` table).

    Attributes:
        rules: Rules by ``server/tool`` (``*`` for any server or tool); ``*/*`` is every tool.
        hold: Seconds a ``timeout`` fault holds the answer.
    """

    rules: dict[str, FaultRule] = field(default_factory=dict)
    hold: float = DEFAULT_HOLD

    def __post_init__(self) -> None:
        if not 0 <= self.hold <= MAX_HOLD:
            raise ConfigError(f"fault hold {self.hold:g} s: expected 0 to {MAX_HOLD:g} seconds")

    def __bool__(self) -> bool:
        return any(rule.rate > 0 for rule in self.rules.values())

    @property
    def drops(self) -> bool:
        """Whether some call may have its connection dropped."""
        return any(r.rate > 0 and FaultKind.DISCONNECT in r.kinds for r in self.rules.values())

    def rule(self, server: str, tool: str) -> FaultRule | None:
        """The rule for a tool: ``server/tool``, then ``server/*``, then ``*/tool``, then ``*/*``."""
        for key in (f"{server}/{tool}", f"{server}/*", f"*/{tool}", "*/*"):
            if key in self.rules:
                return self.rules[key]
        return None

    def draw(self, basis: str, seed: int, server: str, tool: str, index: int) -> FaultKind | None:
        """The fault of one tool call, or None: a pure function of its arguments.

        Args:
            basis: The snapshot id (or the store's identity) served.
            seed: The episode's seed (0 without an episode).
            server: Recorded server name.
            tool: The tool called.
            index: The call's index among the episode's calls on ``server`` (0 for the first).
        """
        rule = self.rule(server, tool)
        if rule is None or rule.rate <= 0 or not rule.kinds:
            return None
        digest = hashlib.sha256(f"{basis}\0{seed}\0{server}\0{tool}\0{index}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= rule.rate:
            return None
        return rule.kinds[int.from_bytes(digest[8:16], "big") % len(rule.kinds)]

    @classmethod
    def parse(cls, specs: list[str] | tuple[str, ...], hold: float | None = None) -> Faults:
        """Faults from ``--faults`` values: ``[SERVER/TOOL=]RATE[:KIND,...]`` or a TOML file's ``[faults]``.

        ``0.05`` fails 5 % of every tool's calls with any kind; ``git/git_log=0.2:timeout,error``
        20 % of one tool's with those two; a later value overrides an earlier one for the same tools.

        Raises:
            ConfigError: A value that is neither (the message names it and the accepted forms).
        """
        rules: dict[str, FaultRule] = {}
        table_hold: float | None = None
        for spec in specs:
            if spec.endswith(".toml") or Path(spec).is_file():
                loaded = cls.load(spec)
                rules |= loaded.rules
                table_hold = loaded.hold
                continue
            target, equals, rest = spec.partition("=")
            if not equals:
                target, rest = "*/*", spec
            if target.count("/") != 1:
                raise ConfigError(f'faults {spec!r}: name the tools "<server>/<tool>" ("*" for any)')
            rate, _, kinds = rest.partition(":")
            rules[target.strip()] = _rule(f"faults {spec!r}", rate, kinds.split(",") if kinds else None)
        chosen = hold if hold is not None else table_hold
        return cls(rules, DEFAULT_HOLD if chosen is None else chosen)

    @classmethod
    def load(cls, path: str | Path) -> Faults:
        """The ``[faults]`` table of a TOML file (e.g. the matching config); no table: no faults.

        Raises:
            ConfigError: The file is unreadable, not TOML, or the table is malformed.
        """
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the faults config: {exc}") from exc
        return cls.from_dict(data.get("faults") or {}, f"{path}: [faults]")

    @classmethod
    def from_dict(cls, table: dict[str, Any], where: str = "[faults]") -> Faults:
        """Faults from a ``[faults]`` table: ``rate``, ``kinds``, ``hold`` and per-tool tables.

        A TOML file is typed: a rate is a number (not ``true``, not ``"0.5"``), kinds an array
        of strings, hold a number.

        Raises:
            ConfigError: An unknown key, a rate that is not a number from 0 to 1, kinds that are
                not an array of known kind names, a bad hold (one line naming the field).
        """
        if not isinstance(table, dict) or (bad := set(table) - {"rate", "kinds", "hold", "tools"}):
            raise ConfigError(f"{where}: unknown keys {sorted(bad) if isinstance(table, dict) else table!r}")
        rules: dict[str, FaultRule] = {}
        if "rate" in table:
            rules["*/*"] = _rule(
                where, _typed_rate(where, table["rate"]), _typed_kinds(where, table.get("kinds"))
            )
        tools = table.get("tools") or {}
        if not isinstance(tools, dict):
            raise ConfigError(f'{where}: tools must be tables named "<server>/<tool>"')
        for name, entry in tools.items():
            here = f'{where}.tools."{name}"'
            if name.count("/") != 1 or not isinstance(entry, dict) or set(entry) - {"rate", "kinds"}:
                raise ConfigError(f'{here}: expected a table named "<server>/<tool>" with rate and kinds')
            kinds = (
                _typed_kinds(here, entry["kinds"])
                if "kinds" in entry
                else _typed_kinds(where, table.get("kinds"))
            )
            rules[name] = _rule(here, _typed_rate(here, entry.get("rate", 0)), kinds)
        hold = table.get("hold", DEFAULT_HOLD)
        if isinstance(hold, bool) or not isinstance(hold, int | float):
            raise ConfigError(f"{where}: hold must be a number of seconds")
        return cls(rules, float(hold))

    def check(self, tools: Mapping[str, Collection[str]]) -> None:
        """Refuse rules naming a server or tool nothing recorded (they would inject nothing).

        Args:
            tools: Each recorded server's tools (listed or called).

        Raises:
            ConfigError: A rule names an unknown server, or a tool no such server has (the message
                names the rule and what was recorded).
        """
        for key in sorted(self.rules):
            server, _, tool = key.partition("/")
            if server != "*" and server not in tools:
                known = ", ".join(sorted(tools)) or "none"
                raise ConfigError(f"faults {key!r}: no recorded server {server!r} (recorded: {known})")
            servers = [server] if server != "*" else list(tools)
            if tool != "*" and not any(tool in tools[name] for name in servers):
                known = ", ".join(sorted({t for name in servers for t in tools[name]})) or "none"
                where = f"on {server!r}" if server != "*" else "on any server"
                raise ConfigError(f"faults {key!r}: no recorded tool {tool!r} {where} (recorded: {known})")

    def describe(self) -> str:
        """The rules in the ``--faults`` form, for the start-up message."""
        return " ".join(
            f"{k}={r.rate:g}:{','.join(r.kinds)}" for k, r in sorted(self.rules.items()) if r.rate > 0
        )


def _typed_rate(where: str, rate: Any) -> float:
    """A table's ``rate``, a TOML number (``bool`` is an ``int`` in Python: refused by name)."""
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        kind = "a boolean" if isinstance(rate, bool) else f"a {type(rate).__name__}"
        raise ConfigError(f"{where}: field 'rate' must be a number from 0 to 1, not {kind} ({rate!r})")
    return float(rate)


def _typed_kinds(where: str, kinds: Any) -> list[str] | None:
    """A table's ``kinds``, an array of strings (None: not given)."""
    if kinds is None:
        return None
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise ConfigError(
            f"{where}: field 'kinds' must be an array of fault kind names ({', '.join(FaultKind)}), "
            f"not {kinds!r}"
        )
    return kinds


def _rule(where: str, rate: Any, kinds: Any) -> FaultRule:
    try:
        value = float(rate)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 <= value <= 1:
        raise ConfigError(f"{where}: the rate must be a number from 0 to 1, not {rate!r}")
    if kinds is None:
        return FaultRule(value)
    names = [str(k).strip().lower().replace("-", "_") for k in kinds]
    unknown = [k for k in names if k not in FaultKind.__members__.values()]
    if unknown or not names:
        raise ConfigError(
            f"{where}: unknown fault kinds {unknown or kinds!r} (known: {', '.join(FaultKind)})"
        )
    return FaultRule(value, tuple(FaultKind(k) for k in dict.fromkeys(names)))


class Hangup:
    """How a tool call's answer has its HTTP connection dropped: asked by the call, done by the router.

    The router puts one in the request's ASGI scope (under :data:`KEY`) when disconnect faults may
    be drawn; the call sets :attr:`asked` and waits for :attr:`done`, while the router stops the
    request and closes the connection without an answer.
    """

    KEY = "replay_sim.hangup"

    def __init__(self) -> None:
        self.asked = anyio.Event()
        self.done = anyio.Event()
