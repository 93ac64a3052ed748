"""A ``serve --stdio`` start that answers before the MCP SDK is loaded: ``initialize``, listings, exact hits.

Importing this package loads no MCP SDK (:mod:`~.write`, which ``index build`` runs, does).

Agent frameworks start an MCP server per rollout over stdio, and importing the MCP SDK, pydantic's
models and the resolver takes most of a second. What a rollout asks first — ``initialize``, the
listings, calls recorded exactly — needs none of it when it was prepared once: ``replay-sim index
build`` writes the *start table* (:data:`START_TABLE` in the index folder,
:mod:`~replay_sim.replay.stdio.start.write`), the replay's own answers to those requests, as the
replay writes them on stdio. A start reads it (:meth:`StartTable.open`, :mod:`~.table`) and answers
from it (:func:`serve_until_needed`, :mod:`~.session`); the replay is loaded only when a request
needs it: the first request the table cannot answer for certain hands the connection over
(:class:`Handover`), and the replay is told every request answered so far — their answers discarded,
each compared with the one sent — so the episode's history, metrics and the SDK's session are what
they would have been. A client that needs nothing else never loads the replay.

Only what does not depend on the episode is answered: a call recorded exactly, from the state every
session starts in, by a tool that does not change it — any number of them, in any order, when one
recording of it was made from that state; only as the session's first call otherwise (the recording
then chosen is the oldest). The table is a cache keyed by what it answers from (:mod:`~.table`):
the store's content version — a random token SQLite triggers renew on every write of a call,
listing, server or meta row, by any writer (:mod:`replay_sim.store.content`) — the store's
identity (its random id, real path, device and inode), the code (:func:`~.table.code_digest`), and
each of its own rows (a seal keyed by the store's id, checked when read); all checked at start in
a few single-row reads whatever the store's size. It is used only when all match, the store passed
its integrity check unchanged since (:mod:`replay_sim.store.verified`), and nothing the table
cannot see is asked of the replay (a snapshot, a recorder config, faults, latency, ``--strict``, a
matching config, a miss policy other than ``error`` and ``nearest``); otherwise the start says why
in one line on stderr. A store written meanwhile hands over at the next request. No line stops the
start: one it cannot read or key (``NaN``, ``1e999``, a lone surrogate, an id that is no string or
integer) goes to the replay, which answers it as it does without a table.
"""

from __future__ import annotations

from replay_sim.replay.stdio.start.session import Handover, request_key, serve_until_needed
from replay_sim.replay.stdio.start.table import START_TABLE, StartTable

__all__ = ["START_TABLE", "Handover", "StartTable", "request_key", "serve_until_needed"]
