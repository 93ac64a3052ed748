"""Episode state: which recordings were made from the state an episode is in.

A server's answers depend on the state-changing calls made before them. A recording is made from
this episode's state when the *state-changing* calls before it in its recorded session (tools
whose ``readOnlyHint`` is not true, and that did not fail) are exactly the ones this episode made,
in order. Read-only calls never change state, so they are ignored when comparing; they only break
ties (the longest common tail of the whole history wins, then the earliest recording).

Once an episode makes a state-changing call that no recording answers, the real server's state is
unknown, and every later call of that episode is a miss: a stale answer would be something the
real server would not have said.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from replay_sim.store import Recording, Store

__all__ = ["Episodes", "history_affinity", "is_failure"]

_INERT, _DIVERGENT = "", "!"


def history_affinity(recording: Recording, history: Sequence[str], prefix: Sequence[str]) -> int:
    """How many trailing calls of the recording's session prefix this episode's history repeats."""
    matched = 0
    for recorded, made in zip(reversed(prefix), reversed(history), strict=False):
        if recorded != made:
            break
        matched += 1
    return matched


def is_failure(recording: Recording) -> bool:
    """True when the recorded answer is an error (a failed call changes nothing)."""
    return recording.error is not None or bool((recording.result or {}).get("isError"))


class _LRU(OrderedDict[str, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class Episodes:
    """Recording lookups by key and state-aware choice, with the caches that make them fast.

    Args:
        store: The recording store.
        schema: ``(server, tool) -> ToolSchema | None`` (read-only annotations).
        cache_size: Entries of each LRU cache.
    """

    def __init__(self, store: Store, schema: Callable[[str, str], Any], cache_size: int = 65536) -> None:
        self.store = store
        self.schema = schema
        self._keys = _LRU(cache_size)  # key -> recordings
        self._seen = _LRU(cache_size)  # requested key -> recorded key, _INERT or _DIVERGENT
        self._mutating: dict[str, bool] = {}
        self._sessions: dict[str, list[tuple[int, str]]] = {}
        self._prefix_mut: dict[int, tuple[str, ...]] = {}

    def clear(self) -> None:
        """Forget everything read from the store (it changed); what calls were seen is kept."""
        self._keys.clear()
        self._mutating.clear()
        self._sessions.clear()
        self._prefix_mut.clear()

    def by_key(self, key: str) -> list[Recording]:
        """Recordings with this exact key, in recorded order (cached)."""
        found = self._keys.get(key)
        if found is None:
            found = self.store.recordings(key=key)
            self._keys.put(key, found)
        return found

    def note(self, requested: str, recorded: str | None, mutating: bool = False) -> None:
        """Remember how a requested call was answered: by ``recorded``'s key, or by a miss."""
        self._seen.put(requested, recorded if recorded is not None else (_DIVERGENT if mutating else _INERT))

    def _translate(self, history: Sequence[str]) -> list[str]:
        """History keys as recorded keys (a canonical/semantic hit stands for the recording it served)."""
        out = []
        for key in history:
            seen = self._seen.get(key)
            out.append(seen if seen and seen != _DIVERGENT else key)
        return out

    def diverged(self, history: Sequence[str]) -> str | None:
        """Describe the first state-changing call of ``history`` that no recording answers, if any."""
        for key in history:
            seen = self._seen.get(key)
            if seen is None and not self.by_key(key):
                return f"unknown call {key[:12]}"  # never resolved here: assume the worst
            if seen == _DIVERGENT and not self.by_key(key):
                return f"call {key[:12]}"
        return None

    def is_mutating(self, key: str) -> bool:
        """Whether the recorded call with this key changed the server's state."""
        cached = self._mutating.get(key)
        if cached is None:
            found = self.by_key(key)
            cached = False
            if found and found[0].method == "tools/call":
                schema = self.schema(found[0].server, found[0].name)
                if schema is None or schema.changes_state(found[0].arguments):
                    cached = any(not is_failure(r) for r in found)
            self._mutating[key] = cached
        return cached

    def _prefix(self, recording: Recording) -> list[str]:
        if recording.session is None:
            return []
        calls = self._sessions.get(recording.session)
        if calls is None:
            calls = [(r.seq or 0, r.key) for r in self.store.recordings(session=recording.session)]
            self._sessions[recording.session] = calls
        return [key for seq, key in calls if seq < (recording.seq or 0)]

    def state_of(self, recording: Recording) -> tuple[str, ...]:
        """The state-changing calls made before ``recording`` in its session."""
        cached = self._prefix_mut.get(recording.id)
        if cached is None:
            cached = tuple(k for k in self._prefix(recording) if self.is_mutating(k))
            self._prefix_mut[recording.id] = cached
        return cached

    def choose(
        self, recordings: Sequence[Recording], history: Sequence[str], strict: bool = True
    ) -> Recording | None:
        """The recording made from this episode's state that best matches its history.

        Args:
            recordings: Candidates, all answering the same call.
            history: The episode's call keys so far.
            strict: Return None when no candidate was made from this state (else: best history match).

        Returns:
            The chosen recording, or None.
        """
        if not recordings:
            return None
        made = self._translate(history)
        state = tuple(k for k in made if self.is_mutating(k))
        eligible = [r for r in recordings if self.state_of(r) == state]
        if not eligible:
            if strict:
                return None
            eligible = list(recordings)
        if len(eligible) == 1:
            return eligible[0]
        return max(eligible, key=lambda r: (history_affinity(r, made, self._prefix(r)), -r.id))
