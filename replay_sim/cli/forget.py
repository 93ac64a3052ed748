"""The ``forget`` command: take recorded sessions back by origin, fingerprint, server and time."""

from __future__ import annotations

from pathlib import Path

import click

from replay_sim.cli import cli, db_option
from replay_sim.store import Store
from replay_sim.store.forget import Selection, forget


@cli.command("forget")
@db_option
@click.option("--origin", help="Sessions holding calls of this origin (sandbox, live, explore, …).")
@click.option(
    "--fingerprint", help="Sessions a sandbox with this config fingerprint recorded (8+ characters)."
)
@click.option("--server", help="Sessions of this recorded server.")
@click.option("--since", help="Sessions started at or after this ISO-8601 time (a date alone allowed).")
@click.option("--until", help="Sessions started before this ISO-8601 time.")
@click.option("--yes", is_flag=True, help="Remove them (without it: a dry run showing the counts).")
def forget_command(
    db: Path,
    origin: str | None,
    fingerprint: str | None,
    server: str | None,
    since: str | None,
    until: str | None,
    yes: bool,
) -> None:
    """Take back recorded sessions: every criterion given must hold; a dry run unless --yes.

    Whole sessions are removed, with their source marks and the tool effects learned from them;
    run `replay-sim index build` afterwards (it rebuilds the index), and restart replays serving
    the store. `replay-sim sessions` shows each sandbox session's fingerprint.
    """
    selection = Selection(origin=origin, fingerprint=fingerprint, server=server, since=since, until=until)
    with Store(db, create=False, readonly=not yes) as store:
        done = forget(store, selection, dry_run=not yes)
    click.echo(done.describe())
