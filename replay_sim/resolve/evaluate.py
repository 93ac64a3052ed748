"""Evaluation against live truth: score a resolver on probes the real server answered.

A probe is a sequence of calls made from a known initial state; each step carries ``truth``, what
the real server answered. A step is *answerable* when some recording of the same server, method
and name holds exactly that answer (``_meta`` aside). Each step is scored as:

- **correct hit** — the served recording's answer equals the truth;
- **wrong hit** — a recording was served, but the real server said something else;
- **correct miss** — nothing served, and no recording holds the truth;
- **needless miss** — nothing served, although a recording holds the truth.

precision = correct / (correct + wrong); **truth recall** = correct / answerable, where the
answerable steps are the correct hits, the needless misses and the wrong hits whose truth some
recording holds (a system that serves the wrong recording of an answerable call has not answered
it). Answerable is a statement about the recorded *answers* only: a recording of a different call
that happens to hold the same answer (an empty search result, an error message that does not name
the value) makes a step answerable although no rule could know it without asking the server.

A second, clearly separate figure, **design recall**, is computed over the *design-answerable*
steps: those for which a recording holding the truth has the same server, method and name and equal
non-free-text arguments after canonical normalisation (schema defaults filled, optional nulls
dropped; free-text fields as the tool's schema and the matching config declare them; for methods
other than ``tools/call`` and for unknown tools, all arguments). It is an upper bound of what
DESIGN.md's tiers could answer (it ignores thresholds, state and echoed text), never the issue's
recall.

Baselines run on the same probes: an exact-key cache (earliest recording, no history) and a naive
nearest neighbour over whole-call embeddings (top-1 accepted at a fixed cosine).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.canonical import answer_text, call_identity, call_key, canonical_json
from replay_sim.errors import InterchangeError
from replay_sim.resolve.embedding import Embedder
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.sessionless import state_dependence
from replay_sim.resolve.toolstate import answer_of
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store

__all__ = [
    "Finding",
    "Grade",
    "Probe",
    "Report",
    "compare",
    "evaluate",
    "explain",
    "load_probes",
    "render",
    "truth_of",
]

# (server, method, params, history) -> (served recording or None, step to append to history, why)
ResolveFn = Callable[[str, str, dict[str, Any], list[str]], tuple[Recording | None, str, str]]
# (server, tool) -> the tool's schema, or None when unknown
SchemaFn = Callable[[str, str], ToolSchema | None]


class Grade(StrEnum):
    """How one probe step was scored."""

    CORRECT_HIT = "correct_hit"
    """Served a recording whose answer is what the real server said."""
    WRONG_HIT = "wrong_hit"
    """Served a recording whose answer the real server did not give."""
    CORRECT_MISS = "correct_miss"
    """Served nothing, and no recording holds the real answer."""
    NEEDLESS_MISS = "needless_miss"
    """Served nothing, although a recording holds the real answer."""


@dataclass(frozen=True, slots=True)
class Probe:
    """A call sequence run from the initial state, with the real server's answer to each step."""

    id: str
    category: str
    server: str
    steps: list[dict[str, Any]]


