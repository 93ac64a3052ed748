"""Coverage commands: ``explore`` (learn what read-only tools ignore and, on a sandbox, which tools
change state, after the fact) and ``backfill
(ask the real servers the calls a replay missed, from the state it missed them in).

Both ask the real servers of a recorder config and record the answers into the store. What they
need from the resolver side — which tools change nothing, whether the store answers a miss — is
worked out here and handed in: the record stage never uses the resolver.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import click

from replay_sim.cli import cli, db_option, match_config_option
from replay_sim.cli.progress import Progress
from replay_sim.effects import Effect, Verdict
from replay_sim.record.backfill import backfill
from replay_sim.record.config import RecorderConfig
from replay_sim.record.config_file import load_config
from replay_sim.record.revisit import explore_store
from replay_sim.record.sandbox import Verdicts, probe_effects
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.lineage import DIVERGED
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.tooleffects import recorded_effects, store_effects
from replay_sim.store import Store
from replay_sim.store.misses import MissEntry, read_misses, side_file
from replay_sim.store.snapshot import STORE_FILE

config_option = click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Recorder config (TOML): how to reach each real server, and its reset command.",
)


def _read_only(effects: dict[str, dict[str, Verdict]]) -> Callable[[str, str], bool]:
    """Whether a tool changes nothing, as the resolver sees it (declared or learned ``effects``)."""

    def read_only(server: str, tool: str) -> bool:
        verdict = effects.get(server, {}).get(tool)
        return verdict is not None and verdict.effect is Effect.NONE

    return read_only


def _verdicts(store: Store, match_config: MatchConfig | None) -> Verdicts:
    """A server's tool effects from the store as it stands (worked out again on each call)."""
    schemas = RecordedSchemas(store, match_config)
    return lambda server: recorded_effects(store, server, schemas, match_config)


@cli.command("explore")
@config_option
@db_option
@match_config_option
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Most variant calls per tool, argument and difference, counting earlier runs'.",
)
@click.option("--max-calls", type=click.IntRange(min=1), help="Most calls to the real servers in this run.")
@click.option("--server", "servers", multiple=True, help="Only this recorded server (repeatable).")
def explore_command(
    config_file: Path,
    db: Path,
    match_config: MatchConfig | None,
    budget: int,
    max_calls: int | None,
    servers: tuple[str, ...],
) -> None:
    """Ask the real servers which argument differences their read-only tools ignore, from the store's calls.

    For stores recorded without `record --explore` or imported from JSONL: each recorded
    successful read-only call made at the initial state of its session is asked again in a fresh
    session (after the server's reset command, if it has one) and, if answered as recorded, its
    still-undecided variants are asked and recorded (origin explore). First, on servers the config
    declares `sandbox = true`, each tool of unknown effect is called before a few other recorded
    calls, each in a fresh session, to learn whether it changes what they answer.
    """
    config = load_config(config_file)
    with Store(db, create=False) as store, Progress("exploring", "call") as progress:
        lines = anyio.run(
            lambda: explore(
                store,
                config,
                match_config,
                budget=budget,
                max_calls=max_calls,
                servers=list(servers) or None,
                progress=progress,
            )
        )
    for line in lines:
        click.echo(line)


