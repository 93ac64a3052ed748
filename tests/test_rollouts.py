"""RL-shaped load, bounded (issue 20): 64 rollouts on episode URLs pausing across the keep-alive band
while another process writes to the store; zero transport errors, zero wrong answers.

The full bench (64 / 256 / 1,024 rollouts, >10,000 calls) is ``python -m bench rollouts``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.rollouts import run


@pytest.mark.slow
def test_64_rollouts_pausing_across_the_keep_alive_band_lose_no_call_and_get_only_recorded_answers(
    tmp_path: Path,
) -> None:
    (tmp_path / "match.toml").write_text("[defaults]\nsemantic = false\n")  # exact hits: no model to load
    # Idle gaps straddling httpx's 5 s keep-alive expiry, between 4 calls of each of 64 rollouts.
    results = run((64,), 4, (4.5, 6.0), "--match-config", str(tmp_path / "match.toml"))
    for result in results:
        assert result["transport_errors"] == [], result["label"]
        assert result["wrong"] == [], result["label"]
    assert [r["calls"] for r in results] == [256, 256]
    assert results[-1]["imports"] >= 1  # the store was written to meanwhile