def load_probes(path: str | Path) -> list[Probe]:
    """Read a probes JSONL file (format: ``fixtures/probes/README.md``).

    Raises:
        InterchangeError: A line is not JSON or lacks ``id``, ``category``, ``server`` or ``steps``.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InterchangeError(f"{path}: cannot read probes: {exc.strerror}") from exc
    probes = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            probes.append(Probe(str(obj["id"]), str(obj["category"]), str(obj["server"]), list(obj["steps"])))
            for step in obj["steps"]:
                step["method"], step["params"], step["truth"]
        except (ValueError, KeyError, TypeError) as exc:
            raise InterchangeError(
                f"{path}:{number}: not a probe ({exc!r}); see fixtures/probes/README.md"
            ) from exc
    return probes


def truth_of(step: dict[str, Any]) -> str:
    """What the real server answered a probe step, canonical (as :func:`answer_of` a recording)."""
    return answer_text(step["truth"].get("result"), step["truth"].get("error"))


@dataclass(frozen=True, slots=True)
class Finding:
    """A step a system got wrong (a wrong hit) or gave up on needlessly (a needless miss)."""

    probe: str
    step: int
    category: str
    grade: Grade
    call: str
    reason: str


@dataclass
class Report:
    """Grade counts per probe category, with precision, truth recall and design recall."""

    counts: dict[str, dict[Grade, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    # category -> [design-answerable steps, correct hits among them]
    design: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    # category -> wrong hits whose truth some recording holds
    answerable_wrong: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    findings: list[Finding] = field(default_factory=list)

    def add(
        self, category: str, grade: Grade, design_answerable: bool = False, answerable: bool = False
    ) -> None:
        """Count one scored step, whether it was design-answerable and, for a wrong hit, answerable."""
        self.counts[category][grade] += 1
        self.answerable_wrong[category] += grade is Grade.WRONG_HIT and answerable
        if design_answerable:
            self.design[category][0] += 1
            self.design[category][1] += grade is Grade.CORRECT_HIT

    def total(self, category: str | None = None) -> dict[Grade, int]:
        """Counts of one category, or of all."""
        cats = [category] if category else list(self.counts)
        return {o: sum(self.counts[c][o] for c in cats) for o in Grade}

    def design_recall(self, category: str | None = None) -> tuple[int, int, float]:
        """``(correct hits, design-answerable steps, design recall)`` of one category, or of all."""
        cats = [category] if category else list(self.counts)
        answerable = sum(self.design[c][0] for c in cats if c in self.design)
        correct = sum(self.design[c][1] for c in cats if c in self.design)
        return correct, answerable, (correct / answerable if answerable else 1.0)

    def rates(self, category: str | None = None) -> tuple[float, float]:
        """``(precision, truth recall)`` of one category, or of all; 1.0 when undefined (nothing
        served / nothing answerable)."""
        counts = self.total(category)
        cats = [category] if category else list(self.counts)
        correct, wrong = counts[Grade.CORRECT_HIT], counts[Grade.WRONG_HIT]
        # A wrong hit counts against precision always, and against recall when its truth was recorded.
        answerable = correct + counts[Grade.NEEDLESS_MISS] + sum(self.answerable_wrong[c] for c in cats)
        return (correct / (correct + wrong) if correct + wrong else 1.0), (
            correct / answerable if answerable else 1.0
        )


def _identity(schema: SchemaFn | None, server: str, method: str, name: str, arguments: Any) -> str | None:
    """What must be equal for the design's tiers to answer one call with another's recording."""
    spec = schema(server, name) if schema is not None and method == "tools/call" else None
    try:
        if spec is None or not isinstance(arguments, dict):
            return canonical_json(arguments)
        normalised = spec.normalise(arguments)
        return canonical_json({k: v for k, v in normalised.items() if k not in (spec.free_text or ())})
    except (ValueError, TypeError, RecursionError):
        return None  # equal to nothing


def evaluate(
    store: Store, probes: Sequence[Probe], resolve: ResolveFn, schema: SchemaFn | None = None
) -> Report:
    """Score one resolver on probes.

    Args:
        store: The recordings the resolver answers from.
        probes: Probes with live truth.
        resolve: The system under test (see :data:`ResolveFn`).
        schema: Tool schemas for the design-answerable test (None: every argument must be equal).

    Returns:
        The per-category report.
    """
    answers: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    designed: dict[tuple[str, str, str, str | None], set[str]] = defaultdict(set)
    for rec in store.recordings():
        answers[(rec.server, rec.method, rec.name)].add(answer_of(rec))
        ident = _identity(schema, rec.server, rec.method, rec.name, rec.arguments)
        designed[(rec.server, rec.method, rec.name, ident)].add(answer_of(rec))
    report = Report()
    for probe in probes:
        history: list[str] = []
        for number, step in enumerate(probe.steps, start=1):
            name, arguments = call_identity(step["method"], step["params"])
            truth = truth_of(step)
            answerable = truth in answers[(probe.server, step["method"], name)]
            ident = _identity(schema, probe.server, step["method"], name, arguments)
            design_answerable = ident is not None and truth in designed.get(
                (probe.server, step["method"], name, ident), ()
            )
            served, key, why = resolve(probe.server, step["method"], step["params"], history)
            history.append(key)
            if served is None:
                grade = Grade.NEEDLESS_MISS if answerable else Grade.CORRECT_MISS
            else:
                grade = Grade.CORRECT_HIT if answer_of(served) == truth else Grade.WRONG_HIT
            report.add(probe.category, grade, design_answerable, answerable)
            if grade in (Grade.WRONG_HIT, Grade.NEEDLESS_MISS):
                call = f"{name} {canonical_json(arguments)}"
                if served is not None:
                    why = (
                        f"served recording #{served.id} ({why})" if why else f"served recording #{served.id}"
                    )
                report.findings.append(Finding(probe.id, number, probe.category, grade, call, why))
    return report


def _replay_sim(resolver: Resolver, sessionless: bool = False) -> ResolveFn:
    def resolve(
        server: str, method: str, params: dict[str, Any], history: list[str]
    ) -> tuple[Recording | None, str, str]:
        if not sessionless:
            found = resolver.resolve(server, method, params, history)
            return found.recording, found.step, found.reason or found.tier.value
        # As the replay server answers a request with no episode and no session: from the initial
        # state, and only where the recordings show that the state does not matter.
        found = resolver.resolve(server, method, params, ())
        name, arguments = call_identity(method, params)
        found = state_dependence(resolver, server, method, name, arguments, found) or found
        return found.recording, found.step, found.reason or found.tier.value

    return resolve


def _exact_only(store: Store) -> ResolveFn:
    def resolve(
        server: str, method: str, params: dict[str, Any], history: list[str]
    ) -> tuple[Recording | None, str, str]:
        name, args = call_identity(method, params)
        key = call_key(server, method, name, args)
        found = store.recordings(key=key, limit=1)
        return (found[0] if found else None), key, "exact key" if found else "no recording with this key"

    return resolve


def _whole_call(server: str, method: str, name: str, args: dict[str, Any]) -> str:
    return f"{server} {method} {name} {canonical_json(args)}"


def _naive(store: Store, embedder: Embedder, threshold: float) -> ResolveFn:
    recordings = store.recordings()
    vectors = embedder.encode([_whole_call(r.server, r.method, r.name, r.arguments) for r in recordings])
    by_server: dict[str, list[int]] = defaultdict(list)
    for i, rec in enumerate(recordings):
        by_server[rec.server].append(i)

    def resolve(
        server: str, method: str, params: dict[str, Any], history: list[str]
    ) -> tuple[Recording | None, str, str]:
        name, args = call_identity(method, params)
        rows = by_server.get(server, [])
        if not rows:
            return None, "", "no recording of this server"
        query = embedder.encode([_whole_call(server, method, name, args)])[0]
        scores = vectors[rows] @ query
        best = int(np.argmax(scores))
        served = recordings[rows[best]] if scores[best] >= threshold else None
        return served, "", f"nearest cosine {float(scores[best]):.3f}"

    return resolve


def compare(
    store: Store,
    probes: Sequence[Probe],
    resolver: Resolver,
    embedder: Embedder | None = None,
    *,
    sessionless: bool = False,
) -> dict[str, Report]:
    """Score replay-sim and the baselines on the same probes.

    Args:
        store: The recordings.
        probes: Probes with live truth.
        resolver: The replay-sim resolver to score.
        embedder: Embedder for the naive baseline (None: skip it).
        sessionless: Score replay-sim as the MCP SDK client's default mode meets it (2026-07-28 era,
            no episode, no session): every step without a history, under the sessionless rule
            (:mod:`replay_sim.resolve.sessionless`). The probes' truth still follows their steps.

    Returns:
        Reports by system name, replay-sim last.
    """
    schema = resolver.tool_schema
    reports = {"exact-only cache": evaluate(store, probes, _exact_only(store), schema)}
    if embedder is not None:
        for threshold in (0.8, 0.9):
            naive = _naive(store, embedder, threshold)
            reports[f"naive NN @{threshold}"] = evaluate(store, probes, naive, schema)
    reports["replay-sim"] = evaluate(store, probes, _replay_sim(resolver, sessionless), schema)
    return reports


def render(reports: dict[str, Report], by_category: str | None = "replay-sim") -> str:
    """A Markdown table: one row per system, then one per category of ``by_category``.

    ``truth recall`` is the issue's figure (correct / answerable); ``design recall`` is over the
    design-answerable steps only (see the module docstring) and is shown with its counts.
    """
    head = (
        "| system | correct hit | wrong hit | correct miss | needless miss | precision | truth recall "
        "| design recall (hits / design-answerable) |\n|---|---|---|---|---|---|---|---|"
    )
    rows = [head]

    def row(label: str, report: Report, category: str | None) -> str:
        counts = report.total(category)
        precision, recall = report.rates(category)
        hits, answerable, design = report.design_recall(category)
        cells = " | ".join(str(counts[o]) for o in Grade)
        return f"| {label} | {cells} | {precision:.1%} | {recall:.1%} | {design:.1%} ({hits}/{answerable}) |"

    for name, report in reports.items():
        rows.append(row(name, report, None))
    if by_category and by_category in reports:
        report = reports[by_category]
        for category in sorted(report.counts):
            rows.append(row(f"{by_category}: {category}", report, category))
    return "\n".join(rows)


def explain(report: Report) -> str:
    """A Markdown list of a report's wrong hits and needless misses, with the system's reasons."""
    if not report.findings:
        return "No wrong hit and no needless miss."
    lines = []
    for f in report.findings:
        grade = f.grade.value.replace("_", " ")
        lines.append(f"- {f.probe} step {f.step} ({f.category}) {grade}: `{f.call[:160]}` — {f.reason}")
    return "\n".join(lines)
