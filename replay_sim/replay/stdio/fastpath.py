"""The stdio door's fast path: request lines answered from prepared bytes before the SDK reads them.

:class:`StdioFastPath` answers once the connection's era is settled: the client's first request
(which decides it for the SDK) and everything the SDK must see go on to the SDK. A line repeating one
it answered (but for its id) is answered again from what that answer depended on, checked per call
(:meth:`Prepared.again <replay_sim.replay.core.prepared.Prepared.again>`), without parsing or
resolving it. The checks are the SDK's, done cheaply (:mod:`~replay_sim.replay.core.checks`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from mcp.server import Server
from mcp.shared.inbound import InboundModernRoute, classify_inbound_request

from replay_sim.errors import EpisodeError
from replay_sim.protocol import agreed_episode
from replay_sim.replay.core.checks import RequestChecks, handshake_meta
from replay_sim.replay.core.prepared import Again, Prepared, Style, envelope
from replay_sim.stdio_transport import Opening, Repeated, request_of

__all__ = ["StdioFastPath"]

_REPEATS = 1024  # request lines kept to be answered again (each up to _REPEATED_LINE bytes)
_REPEATED_LINE = 16 << 10


class StdioFastPath(RequestChecks):
    """The fast path of a stdio server: request lines answered from prepared bytes before the SDK reads them.

    A :class:`~replay_sim.stdio_transport.Shortcut` for :func:`~replay_sim.stdio_transport.native_stdio`.

    Args:
        prepared: The replay's prepared answers.
        name: The recorded server served.
        server: Its SDK server.
        client: The history key of the one client of the process.
    """

    def __init__(self, prepared: Prepared, name: str, server: Server[Any], client: Hashable) -> None:
        super().__init__(prepared, {name: server})
        self.name = name
        self.client = client
        self.opening = Opening()
        self._repeats: dict[bytes, tuple[Again, Hashable]] = {}  # template -> its call, its scope

    def answer(self, line: bytes) -> bytes | None:
        """The response line to a request line, or None: the SDK reads the line.

        A line repeating one answered before but for its id (a client calling a tool again) is
        answered from what that answer depended on, without parsing or resolving it, when
        :meth:`Prepared.again <replay_sim.replay.core.prepared.Prepared.again>` finds it unchanged.
        """
        repeated = Repeated.split(line) if len(line) <= _REPEATED_LINE else None
        if repeated is not None:
            found = self._repeats.get(repeated.template)
            if found is not None:
                result = self.prepared.again(*found)
                if result is not None:
                    return envelope(repeated.id, result, Style.PYDANTIC)
        request = request_of(line)
        if request is None:
            return None
        params = request.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        modern = isinstance(meta, dict) and "io.modelcontextprotocol/protocolVersion" in meta
        if self.opening.request(request, modern) or not self.opening.ready(modern):
            return None
        params = self.request_params(self.name, request)
        if params is None:
            return None
        if modern:
            route = classify_inbound_request(request)
            if not isinstance(route, InboundModernRoute):
                return None
            version = route.protocol_version
            if not self.envelope_valid(request["method"], version, params["_meta"]):
                return None
        elif not handshake_meta(meta):
            return None
        else:
            assert self.opening.version is not None
            version = self.opening.version
        try:
            episode = agreed_episode(None, None, meta)
        except EpisodeError:
            return None
        scope: Hashable = episode if episode is not None else self.client
        answered = self.prepared.answer_again(
            self.name, request["method"], params, scope, version, Style.PYDANTIC
        )
        if answered is None:
            return None
        result, again = answered
        if repeated is not None:
            self._repeats.pop(repeated.template, None)  # what it kept no longer holds
            if again is not None and repeated.holds(request):
                if len(self._repeats) >= _REPEATS:
                    del self._repeats[next(iter(self._repeats))]
                self._repeats[repeated.template] = (again, scope)
        return envelope(request["id"], result, Style.PYDANTIC)

    def sent(self, message: Any) -> None:
        """Watch what the server writes (its answer to ``initialize``)."""
        self.opening.sent(message)

    def opened(self, write: Any) -> None:
        """Answers go back as lines of the transport's own (nothing else is written)."""
