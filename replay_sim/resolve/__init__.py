"""The resolve stage: which recording answers a call.

- :mod:`~replay_sim.resolve.resolver` — the tiers (exact → canonical → semantic → miss);
  :mod:`~replay_sim.resolve.resolution` — what it answers (tier, problem, near misses).
- :mod:`~replay_sim.resolve.lineage` — which recordings were made from an episode's state;
  :mod:`~replay_sim.resolve.tooleffects` — which tools change it (learned, kept in the store).
- :mod:`~replay_sim.resolve.toolstate`, :mod:`~replay_sim.resolve.invariance`,
  :mod:`~replay_sim.resolve.calibration` — per-tool matching: normalisation, learned invariances,
  thresholds and the matching config; :mod:`~replay_sim.resolve.schemas` — recorded tool schemas.
- :mod:`~replay_sim.resolve.embedding`, :mod:`~replay_sim.resolve.static_embedding`,
  :mod:`~replay_sim.resolve.embedders`, :mod:`~replay_sim.resolve.vectors`,
  :mod:`~replay_sim.resolve.index`, :mod:`~replay_sim.resolve.build` — embeddings (the model, its
  opt-in static token vectors, which one an index names), faiss partitions, the persisted index
  and keeping it current; :mod:`~replay_sim.resolve.snapshot` —
  snapshots frozen with that index; :mod:`~replay_sim.resolve.runtime` — opt-in process settings.
- :mod:`~replay_sim.resolve.evaluate` — scoring against live truth.
"""
