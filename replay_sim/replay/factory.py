"""Opening a replay: a store (or a verified snapshot), its resolver, redactor and miss policy, wired up.

Everything the replay needs from elsewhere comes in built: the redaction rules and secret values
the recorder used, and — for the ``live`` miss policy — the callable that forwards a call to the real
server (``replay_sim.record.forward.Forwarder`` builds one from a recorder config). The replay
side never reads a recorder config itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from replay_sim.errors import ConfigError
from replay_sim.redaction import RULES_META_KEY, Redactor
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.options import (
    DEFAULT_SANDBOX_CALL_LIMIT,
    DEFAULT_SANDBOX_IDLE,
    MissDetail,
    MissPolicyName,
)
from replay_sim.replay.policies.instances import SandboxPool
from replay_sim.replay.policies.miss import Forward, MissSettings
from replay_sim.replay.policies.registry import serving_policy
from replay_sim.replay.shaping.faults import Faults, Latency
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.snapshot import match_config as frozen_match_config
from replay_sim.resolve.snapshot import open_snapshot
from replay_sim.store import DEFAULT_DB, Store

__all__ = ["open_replay"]


def open_replay(
    db: str | Path | None = None,
    *,
    snapshot: str | Path | None = None,
    miss: str = MissPolicyName.ERROR,
    redactor: Redactor | None = None,
    forward: Forward | None = None,
    sandboxes: SandboxPool | None = None,
    sandbox_timeout: float = 30.0,
    sandbox_idle: float | None = DEFAULT_SANDBOX_IDLE,
    sandbox_call_limit: float | None = DEFAULT_SANDBOX_CALL_LIMIT,
    llm_url: str | None = None,
    llm_model: str | None = None,
    llm_api_key: str | None = None,
    index_dir: str | Path | None = None,
    match_config: MatchConfig | None = None,
    min_confidence: float | None = None,
    latency: Latency | str | None = None,
    faults: Faults | None = None,
    miss_detail: str = MissDetail.FULL,
) -> Replay:
    """Open an existing store (or a verified snapshot) and build the replay servers over it.

    Args:
        db: The recording store (default ``cache/replay.db``; ignored with ``snapshot``).
        snapshot: A snapshot bundle; verified first, served read-only, its id cited in provenance.
        miss: Miss policy name.
        redactor: The redaction rules and secret values the recordings were made with, beyond the
            rules the store records (the secret values only the recorder config knows). Applied to
            incoming calls, so a call carrying a secret finds its redacted recording.
        forward: How the ``live`` miss policy reaches the real servers. When it is an async context
            manager too (as ``Forwarder`` is), it is entered around serving: it holds the connections.
        sandboxes: Where the ``sandbox`` miss policy takes instances of the real servers (the
            record side's pool, ``replay_sim.record.instances.building.sandbox_pool``); entered around serving
            when it is an async context manager. Given with another ``miss``, its servers' misses
            are still answered by sandboxes, the others' by ``miss``.
        sandbox_timeout: Seconds a call may wait for a sandbox instance before it is a miss saying so.
        sandbox_idle: Seconds after which an idle episode's instance is given back (None: never);
            the episode's next call rebuilds its state on a fresh one.
        sandbox_call_limit: Seconds one call to a sandbox instance may take at most, progress
            notifications or not (None: only the server's own timeout, which progress extends).
        llm_url: OpenAI-compatible endpoint (miss policy ``synthesize``).
        llm_model: Model name for ``llm_url``.
        llm_api_key: Bearer token for ``llm_url``, if it needs one.
        index_dir: Where the vector index lives (default: the resolver's). A snapshot is served
            with its own index, which its id covers: another one is refused.
        match_config: Thresholds and per-tool overrides (a snapshot brings the one it was frozen with).
        min_confidence: The operating point: answers whose learned confidence reaches it are served,
            others go to the miss policy (None: the strict tiers decide, as before).
        latency: How long answers are held: ``none`` (default), ``recorded``, ``fixed:MS``, ``scale:F``.
        faults: Which tool calls fail on purpose, and how (default: none).
        miss_detail: How much a miss tells the client: ``full`` (the nearest recordings and the
            arguments in which they differ), ``reason`` (no argument values), ``none`` (only that
            no recording matches).

    Returns:
        The replay, ready for :func:`~replay_sim.replay.http.app.create_app` or
        :func:`~replay_sim.replay.stdio.serve.serve_stdio`.

    Raises:
        ConfigError: Inconsistent options (a writing miss policy on a read-only snapshot, another
            index than a snapshot's own, ``live`` without ``forward``, ``sandbox`` without
            ``sandboxes``, a malformed latency, an unknown miss detail …).
        SnapshotError: The snapshot is missing or tampered with.
        StoreError: The store does not exist or cannot be opened.
    """
    policy = MissPolicyName(miss)
    if miss_detail not in tuple(MissDetail):
        raise ConfigError(f"unknown miss detail {miss_detail!r}: choose {', '.join(MissDetail)}")
    detail = MissDetail(miss_detail)
    if isinstance(latency, str):
        latency = Latency.parse(latency)  # before opening anything
    snapshot_id: str | None = None
    resolver_options: dict[str, Any] = {}
    if snapshot is not None:
        if policy in (MissPolicyName.LIVE, MissPolicyName.SYNTHESIZE):
            raise ConfigError(f"--miss {policy} records new answers, but snapshot {snapshot} is read-only")
        opened = open_snapshot(snapshot)
        if index_dir is not None and Path(index_dir).resolve() != opened.index_dir.resolve():
            raise ConfigError(
                f"snapshot {snapshot} is served with its own index ({opened.index_dir}), which its id "
                f"{opened.id} covers; drop --index-dir {index_dir}, or serve --db with that index"
            )
        frozen_with = frozen_match_config(opened)
        if match_config is not None and match_config != frozen_with:
            raise ConfigError(
                f"snapshot {snapshot} is served with the matching config it was frozen with; "
                "drop --match-config or freeze a new snapshot with it"
            )
        snapshot_id, match_config = opened.id, frozen_with
        store = Store(opened.store_path, readonly=True)
        resolver_options["index_dir"] = opened.index_dir
    else:
        # A mistyped path must not replay an empty store: refuse to create one.
        store = Store(db if db is not None else DEFAULT_DB, create=False)
        if index_dir is not None:
            resolver_options["index_dir"] = Path(index_dir)
    connections = forward if isinstance(forward, AbstractAsyncContextManager) else None
    settings = MissSettings(
        store=store,
        forward=forward,
        connections=connections,
        sandboxes=sandboxes,
        sandbox_timeout=sandbox_timeout,
        sandbox_idle=sandbox_idle,
        sandbox_call_limit=sandbox_call_limit,
        llm_url=llm_url,
        llm_model=llm_model,
        llm_api_key=llm_api_key,
    )
    resolver = Resolver(store, config=match_config, min_confidence=min_confidence, **resolver_options)
    settings.lookup = resolver.lookup  # what the sandbox policy re-plays an episode's state from
    settings.stored = resolver.catch_up
    chosen, holds = serving_policy(policy, settings)
    recorded_with = Redactor.from_rules(store.meta(RULES_META_KEY))
    redactor = recorded_with if redactor is None else recorded_with.merged(redactor)
    return Replay(
        store,
        resolver=resolver,
        policy=chosen,
        policy_name=policy,
        holds=holds,
        snapshot=snapshot_id,
        redactor=redactor,
        latency=latency,
        faults=faults,
        miss_detail=detail,
    )
