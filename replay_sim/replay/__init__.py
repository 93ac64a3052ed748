"""The replay stage: an MCP server that looks like the recorded servers and answers from the recordings.

Split by what each part does; imports run one way, top to bottom (``make lint`` checks it)::

    http/  stdio/     the doors: HTTP (app, router, admin API, serving()) and stdio (fast path, start table)
    factory           open_replay(): a store or snapshot, its resolver, policy and shaping, wired up
    policies/ shaping/  what a miss gets (error, nearest, live, sandbox, synthesize); faults and latency
    core/             one replayed call answered: Replay, answering, prepared answers, histories, episodes
    observe/          metrics, readiness
    options           the vocabulary every part shares (miss policy names, miss detail, limits)
"""
