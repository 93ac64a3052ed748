"""Miss policies: what the replay answers when no recording answers a call with certainty.

- :mod:`~replay_sim.replay.policies.miss` — what every policy shares (:class:`Miss`,
  :class:`MissSettings`, the :class:`MissPolicy` protocol) and the two that need only the store,
  ``error`` and ``nearest``;
- :mod:`~replay_sim.replay.policies.live` — forward to one real server and record its answer;
- :mod:`~replay_sim.replay.policies.synthesize` — ask an LLM;
- :mod:`~replay_sim.replay.policies.registry` — the policies by name (``--miss``).
"""
