"""Scale-out: replicas of one frozen snapshot on Ray Serve, every episode on one replica.

DESIGN.md "Scale-out". One replay process serves one machine's rollouts; beyond that, Ray Serve
runs N replicas of one snapshot, and every request of an episode or MCP session reaches the replica
holding its history (routed in Serve's proxy, forwarded by a replica when only the body names it):

- :mod:`~replay_sim.scale.affinity` — what a request belongs to (episode URL, ``_meta``, header,
  MCP session), and the session ids that name their replica;
- :mod:`~replay_sim.scale.ring` — which live replica owns an episode (rendezvous hashing);
- :mod:`~replay_sim.scale.wire` — the buffered request a replica is sent, and running the app on it;
- :mod:`~replay_sim.scale.gateway` — each replica's front: reads, forwards, reports losses;
- :mod:`~replay_sim.scale.router` — Ray Serve's request router for the replicas;
- :mod:`~replay_sim.scale.replica` — one replica: the unchanged replay app over the snapshot;
- :mod:`~replay_sim.scale.registry` — which replica holds each episode (so none restarts empty);
- :mod:`~replay_sim.scale.lost` — the errors a client gets for a lost episode or session;
- :mod:`~replay_sim.scale.deploy` — the Serve application, ``serve run`` builder and runner.

Ray is an optional extra (``pip install 'replay-sim[ray]'``): only ``router`` and ``deploy`` import
it, and nothing outside the CLI's ``serve --ray`` imports this package.
"""
