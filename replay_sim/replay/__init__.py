"""The replay stage: an MCP server that looks like the recorded servers and answers from the recordings.

- :mod:`~replay_sim.replay.replay` — :class:`Replay`, answering one call (resolve, refuse, miss
  policy, re-enact, advance the episode); :mod:`~replay_sim.replay.server` builds each SDK server.
- :mod:`~replay_sim.replay.surface` — a recorded server's face (listings, schemas, refusals);
  :mod:`~replay_sim.replay.wire` — the recorded JSON on the wire;
  :mod:`~replay_sim.replay.conversation` — notifications and questions re-enacted;
  :mod:`~replay_sim.replay.histories` — episode histories;
  :mod:`~replay_sim.replay.provenance` — replies and their ``_meta`` provenance;
  :mod:`~replay_sim.replay.keeper` — the misses a replay keeps (admin API, miss log).
- Miss policies: :mod:`~replay_sim.replay.policies.miss` (protocol, ``error``, ``nearest``),
  :mod:`~replay_sim.replay.policies.live`, :mod:`~replay_sim.replay.policies.synthesize`, by name in
  :mod:`~replay_sim.replay.policies.registry`.
- Serving: :mod:`~replay_sim.replay.factory` (``open_replay``), :mod:`~replay_sim.replay.app`
  (``create_app``), :mod:`~replay_sim.replay.router` (``/mcp/<server>``), :mod:`~replay_sim.replay.api`
  (admin API), :mod:`~replay_sim.replay.metrics`, :mod:`~replay_sim.replay.runner` (``serve``).
"""
