"""One replay replica: the unchanged replay app over a verified snapshot, serving buffered requests.

Each replica verifies the snapshot bundle against the id the deployment was built for, opens its
store read-only, loads the index and the model once (the app's startup) and then answers the
:class:`~replay_sim.scale.wire.Envelope` s (its own front's, or forwarded by another replica's) with
exactly what ``replay-sim serve`` answers.
Around the app it does three things:

- **names itself**: every response carries ``X-Replay-Replica: <replica id>`` and ``/metrics``
  labels every sample ``replica="<id>"``, so per-replica figures can be told apart;
- **owns its MCP sessions**: a session id the SDK mints here is handed out as
  ``r-<replica>.<id>`` (:func:`~replay_sim.scale.affinity.session_id_for`) and stripped again on the
  way in, so the session's later requests (POST, the GET stream, DELETE) are routed here by the id
  alone; a session minted elsewhere is refused as lost;
- **owns its episodes**: an episode it has not seen is claimed in the registry
  (:mod:`~replay_sim.scale.registry`) before its first call is answered; one held elsewhere is sent
  back to the front (:data:`~replay_sim.scale.wire.REDIRECT`), which forwards it — never started
  afresh here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.types import Message

from replay_sim.errors import SnapshotError
from replay_sim.record.config import RecorderConfig
from replay_sim.record.config_file import load_config
from replay_sim.record.instances import InstancePool
from replay_sim.record.instances.building import sandbox_pool
from replay_sim.replay.factory import open_replay
from replay_sim.replay.http.app import create_app
from replay_sim.replay.policies.recording import sandbox_side_file
from replay_sim.scale.affinity import REPLICA_HEADER, SESSION_HEADER, session_id_for, split_session_id
from replay_sim.scale.lost import lost
from replay_sim.scale.wire import REDIRECT, Envelope, Lifespan, run_buffered
from replay_sim.store.snapshot import STORE_FILE

__all__ = ["REPLICA_HEADER", "ReplayReplica", "replica_pool"]

READY_TIMEOUT = 600.0
"""Seconds a starting replica waits for its warm-up (index, model) before taking requests anyway."""

_HELD_CACHE = 200_000
_SESSION = SESSION_HEADER.encode()
_SAMPLE = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^\n]*?\})?( [^\n]*)$", re.MULTILINE)

Claim = Callable[[str, str], Awaitable[str]]
"""Claims an episode for a replica in the registry; returns its holder."""


class ReplayReplica:
    """The replica's serving logic (the Serve deployment wraps it; see :mod:`~replay_sim.scale.deploy`).

    Args:
        replica: This replica's id.
        app: The replay app (:func:`~replay_sim.replay.http.app.create_app`), already started.
        claim: How an unknown episode is claimed in the registry.
    """

    def __init__(self, replica: str, app: Any, claim: Claim) -> None:
        self.replica = replica
        self.app = app
        self.claim = claim
        self._held: OrderedDict[str, None] = OrderedDict()
        self._tag = replica.encode()

    @classmethod
    async def open(
        cls, replica: str, snapshot: str, snapshot_id: str, app_options: dict[str, Any], claim: Claim
    ) -> tuple[ReplayReplica, Lifespan]:
        """Verify and open the snapshot, build and start the replay app.

        Raises:
            SnapshotError: The bundle is missing, tampered with, or not the snapshot deployed.
        """
        options = dict(app_options)
        miss = options.pop("miss", "error")
        detail = options.pop("miss_detail", "full")
        point = options.pop("min_confidence", None)
        sandboxes = options.pop("sandboxes", None)  # this replica's own pool: its episodes' instances
        pool, wiring = None, {}
        if sandboxes is not None:
            config = load_config(sandboxes["config"])
            where = (Path(snapshot), Path(sandboxes["config"]))
            pool = await asyncio.to_thread(replica_pool, config, *where, **sandboxes["pool"])
            wiring = {"redactor": config.recorded_redactor(), **sandboxes["policy"]}
        replay = await asyncio.to_thread(
            open_replay,
            snapshot=Path(snapshot),
            miss=miss,
            miss_detail=detail,
            sandboxes=pool,
            min_confidence=point,
            **wiring,
        )
        if replay.snapshot != snapshot_id:
            raise SnapshotError(
                f"replica {replica}: the bundle at {snapshot} is snapshot {replay.snapshot}, but this "
                f"deployment serves {snapshot_id}: every node must hold the same bundle at that path"
            )
        app = create_app(replay, freeze_gc=True, **options)
        lifespan = Lifespan(app)
        await lifespan.startup()
        # Serve counts a replica up once this returns: only when the replica is ready (its index
        # loaded; tools' matching state and the model load on first need), as it says so.
        if app.readiness is not None:
            await asyncio.to_thread(app.readiness.wait, READY_TIMEOUT)
        return cls(replica, app, claim), lifespan

    async def handle(self, envelope: Envelope) -> AsyncIterator[list[Message]]:
        """Answer one request, streaming its ASGI messages in batches."""
        affinity = envelope.affinity
        scope = dict(envelope.scope)
        if affinity.session is not None:
            minted_by, session = split_session_id(affinity.session)
            if minted_by is not None and minted_by != self.replica:
                yield lost(affinity, minted_by, envelope.body)
                return
            scope["headers"] = [(k, session.encode() if k == _SESSION else v) for k, v in scope["headers"]]
        if envelope.target is not None and envelope.target != self.replica:
            yield lost(affinity, envelope.target, envelope.body)
            return
        if affinity.episode is not None and not await self._holds(affinity.episode):
            holder = await self.claim(affinity.episode, self.replica)
            if holder != self.replica:
                yield [{"type": REDIRECT, "replica": holder}]
                return
            self._remember(affinity.episode)
        path = scope.get("path")
        metrics = path == "/metrics"
        created = affinity.episode is None and path == "/api/episodes" and scope["method"] == "POST"
        async for batch in run_buffered(self.app, scope, envelope.body):
            if created:  # an episode with an id of the replay's choosing: this replica holds it
                await self._claim_created(batch)
            yield [self._stamp(m, metrics) for m in batch]

    async def _claim_created(self, batch: list[Message]) -> None:
        """Claim the episode a ``POST /api/episodes`` without an id created here (its id is in the answer)."""
        for message in batch:
            if message["type"] == "http.response.body" and message.get("body"):
                with contextlib.suppress(ValueError, AttributeError):
                    episode = json.loads(message["body"]).get("id")
                    if isinstance(episode, str):
                        await self.claim(episode, self.replica)
                        self._remember(episode)

    async def _holds(self, episode: str) -> bool:
        if episode in self._held:
            self._held.move_to_end(episode)
            return True
        return False

    def _remember(self, episode: str) -> None:
        self._held[episode] = None
        while len(self._held) > _HELD_CACHE:  # a cache: the registry remembers the rest
            self._held.popitem(last=False)

    def _stamp(self, message: Message, metrics: bool) -> Message:
        """Name this replica on a response; hand out this replica's session ids; label metrics."""
        if message["type"] == "http.response.start":
            headers = [
                (k, session_id_for(self.replica, v.decode()).encode() if k.lower() == _SESSION else v)
                for k, v in message.get("headers", [])
                if not (metrics and k.lower() == b"content-length")
            ]
            headers.append((REPLICA_HEADER.encode(), self._tag))
            return {**message, "headers": headers}
        if metrics and message["type"] == "http.response.body" and message.get("body"):
            return {**message, "body": self._label(message["body"])}
        return message

    def _label(self, text: bytes) -> bytes:
        """Prometheus text with ``replica="<id>"`` added to every sample."""
        label = b'replica="' + self._tag + b'"'

        def add(match: re.Match[bytes]) -> bytes:
            name, labels, rest = match.group(1), match.group(2), match.group(3)
            inner = label if not labels or labels == b"{}" else labels[1:-1] + b"," + label
            return name + b"{" + inner + b"}" + rest

        return _SAMPLE.sub(add, text)


def replica_pool(config: RecorderConfig, snapshot: Path, config_file: Path, **sizes: Any) -> InstancePool:
    """A replica's own pool of sandbox instances, from the recorder config (``serve --ray --miss sandbox``).

    Each replica owns the instances of the episodes it holds (affinity sends an episode's every
    request to it); a replica's death loses them with its episodes. Built as ``replay-sim serve``
    builds it (:func:`sandbox_pool`, ``sizes`` its keywords): the bundle, its side store and the
    config file are hidden from every instance, each server's instances start their clock when its
    recordings in the snapshot began and are shown the paths under ``/tmp`` those recordings name.
    """
    served = snapshot.resolve() / STORE_FILE  # verified by the replay, which opens it too
    hidden = [sandbox_side_file(served), config_file.resolve()]
    return sandbox_pool(config, store=served, hidden=hidden, **sizes)
