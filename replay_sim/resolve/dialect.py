"""What a tool's recordings show its server doing with arguments its inputSchema calls invalid.

A schema check alone cannot say what a real server answers: servers coerce loose types (``"2"``
for an integer), ignore extra properties, or read keywords JSON Schema does not have. So a
violation (:class:`~replay_sim.schema.Violation`) is judged by evidence:

- **accepted** — some recorded call with a violation of the same *kind* (keyword, argument and
  value shape) succeeded: the server accepts such values. Such a call is resolved as usual.
- **refused** — a recorded call failed whose *only* violation is of this kind and whose failure
  names the argument or its value (so it failed for that reason, not another), and no recorded
  call shows the kind accepted. Replay answers with that refusal, adapted to the new value.
- **certain** — refused by every server whatever its dialect (a missing required property without
  a default), unless a recording shows it accepted.
- **unproven** — anything else: the server may refuse or coerce. Replay never makes up a refusal
  the real server might not give; only a recording of this very call answers it (exact tier, or
  canonical tier with a recording that made the same violation), else a miss that says the
  arguments may violate the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.schema import ToolSchema, Violation
from replay_sim.store import Recording

__all__ = ["Judgement", "SchemaEvidence", "adapt_refusal", "failure_text"]


def failure_text(recording: Recording) -> str:
    """The words of a failed call's answer: the JSON-RPC error message, or the result's text."""
    if recording.error is not None:
        return str(recording.error.get("message", ""))
    content = (recording.result or {}).get("content") or []
    return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))


def _spellings(value: Any) -> list[str]:
    """How a server's message may quote a value: Python repr, JSON, or as is (a string)."""
    found = [repr(value), json.dumps(value, ensure_ascii=False, default=str)]
    if isinstance(value, str) and value.strip():
        found.append(value)
    return found


def _quotes(text: str, spelling: str) -> bool:
    """Whether ``text`` quotes ``spelling`` (a bare word only where no letter or digit adjoins it)."""
    return re.search(rf"(?<![\w]){re.escape(spelling)}(?![\w])", text) is not None


def _names(text: str, violation: Violation) -> bool:
    """Whether a failure message names the violated argument or quotes its value."""
    name = violation.path.rsplit("/", 1)[-1]
    if name and name != "*" and re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text):
        return True
    return violation.value is not None and any(_quotes(text, s) for s in _spellings(violation.value))


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the evidence says about one call's arguments.

    Attributes:
        violations: Every violation of the inputSchema.
        unproven: Those no recording shows the server accepting.
        refusal: The violation a real server refuses the call for (certain, or recorded refused);
            None when the call may be accepted.
        refused_by: The recording of that refusal, when one was recorded.
        refused_as: The violation that recording made (same kind, maybe another value).
    """

    violations: list[Violation] = field(default_factory=list)
    unproven: list[Violation] = field(default_factory=list)
    refusal: Violation | None = None
    refused_by: Recording | None = None
    refused_as: Violation | None = None

    def describe(self) -> str:
        """The unproven violations, one line."""
        return "; ".join(v.describe() for v in self.unproven)


class SchemaEvidence:
    """The kinds of violation a tool's recordings show its server accepting and refusing.

    Args:
        schema: The tool's schema.
        recordings: Its ``tools/call`` recordings.
    """

    def __init__(self, schema: ToolSchema, recordings: Sequence[Recording]) -> None:
        self.schema = schema
        self.accepted: set[tuple[str, str, str]] = set()
        self.refused: dict[tuple[str, str, str], tuple[Recording, Violation]] = {}
        self._by_recording: dict[int, list[Violation]] = {}
        for rec in recordings:
            found = self._by_recording[rec.id] = schema.violations(rec.arguments)
            if not rec.failed:
                self.accepted.update(v.kind for v in found)
        for rec in recordings:
            # Evidence only when one kind, not shown accepted, can explain the failure, and is named.
            open_kinds = [v for v in self._by_recording[rec.id] if v.kind not in self.accepted]
            if (
                rec.failed
                and len({v.kind for v in open_kinds}) == 1
                and _names(failure_text(rec), open_kinds[0])
            ):
                self.refused.setdefault(open_kinds[0].kind, (rec, open_kinds[0]))

    def violations_of(self, recording: Recording) -> list[Violation]:
        """The violations of a recording's arguments (computed once)."""
        if recording.id not in self._by_recording:
            self._by_recording[recording.id] = self.schema.violations(recording.arguments)
        return self._by_recording[recording.id]

    def judge(self, arguments: dict[str, Any]) -> Judgement:
        """Whether a call's violations are accepted, refused or unproven (see the module docstring)."""
        found = self.schema.violations(arguments)
        if not found:
            return Judgement()
        unproven = [v for v in found if v.kind not in self.accepted]
        for violation in unproven:
            if violation.kind in self.refused:
                recording, made = self.refused[violation.kind]
                return Judgement(found, unproven, violation, recording, made)
        certain = next((v for v in unproven if v.certain), None)
        return Judgement(found, unproven, certain)

    def same_violations(self, judgement: Judgement, recording: Recording) -> bool:
        """Whether a recording made every unproven violation of a call, with the same values."""
        made = {(v.kind, canonical_json(v.value)) for v in self.violations_of(recording)}
        return all((v.kind, canonical_json(v.value)) in made for v in judgement.unproven)

    def proven(self, recording: Recording) -> bool:
        """Whether every violation of a recording's arguments is one the server is shown accepting."""
        return all(v.kind in self.accepted for v in self.violations_of(recording))


def adapt_refusal(text: str, recorded: Violation, violation: Violation, old: Any, new: Any) -> str:
    """A recorded refusal's words for a new call with the same kind of violation.

    The recorded offending value is replaced by the new one wherever the message quotes it (and
    the recorded arguments by the new ones, as pydantic's ``input_value={…}`` shows them); a
    message that quotes neither (zod: ``expected number, received string at from``) is the same
    for every value of the kind.

    Args:
        text: The recorded refusal's message.
        recorded: The violation the recorded call made.
        violation: The new call's violation of the same kind.
        old: The recorded call's arguments.
        new: The new call's arguments.
    """
    if recorded.value is not None and violation.value is not None:
        for before, after in zip(_spellings(recorded.value), _spellings(violation.value), strict=False):
            if _quotes(text, before):
                return re.sub(rf"(?<![\w]){re.escape(before)}(?![\w])", after.replace("\\", "\\\\"), text)
    if repr(old) in text:
        return text.replace(repr(old), repr(new))
    return text
