"""Calibrated confidence: the probability, learned from the store, that a recording is the real answer.

- :mod:`~replay_sim.resolve.confidence.features` — what the resolver knows of a candidate, as features;
- :mod:`~replay_sim.resolve.confidence.forming` — the best candidate the store holds for a call;
- :mod:`~replay_sim.resolve.confidence.model` — the sign-constrained logistic model and its file;
- :mod:`~replay_sim.resolve.confidence.leaveoneout` — labelled examples by hiding each recording;
- :mod:`~replay_sim.resolve.confidence.judge` — a confidence on every resolution, and the operating point;
- :mod:`~replay_sim.resolve.confidence.reliability` — calibration measured (reliability, ECE).
"""