async def explore(
    store: Store,
    config: RecorderConfig,
    match_config: MatchConfig | None = None,
    *,
    budget: int = 4,
    max_calls: int | None = None,
    servers: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """What ``replay-sim explore`` does (its options as arguments); the report's lines.

    The sandboxes' effect probes first (:func:`~replay_sim.record.sandbox.probe_effects`), so the
    tools they show effect-free get their variants asked too
    (:func:`~replay_sim.record.revisit.explore_store`); then, for every server not declared a
    sandbox, the tools left of unknown effect.
    """
    lines = []
    if any(spec.sandbox for spec in config.servers.values()):
        learned = await probe_effects(
            store, config, _verdicts(store, match_config), servers=servers, max_calls=max_calls
        )
        lines += learned.lines()
        if max_calls is not None:
            max_calls -= learned.asked
            if max_calls <= 0:
                return [*lines, "no variants asked: --max-calls spent on the effect probes"]
    effects = store_effects(store, match_config)
    report = await explore_store(
        store,
        config,
        _read_only(effects),
        budget=budget,
        max_calls=max_calls,
        servers=servers,
        progress=progress,
    )
    return [*lines, *report.lines(), *_sandbox_hints(config, effects)]


def _sandbox_hints(config: RecorderConfig, effects: dict[str, dict[str, Verdict]]) -> list[str]:
    """What a server not declared a sandbox leaves unknown: its tools of unknown effect."""
    hints = []
    for name, spec in sorted(config.servers.items()):
        unknown = sorted(t for t, v in effects.get(name, {}).items() if v.effect is Effect.UNKNOWN)
        if unknown and not spec.sandbox:
            shown = ", ".join(unknown[:5]) + (", …" if len(unknown) > 5 else "")
            hints.append(
                f"{name}: {len(unknown)} tool(s) of unknown effect ({shown}), replayed as changing state; "
                "if its state can be thrown away, declare it `sandbox = true` (and its reset) to learn them"
            )
    return hints


def store_answers(store: Store, match_config: MatchConfig | None = None) -> Callable[[MissEntry], bool]:
    """Whether ``store`` answers a miss from the state it was missed in (exact and canonical tiers).

    A state-changing call before it that no recording answers is a diverged step, as in the
    replay. A new resolver is made whenever the store changed: a history is read before the
    resolver would notice new recordings, so a reused one could judge it by stale effects.
    """
    made: dict[int, Resolver] = {}

    def answers(entry: MissEntry) -> bool:
        resolver = made.get(store.generation)
        if resolver is None:
            made.clear()
            resolver = made[store.generation] = Resolver(
                store, config=match_config, index_dir=None, semantic=False
            )
        steps = [
            s["key"] if store.recordings(key=s["key"], limit=1) else DIVERGED + s["key"]
            for s in entry.prefix or []
        ]
        return resolver.resolve(entry.server, entry.method, entry.params, steps).hit

    return answers


def _kept(path: Path) -> list[MissEntry]:
    """The misses kept in a store, a side file, or beside a snapshot bundle (and in its store)."""
    files = [side_file(path / STORE_FILE), path / STORE_FILE] if path.is_dir() else [path]
    found: list[MissEntry] = []
    for file in files:
        if file.is_file():
            with Store(file, readonly=True) as kept:
                found += read_misses(kept)
    if not found:
        click.echo(
            f"replay-sim: no misses kept in {path} (a store or snapshot from before misses were kept?)"
        )
    return found


@cli.command("backfill")
@config_option
@db_option
@match_config_option
@click.option("--limit", type=click.IntRange(min=1), help="Most misses to ask the real servers.")
@click.option(
    "--misses",
    "sources",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Also the misses kept in this store, side file or snapshot bundle (repeatable).",
)
def backfill_command(
    config_file: Path,
    db: Path,
    match_config: MatchConfig | None,
    limit: int | None,
    sources: tuple[Path, ...],
) -> None:
    """Ask the real servers the calls a replay missed, from the state it missed them in; record them.

    Resets each upstream (its reset command) before each session, asks the state-changing calls the
    episode made before the miss, then the missed call, and records the session (origin
    backfill). Misses that need a reset the config does not give are reported, not guessed. Prints
    how many of the misses the store answers now (exact and canonical tiers).
    """
    config = load_config(config_file)
    with Store(db, create=False) as store:
        misses = read_misses(store)
        for source in sources:
            misses += _kept(source)
        read_only = _read_only(store_effects(store, match_config))
        with Progress("backfilling", "miss") as progress:
            report = anyio.run(
                lambda: backfill(
                    store,
                    misses,
                    config,
                    read_only,
                    answers=store_answers(store, match_config),
                    limit=limit,
                    progress=progress,
                )
            )
    for line in report.lines():
        click.echo(line)
