"""Replay metrics: counts and latencies per server, tool and tier, recent misses, a timeline.

Kept in memory by the replay server, read by the admin API, the dashboard and Prometheus
(``/metrics``, text exposition format 0.0.4 written by hand: a few counters and one histogram do
not need a client library).

Whatever a client sends, what is kept stays bounded: a recent miss keeps at most a few kilobytes of
its arguments (longer values cut, with a marker giving their size — :func:`truncated`), and once
:meth:`Metrics.label_only` has been told the recorded names, calls of any other name share one
series (``tool="(unknown)"``) instead of adding one each.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LATENCY_BUCKETS", "UNKNOWN_NAME", "Metrics", "MissRecord", "truncated"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Histogram bucket bounds in seconds."""
_SAMPLES = 2048  # latency samples kept per (server, method, tool, tier) for percentiles
_TIMELINE_STEP = 10  # seconds per timeline bucket
_TIMELINE_LEN = 360  # one hour of buckets
UNKNOWN_NAME = "(unknown)"
"""The tool label shared by calls of names that nothing recorded (see :meth:`Metrics.label_only`)."""
_UNLEARNED = frozenset({"miss", "refused", "fault"})  # tiers that do not show a name was recorded
_TEXT = 512  # characters kept of one string in a recent miss
_ITEMS = 32  # items kept of one array or object
_DEPTH = 6  # nesting kept
_BUDGET = 8192  # characters kept of a miss's arguments (and again of its candidates)


def truncated(value: Any, budget: int = _BUDGET) -> Any:
    """``value`` (JSON) cut down to about ``budget`` characters, each cut marked with the size it had.

    Strings keep their first characters and say how long they were; arrays and objects keep their
    first items and say how many there were; deeper nesting is replaced by a marker.
    """
    left = [budget]

    def cut(v: Any, depth: int) -> Any:
        if isinstance(v, str):
            keep = min(len(v), _TEXT, max(left[0], 0))
            left[0] -= keep + 8
            return v if keep == len(v) else f"{v[:keep]}…[truncated: {len(v)} characters]"
        if isinstance(v, dict | list):
            size = len(v)
            if depth >= _DEPTH or left[0] <= 0:
                left[0] -= 32
                kind = "object" if isinstance(v, dict) else "array"
                return f"…[truncated: {kind} of {size} items]"
            if isinstance(v, list):
                items = [cut(x, depth + 1) for x in v[:_ITEMS] if left[0] > 0]
                if len(items) < size:
                    items.append(f"…[truncated: {size - len(items)} more items]")
                return items
            out: dict[str, Any] = {}
            for k, x in v.items():
                if len(out) >= _ITEMS or left[0] <= 0:
                    out["…"] = f"[truncated: {size - len(out)} more keys]"
                    break
                key = str(k)
                out[key if len(key) <= _TEXT else f"{key[:_TEXT]}…"] = cut(x, depth + 1)
            return out
        left[0] -= 8
        return v

    return cut(value, 0)


