"""Per-client fairness of the episode creation rate (issue 29, item 4): a flooding client spends its
own share; another client still creates episodes; the server's bound over all of them holds.

Clients are told apart by address: each test client connects from its own loopback address
(127.0.0.2, 127.0.0.3 …), real connections to a real server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from replay_helpers import ACCEPT, initialize, make_replay

from replay_sim.errors import ConfigError, EpisodeError
from replay_sim.listener import serving_in_thread
from replay_sim.replay.http.app import create_app
from replay_sim.replay.http.fairness import ClientBuckets
from replay_sim.replay.options import Limits

# A burst of 4 for the server, 2 for each client; no refill within a test (one a thousand seconds).
LIMITS = Limits(episode_rate=0.001, episode_burst=4)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with serving_in_thread(create_app(make_replay(tmp_path / "fair.db"), limits=LIMITS)) as base:
        yield base


def _client(address: str) -> httpx2.Client:
    """An HTTP client whose connections come from ``address`` (a loopback address of its own)."""
    return httpx2.Client(transport=httpx2.HTTPTransport(local_address=address), timeout=30)


def _create(http: httpx2.Client, url: str) -> httpx2.Response:
    return http.post(f"{url}/api/episodes", json={})


def test_a_flooding_client_spends_its_own_share_and_another_client_still_creates_episodes(url: str) -> None:
    with _client("127.0.0.2") as flood, _client("127.0.0.3") as trainer, _client("127.0.0.4") as third:
        answers = [_create(flood, url) for _ in range(6)]
        assert [a.status_code for a in answers] == [201, 201, 503, 503, 503, 503]
        refused = answers[2]
        assert refused.headers["retry-after"] == "1"
        assert "127.0.0.2 is creating episodes faster than one client may" in refused.json()["detail"]
        assert [_create(trainer, url).status_code for _ in range(2)] == [201, 201]
        # the server's bound over every client holds: its burst of 4 is spent
        late = _create(third, url)
        assert late.status_code == 503 and "--episode-rate" in late.json()["detail"]
        assert "replay_sim_episodes_refused_per_client_total 4" in flood.get(f"{url}/metrics").text


def test_episodes_created_by_url_count_against_their_clients_share_too(url: str) -> None:
    def open_episode(http: httpx2.Client, episode: str) -> httpx2.Response:
        return http.post(f"{url}/episodes/{episode}/mcp/demo", json=initialize(), headers=ACCEPT)

    with _client("127.0.0.2") as flood, _client("127.0.0.3") as trainer:
        statuses = [open_episode(flood, f"flood-{i}").status_code for i in range(4)]
        assert statuses == [200, 200, 503, 503]
        assert open_episode(flood, "flood-0").status_code == 200  # a live episode goes on
        assert [open_episode(trainer, f"train-{i}").status_code for i in range(2)] == [200, 200]
        live: list[dict[str, Any]] = flood.get(f"{url}/api/episodes").json()
        assert sorted(e["id"] for e in live) == ["flood-0", "flood-1", "train-0", "train-1"]


def test_a_clients_bucket_refills_at_its_share_of_the_rate_and_full_buckets_are_forgotten() -> None:
    now = [0.0]
    buckets = ClientBuckets(rate=10, burst=4, share=0.5, clock=lambda: now[0])
    for _ in range(2):
        buckets.check("a", "e")
        buckets.spend("a")
    with pytest.raises(EpisodeError, match="5 a second after a burst of 2") as refused:
        buckets.check("a", "e")
    assert refused.value.status == 503
    buckets.check("b", "e")  # another client's bucket is its own
    now[0] = 0.2  # one episode back at 5 a second
    buckets.check("a", "e")
    assert len(buckets) == 1
    now[0] = 10.0
    assert len(buckets) == 0  # refilled: nothing kept


def test_a_share_of_one_is_the_servers_bound_alone_and_a_bad_share_is_refused() -> None:
    whole = ClientBuckets(rate=1, burst=1, share=1)
    for _ in range(5):
        whole.check("a", "e")
        whole.spend("a")
    with pytest.raises(ConfigError, match="share"):
        ClientBuckets(rate=1, burst=1, share=0)
