"""Snapshot commands: ``snapshot freeze``, ``verify``, ``inspect`` and ``diff``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from replay_sim.cli import cli, db_option, match_config_option
from replay_sim.cli.progress import Progress
from replay_sim.errors import SnapshotError
from replay_sim.replay.policies.recording import sandbox_side_file
from replay_sim.resolve import snapshot as served
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.store import snapshot

_bundle = click.Path(exists=True, file_okay=False, path_type=Path)


@cli.group("snapshot")
def snapshot_group() -> None:
    """Freeze a store into a verifiable read-only bundle, and check bundles."""


@snapshot_group.command("freeze")
@db_option
@click.option("--out", required=True, type=click.Path(path_type=Path), help="New bundle folder.")
@match_config_option
@click.option(
    "--with-sandbox-answers",
    is_flag=True,
    help="Also take in what sandboxes answered while --db (a bundle's store.db) was served "
    "read-only with --miss sandbox: the side store <bundle>.sandbox.db.",
)
def freeze_command(db: Path, out: Path, match_config: MatchConfig | None, with_sandbox_answers: bool) -> None:
    """Write a read-only snapshot (store, index, manifest, matching config) and print its id."""
    fold = []
    if with_sandbox_answers:
        side = sandbox_side_file(db)
        if not side.is_file():
            raise SnapshotError(
                f"{side}: no sandbox answers kept for {db} (they are kept there while a snapshot is "
                "served with --miss sandbox); give --db the served bundle's store.db, or leave out "
                "--with-sandbox-answers"
            )
        fold.append(side)
    with Progress("indexing the snapshot", "call") as progress:
        frozen = served.freeze(db, out, config=match_config, fold=fold, progress=progress)
    click.echo(frozen.id)


@snapshot_group.command("verify")
@click.argument("path", type=_bundle)
def verify_command(path: Path) -> None:
    """Check every file and the content hash of a bundle against its manifest, and that its index
    reads only files of the bundle."""
    click.echo(f"{served.verify(path).id} ok")


@snapshot_group.command("inspect")
@click.argument("path", type=_bundle)
def inspect_command(path: Path) -> None:
    """Print a bundle's manifest (without verifying it)."""
    click.echo(json.dumps(snapshot.read_manifest(path), indent=2, sort_keys=True))


@snapshot_group.command("diff")
@click.argument("a", type=_bundle)
@click.argument("b", type=_bundle)
def diff_command(a: Path, b: Path) -> None:
    """List calls added, removed or answered differently in B compared with A, and the matching
    settings that differ (exit 1 if any)."""
    result = snapshot.diff(a, b)
    for label, keys in (("+", result.added), ("-", result.removed), ("~", result.changed)):
        for key in keys:
            click.echo(f"{label} {key}")
    for setting in result.settings:
        click.echo(f"* {setting} differs")
    if not result.identical:
        raise SystemExit(1)