@dataclass(frozen=True, slots=True)
class MissRecord:
    """One call that no recording answered with certainty, and its near misses."""

    at: float
    server: str
    method: str
    name: str
    arguments: dict[str, Any]
    status: str
    reason: str
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def bounded(self) -> MissRecord:
        """This miss with its arguments, reason and candidates cut to a few kilobytes (:func:`truncated`)."""
        return dataclasses.replace(
            self,
            arguments=truncated(self.arguments),
            reason=truncated(self.reason),
            candidates=truncated(self.candidates),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON form for the admin API."""
        return {
            "at": self.at,
            "server": self.server,
            "method": self.method,
            "name": self.name,
            "arguments": self.arguments,
            "status": self.status,
            "reason": self.reason,
            "candidates": self.candidates,
        }


@dataclass(slots=True)
class _Series:
    count: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (``q`` in 0..100)."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Thread-safe in-memory replay metrics.

    Args:
        max_misses: How many recent misses to keep for ``/api/misses``.
    """

    def __init__(self, max_misses: int = 200) -> None:
        self._lock = threading.Lock()
        self._series: dict[tuple[str, str, str, str], _Series] = {}
        self._timeline: deque[tuple[int, Counter[str]]] = deque(maxlen=_TIMELINE_LEN)
        self.misses: deque[MissRecord] = deque(maxlen=max_misses)
        self.started = time.time()
        self._labelled: set[tuple[str, str, str]] | None = None  # None: every name gets its series
        self._faults: Counter[tuple[str, str, str]] = Counter()  # (server, tool, kind): injected
        self.delays = 0
        """Answers held on purpose (``serve --latency``, timeout faults)."""
        self.delay_seconds = 0.0
        """Seconds they were held in all."""

    def label_only(self, names: Iterable[tuple[str, str, str]]) -> None:
        """Give a series of its own only to these ``(server, method, name)`` and to names answered later.

        Any other name (an unknown tool, a URI nothing recorded) is counted as :data:`UNKNOWN_NAME`,
        so clients cannot grow the metrics without bound. A name a recording answers later (the
        ``live`` miss policy records new calls) gets its own series from then on.
        """
        with self._lock:
            self._labelled = set(names)

    def observe(self, server: str, method: str, name: str, tier: str, seconds: float) -> None:
        """Count one answered call and its handling time."""
        now = int(time.time()) // _TIMELINE_STEP * _TIMELINE_STEP
        with self._lock:
            labelled = self._labelled
            if labelled is not None and (server, method, name) not in labelled:
                if tier in _UNLEARNED:
                    name = UNKNOWN_NAME
                else:
                    labelled.add((server, method, name))
            series = self._series.get((server, method, name, tier))
            if series is None:
                series = self._series[(server, method, name, tier)] = _Series()
            series.count += 1
            series.total += seconds
            series.samples.append(seconds)
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    series.buckets[i] += 1
                    break
            if not self._timeline or self._timeline[-1][0] != now:
                self._timeline.append((now, Counter()))
            self._timeline[-1][1][tier] += 1

    def count_fault(self, server: str, tool: str, kind: str) -> None:
        """Count one fault injected on purpose (``serve --faults``)."""
        with self._lock:
            labelled = self._labelled
            if labelled is not None and (server, "tools/call", tool) not in labelled:
                tool = UNKNOWN_NAME
            self._faults[(server, tool, str(kind))] += 1

    def delayed(self, seconds: float) -> None:
        """Count one answer held on purpose for ``seconds``."""
        with self._lock:
            self.delays += 1
            self.delay_seconds += seconds

    def faults(self) -> list[dict[str, Any]]:
        """Faults injected so far, per server, tool and kind."""
        with self._lock:
            items = sorted(self._faults.items())
        return [{"server": s, "tool": t, "kind": k, "count": n} for (s, t, k), n in items]

    def record_miss(self, miss: MissRecord) -> None:
        """Keep a miss (and its candidates, cut to a few kilobytes) for the admin API and dashboard."""
        kept = miss.bounded()
        with self._lock:
            self.misses.append(kept)

    def stats(self) -> list[dict[str, Any]]:
        """Counts and latency percentiles (milliseconds) per server, method, tool and tier."""
        with self._lock:
            items = [(k, s.count, s.total, sorted(s.samples)) for k, s in sorted(self._series.items())]
        rows = []
        for (server, method, name, tier), count, total, samples in items:
            rows.append(
                {
                    "server": server,
                    "method": method,
                    "tool": name,
                    "tier": tier,
                    "count": count,
                    "mean_ms": round(total / count * 1000, 3),
                    "p50_ms": round(_percentile(samples, 50) * 1000, 3),
                    "p90_ms": round(_percentile(samples, 90) * 1000, 3),
                    "p99_ms": round(_percentile(samples, 99) * 1000, 3),
                }
            )
        return rows

    def timeline(self) -> list[dict[str, Any]]:
        """Calls per tier in 10-second buckets over the last hour, oldest first."""
        with self._lock:
            return [{"t": t, "tiers": dict(c)} for t, c in self._timeline]

    def recent_misses(self, limit: int = 50, server: str | None = None) -> list[dict[str, Any]]:
        """The most recent misses, newest first."""
        with self._lock:
            found = [m for m in reversed(self.misses) if server is None or m.server == server]
        return [m.as_dict() for m in found[:limit]]

    def misses_json(self, limit: int = 50, server: str | None = None, max_bytes: int = 1 << 20) -> bytes:
        """:meth:`recent_misses` as a JSON array of at most ``max_bytes`` (the newest that fit)."""
        parts: list[bytes] = []
        size = 2
        for miss in self.recent_misses(limit, server):
            part = json.dumps(miss, ensure_ascii=False).encode()
            size += len(part) + 1
            if size > max_bytes:
                break
            parts.append(part)
        return b"[" + b",".join(parts) + b"]"

    def prometheus(self) -> str:
        """The metrics in Prometheus text exposition format 0.0.4."""
        with self._lock:
            items = [(k, s.count, s.total, list(s.buckets)) for k, s in sorted(self._series.items())]
            misses = len(self.misses)
            faults = sorted(self._faults.items())
            delays, delay_seconds = self.delays, self.delay_seconds
        lines = [
            "# HELP replay_sim_calls_total Calls answered, by server, method, tool and tier.",
            "# TYPE replay_sim_calls_total counter",
        ]
        for (server, method, name, tier), count, _, _ in items:
            labels = (
                f'server="{_label(server)}",method="{_label(method)}",tool="{_label(name)}",tier="{tier}"'
            )
            lines.append(f"replay_sim_calls_total{{{labels}}} {count}")
        lines += [
            "# HELP replay_sim_call_seconds Time the replay server took to answer a call.",
            "# TYPE replay_sim_call_seconds histogram",
        ]
        for (server, method, name, tier), count, total, buckets in items:
            labels = (
                f'server="{_label(server)}",method="{_label(method)}",tool="{_label(name)}",tier="{tier}"'
            )
            cumulative = 0
            for bound, n in zip(LATENCY_BUCKETS, buckets, strict=True):
                cumulative += n
                lines.append(f'replay_sim_call_seconds_bucket{{{labels},le="{bound}"}} {cumulative}')
            lines.append(f'replay_sim_call_seconds_bucket{{{labels},le="+Inf"}} {count}')
            lines.append(f"replay_sim_call_seconds_sum{{{labels}}} {total:.6f}")
            lines.append(f"replay_sim_call_seconds_count{{{labels}}} {count}")
        lines += [
            "# HELP replay_sim_faults_total Faults injected (serve --faults), by server, tool and kind.",
            "# TYPE replay_sim_faults_total counter",
        ]
        for (server, name, kind), count in faults:
            labels = f'server="{_label(server)}",tool="{_label(name)}",kind="{_label(kind)}"'
            lines.append(f"replay_sim_faults_total{{{labels}}} {count}")
        lines += [
            "# HELP replay_sim_injected_delay_seconds Time answers were held (serve --latency, timeouts).",
            "# TYPE replay_sim_injected_delay_seconds summary",
            f"replay_sim_injected_delay_seconds_sum {delay_seconds:.6f}",
            f"replay_sim_injected_delay_seconds_count {delays}",
            "# HELP replay_sim_recent_misses Misses currently kept for /api/misses.",
            "# TYPE replay_sim_recent_misses gauge",
            f"replay_sim_recent_misses {misses}",
            "# HELP replay_sim_start_time_seconds When the replay server started (Unix time).",
            "# TYPE replay_sim_start_time_seconds gauge",
            f"replay_sim_start_time_seconds {self.started:.3f}",
        ]
        return "\n".join(lines) + "\n"


_SANDBOX_COUNTERS = (
    ("instances", "replay_sim_sandbox_instances_total", "Sandbox instances bound to episodes."),
    (
        "replayed",
        "replay_sim_sandbox_replayed_calls_total",
        "Calls re-played to bring instances to episodes' states.",
    ),
    ("answers", "replay_sim_sandbox_answers_total", "Calls answered by sandbox instances (and recorded)."),
    ("lost", "replay_sim_sandbox_lost_total", "Episodes lost because their sandbox instance died."),
)
_SANDBOX_GAUGES = (
    ("live", "replay_sim_sandbox_live_instances", "Live sandbox instances (warm ones included), by server."),
    (
        "warm",
        "replay_sim_sandbox_warm_instances",
        "Started sandbox instances waiting for an episode, by server.",
    ),
    ("crashed", "replay_sim_sandbox_crashed_total", "Sandbox instances that ended unasked, by server."),
)


def sandbox_prometheus(stats: dict[str, Any]) -> str:
    """The ``sandbox`` miss policy's figures (:meth:`SandboxPolicy.stats`) in Prometheus text format."""
    lines: list[str] = []
    for key, name, help_text in _SANDBOX_COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {stats.get(key, 0)}"]
    lines += [
        "# HELP replay_sim_sandbox_bound_episodes Episode histories bound to a live instance now.",
        "# TYPE replay_sim_sandbox_bound_episodes gauge",
        f"replay_sim_sandbox_bound_episodes {stats.get('bound', 0)}",
    ]
    pool: dict[str, Any] = stats.get("pool") or {}
    for key, name, help_text in _SANDBOX_GAUGES:
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [
            f'{name}{{server="{_label(server)}"}} {figures.get(key, 0)}'
            for server, figures in sorted(pool.items())
        ]
    lines += [
        "# HELP replay_sim_sandbox_memory_bytes Resident memory of live sandbox instances, by server.",
        "# TYPE replay_sim_sandbox_memory_bytes gauge",
    ]
    for server, figures in sorted(pool.items()):
        memory = sum(m for m in (figures.get("memory_bytes") or {}).values() if m)
        lines.append(f'replay_sim_sandbox_memory_bytes{{server="{_label(server)}"}} {memory}')
    return "\n".join(lines) + "\n"
