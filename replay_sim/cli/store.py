"""Store commands: ``import``, ``export``, ``sessions``, ``stats`` (with the tools' effects)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from replay_sim.cli import cli, db_option
from replay_sim.cli.progress import Progress
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.tooleffects import blockers, keep_effects, store_effects
from replay_sim.store import Origin, Store
from replay_sim.store.interchange import export_jsonl, import_jsonl, merge
from replay_sim.store.sources import session_sources


@cli.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@db_option
def import_command(file: Path, db: Path) -> None:
    """Import a JSONL recording file into the store (all or nothing)."""
    # One commit: a replay serving the store reads the effects kept with the calls it learns from.
    # Every line is checked before the store's write lock is taken.
    with Store(db) as store, Progress("importing", "B") as progress:
        counts = import_jsonl(store, file, progress=progress, within=keep_effects)
    click.echo(
        f"imported {counts['call']} calls ({counts['duplicate']} already present), "
        f"{counts['listing']} listings, {counts['server']} servers into {db}"
    )


@cli.command("merge")
@click.argument(
    "sources", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Destination store."
)
def merge_command(sources: tuple[Path, ...], out: Path) -> None:
    """Merge several stores into one; calls already present are skipped."""
    counts = merge(sources, out)
    click.echo(f"merged {counts['call']} calls ({counts['duplicate']} already present) into {out}")


@cli.command("export")
@db_option
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="File (default: stdout).")
@click.option(  # the former spelling: --out is the one output flag of export, merge and snapshot freeze
    "-o", "--output", "former_out", type=click.Path(dir_okay=False, path_type=Path), hidden=True
)
def export_command(db: Path, out: Path | None, former_out: Path | None) -> None:
    """Export the store as JSONL."""
    if out is not None and former_out is not None and out != former_out:
        raise click.UsageError("--out and its former spelling -o/--output name different files: give one")
    output = out or former_out
    with Store(db, readonly=True) as store:
        if output is None:
            export_jsonl(store, sys.stdout)
        else:
            with output.open("w", encoding="utf-8") as file:
                count = export_jsonl(store, file)
            click.echo(f"wrote {count} lines to {output}", err=True)


@cli.command("sessions")
@db_option
@click.argument("session_id", required=False)
def sessions_command(db: Path, session_id: str | None) -> None:
    """List recording sessions, or show the calls of one."""
    with Store(db, readonly=True) as store:
        if session_id is None:
            sources = session_sources(store)
            for s in store.sessions():
                marked = f"\tfingerprint {sources[s['id']]}" if s["id"] in sources else ""
                click.echo(f"{s['id']}\t{s['server']}\t{s['started_at']}\t{s['calls']} calls{marked}")
            return
        calls = store.recordings(session=session_id)
        if not calls:
            raise click.ClickException(f"no session {session_id!r} in {db}; `replay-sim sessions` lists them")
        for rec in calls:
            outcome = rec.failure or "ok"
            args = json.dumps(rec.arguments, ensure_ascii=False)
            click.echo(
                f"{rec.seq}\t#{rec.id}\t{rec.method}\t{rec.name}\t{args}\t{outcome}\t{rec.latency_ms}ms"
            )


@cli.command("stats")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--match-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Matching config whose read_only overrides the learned effects.",
)
def stats_command(db: Path, as_json: bool, match_config: Path | None) -> None:
    """Recorded calls per server, method, tool and origin, and each tool's effect with its evidence.

    A tool's effect says whether replay counts its calls as state changes: ``none`` (annotated
    read-only, or recorded reads were unchanged by it), ``changes`` (annotated so, or a recorded
    answer changed after it) or ``unknown`` (no evidence: treated as changing state).
    """
    config = MatchConfig() if match_config is None else MatchConfig.load(match_config)
    with Store(db, readonly=True) as store:
        rows = store.stats()
        effects = store_effects(store, config)
        blocking = blockers(store, effects)
    if as_json:
        for row in rows:
            verdict = effects.get(row["server"], {}).get(row["name"])
            if row["method"] == "tools/call" and verdict is not None:
                row["effect"] = verdict.as_dict()
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo("server\tmethod\tname\torigin\tcalls\terrors\tmean_latency_ms")
    for r in rows:
        click.echo(
            "\t".join(
                str(r[k])
                for k in ("server", "method", "name", "origin", "calls", "errors", "mean_latency_ms")
            )
        )
    added: dict[
        str, list[int]
    ] = {}  # what rollouts added: answers of sandbox instances (serve --miss sandbox)
    for r in rows:
        if r["origin"] == Origin.SANDBOX:
            figures = added.setdefault(r["server"], [0, 0])
            figures[0] += r["calls"]
            figures[1] += 1
    if added:
        click.echo(
            "\nadded by rollouts (origin sandbox: answers of sandbox instances, re-played calls included)"
        )
        for server, (calls, names) in sorted(added.items()):
            click.echo(f"{server}\t{calls} calls of {names} tools/resources/prompts")
    called = {(r["server"], r["name"]) for r in rows if r["method"] == "tools/call"}
    shown = [(s, t, v) for s, tools in effects.items() for t, v in tools.items() if (s, t) in called]
    if shown:
        click.echo("\nserver\ttool\teffect")
        for server, tool, verdict in shown:
            click.echo(f"{server}\t{tool}\t{verdict.describe()}")
            for kind, own in verdict.kinds:  # a tool learned per kind of call: each kind's own
                click.echo(f"{server}\t{tool} [{kind}]\t{own.describe()}")
    if blocking:
        click.echo(
            "\ntools of unknown effect blocking the most recorded answers (each answer recorded after "
            "one of their calls is served only to an episode that made the same calls): settle each "
            "by declaring it `read_only = true` (or false) in the matching config, or by "
            "`replay-sim explore` with its server declared `sandbox = true`"
        )
        click.echo("server\ttool\tanswers_blocked")
        for server, tool, count in blocking[:10]:
            click.echo(f"{server}\t{tool}\t{count}")
