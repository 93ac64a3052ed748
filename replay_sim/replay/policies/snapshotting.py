"""State snapshots in the ``sandbox`` policy: which state to keep, which to start from, when not to.

Re-play brings a fresh instance to an episode's state by sending its state-changing calls, one by
one: its cost grows with the episode's prefix. Where the pool keeps state snapshots
(:class:`~replay_sim.replay.policies.instances.SnapshotStore`: a confined instance's files), an
instance that reached a state is snapshotted, and a later instance bound to any episode at that
state — or past it — starts from a copy and is sent only the calls the snapshot lacks.

**The key** of a state is the server's sandbox fingerprint (its config and code) and the sequence of
calls that made it, each with the answer it got (canonical: :func:`~replay_sim.canonical.answer_text`,
``_meta`` aside): so two episodes that made the same calls and were told the same answers share it,
whichever recordings answered them. A state is snapshotted when it holds at least ``after``
state-changing calls (the pool's setting; fewer are cheaper re-played on a warm instance):

- **after a re-play** of at least ``after`` calls, under the episode's lock (between calls: the files
  are as the last answer left them), keyed by exactly the calls re-played;
- **when an instance is given back** idle, at its MCP session's end, at its episode's end or when
  it is reclaimed at the cap (not when a call to it did not finish), keyed by every call it was
  sent that is not declared read-only, in order — what a later episode's re-play would send. At the
  cap a caller waits for its place meanwhile: the probe is given :data:`WAITED_PROBE_S`, and files
  too many or too large to copy at once are not copied (the pool's bounds).

A snapshot is started from only where it is worth it: with a warm instance ready, only when the
calls it holds took longer (their recorded latencies) than the server's last instance took to
start (:meth:`~replay_sim.replay.policies.instances.SnapshotStore.worth`).

**State held in the process is never restored from files.** A snapshot holds files only; whether a
server keeps its state there is found out, not configured. When a snapshot is taken, the instance is
asked the server's *probe* — its canary call (recorded from the initial state), when its tool is
declared read-only — and the answer is kept with it. An instance started from the snapshot is asked
the probe before anything else and must answer it the same way; if it does not, the server is
*process-stated*: no snapshot of it is used for the pool's life, the instance is ended, and the
episode is re-played on a fresh one, as without snapshots — never an answer from a wrong state.
Until one start has passed with a *telling* probe (whose answer at the snapshot's state differs
from its recorded initial-state answer, so a fresh process that read nothing of the files would
have failed it), only snapshots with a telling probe are used. A server without a probe gets no
snapshots. The probe shows that the files carry the state it sees; a server keeping part of its
state in the process and part in files, where the probe sees only the files' part, is not told
apart — declare such a server's probe tool otherwise (not read-only), and it gets none.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from replay_sim.canonical import answer_text
from replay_sim.errors import ReplaySimError, SandboxUnavailable
from replay_sim.replay.policies.canary import Canary
from replay_sim.replay.policies.instances import Reclaim, SandboxInstance, SandboxPool, SnapshotStore
from replay_sim.replay.policies.recording import Source
from replay_sim.resolve.lineage import StateLookup
from replay_sim.store import Recording

__all__ = ["WAITED_PROBE_S", "Snapshotting"]

WAITED_PROBE_S = 2.0
"""Seconds the probe of an instance reclaimed at the cap may take (a caller waits for its place)."""


class Snapshotting:
    """Takes state snapshots of a policy's instances and starts instances from them, verified.

    Args:
        pool: The sandbox pool (its ``snapshots``, when it keeps any).
        lookup: The resolver's state lookup (which tools are declared read-only).
        canary: The servers' canary calls (a server's probe is its canary, declared read-only).
        source: The fingerprint of a server's sandbox config and code (None: no snapshots for it).
    """

    def __init__(
        self,
        pool: SandboxPool,
        lookup: StateLookup,
        canary: Canary,
        source: Callable[[str], Source | None],
    ) -> None:
        self.pool = pool
        self.store: SnapshotStore | None = getattr(pool, "snapshots", None)
        self.lookup = lookup
        self.canary = canary
        self.source = source
        self.process_stated: dict[str, str] = {}
        """Servers whose snapshots are not used (an instance started from one answered otherwise), and why."""
        self.trusted: set[str] = set()
        """Servers an instance started from a snapshot has answered a telling probe for."""
        self.counts: Counter[str] = Counter()
        """``taken`` (``reclaimed``: of instances reclaimed at the cap), ``started`` (instances
        started from a snapshot), ``restored`` (calls not re-played thanks to one), ``refused``
        (starts that failed the probe), ``failed`` (snapshots that failed — its files unreadable, its
        probe unanswered — leaving the instance as it was: :attr:`failure` says the last one's why)."""
        self.failure: str | None = None

    def stats(self) -> dict[str, Any]:
        """What was taken and started, the process-stated servers, and the pool's store."""
        store = None if self.store is None else self.store.stats()
        counted = ("taken", "reclaimed", "started", "restored", "refused", "failed")
        return {**{k: self.counts[k] for k in counted}, "failure": self.failure,
                "process_stated": sorted(self.process_stated), "store": store}  # fmt: skip

    async def start(
        self,
        server: str,
        given: list[Recording],
        timeout: float,
        reclaim: Reclaim,
        fresh: Callable[[], Awaitable[SandboxInstance]],
    ) -> tuple[SandboxInstance, int]:
        """An instance for an episode whose state ``given`` makes: from the longest snapshot, else fresh.

        Args:
            server: The sandbox server.
            given: The calls that make the episode's state (what re-play would send).
            timeout: Seconds to wait for an instance (each of the two, when a snapshot fails).
            reclaim: The policy's :meth:`~replay_sim.replay.policies.lifecycle.Keeper.reclaim`.
            fresh: A fresh instance at the initial state, past its server's canaries
                (:meth:`~replay_sim.replay.policies.canary.Canary.admit`).

        Returns:
            The instance, and how many of ``given`` it holds already (0: a fresh one, at the
            initial state, to be re-played everything).

        Raises:
            SandboxUnavailable: No fresh instance could be had either.
            Divergence: The server's sandbox is refused by its canaries (from ``fresh``).
        """

        found = self._found(server, given)
        if found is None:
            return await fresh(), 0
        probe, key, n, meta = found
        try:
            instance = await self.pool.acquire(server, timeout=timeout, reclaim=reclaim, snapshot=key)
        except SandboxUnavailable:  # evicted meanwhile, or its start failed: re-played as without
            return await fresh(), 0
        try:
            answer = await instance.call(probe.method, probe.params)
        except ReplaySimError:
            answer = None
        except BaseException:  # cancelled: its client left
            with anyio.CancelScope(shield=True):
                await instance.close()
            raise
        if answer is not None and answer_text(answer.get("result"), answer.get("error")) == meta["probe"]:
            self.trusted.update([server] if meta.get("telling") else [])
            self.counts["started"] += 1
            self.counts["restored"] += n
            return instance, n
        with anyio.CancelScope(shield=True):
            await instance.close()
        if answer is not None:
            self.counts["refused"] += 1
            self.process_stated[server] = (
                f"instance {instance.id}, started from a snapshot of its files, answered the probe "
                f"{probe.name} otherwise than the instance the snapshot was taken from: its state is "
                "(also) held in the process"
            )
        return await fresh(), 0

    async def take(
        self, server: str, instance: SandboxInstance, calls: list[Recording], *, waiting: bool = False
    ) -> bool:
        """Snapshot an idle instance whose state ``calls`` made (sent in order from the initial state).

        ``waiting``: a caller waits for its place (it is reclaimed at the cap): the probe is given
        :data:`WAITED_PROBE_S` and the store copies only files within its bounds for a wait.

        Raises:
            InstanceLost: The instance died while asked the probe.
            UpstreamError: The probe timed out.
        """
        probe = self._probe(server)
        if probe is None or self.store is None or len(calls) < self.store.after:
            return False
        key = self._keys(server, calls)[-1]
        if self.store.kept(key):
            return False
        answer = None
        with anyio.move_on_after(WAITED_PROBE_S if waiting else None):
            answer = await instance.call(probe.method, probe.params)
        if answer is None:
            return False  # the probe took longer than a waiting caller is kept waiting for it
        seen = answer_text(answer.get("result"), answer.get("error"))
        meta = {"probe": seen, "telling": seen != answer_text(probe.result, probe.error)}
        try:
            kept = await self.store.take(instance, key, meta, waiting=waiting)
        except OSError as exc:  # its files could not be read or copied: no snapshot, the instance goes on
            self._failed(instance, exc)
            return False
        self.counts["taken"] += kept
        self.counts["reclaimed"] += kept and waiting
        return kept

    async def keep(self, instance: SandboxInstance, made: list[Recording], reclaimed: bool = False) -> None:
        """Snapshot an instance given back idle (before it is closed): the calls it was sent ``made``
        its state, those declared read-only aside. Never raises: a failure only means no snapshot
        (counted ``failed``, its why kept in :attr:`failure`).

        ``reclaimed``: at the cap, a caller waiting for its place (``take(waiting=True)``)."""
        server = instance.server
        read_only = self.lookup.declared_read_only
        calls = [r for r in made if r.method == "tools/call" and not read_only(server, r.name)]
        try:
            if instance.alive:
                await self.take(server, instance, calls, waiting=reclaimed)
        except Exception as exc:  # it runs in the policy's task group: a failure only means no snapshot
            self._failed(instance, exc)

    def _failed(self, instance: SandboxInstance, exc: Exception) -> None:
        self.counts["failed"] += 1
        self.failure = f"instance {instance.id}: {type(exc).__name__}: {exc}"

    def _found(
        self, server: str, given: list[Recording]
    ) -> tuple[Recording, str, int, dict[str, Any]] | None:
        """The snapshot to start from for ``given``: the probe, its key, the calls it holds, its meta."""
        probe = self._probe(server)
        if probe is None or self.store is None or len(given) < self.store.after:
            return None
        keys = self._keys(server, given)
        found = self.store.find(server, keys)
        if found is None or found[0] < self.store.after:
            return None
        n, meta = found
        if server not in self.trusted and not meta.get("telling"):
            return None  # not yet shown that the files carry its state: only a telling probe can
        if not self.store.worth(server, sum(call.latency_ms or 0.0 for call in given[:n]) / 1000):
            return None  # a warm instance re-plays it faster (by the recorded latencies)
        return probe, keys[n - 1], n, meta

    def _probe(self, server: str) -> Recording | None:
        """The call asked to tell a snapshot's state (the canary, declared read-only), or None."""
        if self.store is None or not self.store.enabled(server) or server in self.process_stated:
            return None
        if self.source(server) is None:
            return None
        canary = self.canary.choose(server)
        if canary is None or not self.lookup.declared_read_only(server, canary.name):
            return None
        return canary

    def _keys(self, server: str, calls: list[Recording]) -> list[str]:
        """The key of the state after each prefix of ``calls``: fingerprint, calls and answers."""
        source = self.source(server)
        digest = hashlib.sha256(f"{server}\0{source[0] if source else ''}".encode())
        keys = []
        for call in calls:
            digest.update(f"\0{call.key}\0".encode())
            digest.update(hashlib.sha256(answer_text(call.result, call.error).encode()).digest())
            keys.append(digest.copy().hexdigest())
        return keys
