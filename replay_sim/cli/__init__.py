"""The ``replay-sim`` command line: thin commands, each calling one library function.

Commands live in one module per area (``store``, ``forget``, ``record``, ``coverage``, ``index``,
``serve``, ``snapshot``); each registers itself on :data:`cli`, and is imported only when one of its commands
runs (:data:`COMMANDS`): ``serve --stdio`` does not wait for the recorder's imports. Every
command that touches a store takes ``--db``.
Errors end the process with status 1 and one line naming the problem. The entry point applies
replay-sim's process-wide settings (:func:`~replay_sim.resolve.runtime.configure_runtime`) before
any command runs; importing the library applies none.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from replay_sim.errors import ConfigError, ReplaySimError
from replay_sim.resolve.runtime import configure_runtime
from replay_sim.store import DEFAULT_DB

__all__ = ["COMMANDS", "Seconds", "cli", "db_option", "main", "match_config_option", "naming_port_option"]

COMMANDS = {
    "import": "store",
    "merge": "store",
    "export": "store",
    "sessions": "store",
    "stats": "store",
    "forget": "forget",
    "record": "record",
    "explore": "coverage",
    "backfill": "coverage",
    "index": "index",
    "eval": "index",
    "serve": "serve",
    "demo": "demo",
    "snapshot": "snapshot",
}
"""Each command, and the module of :mod:`replay_sim.cli` that registers it."""


class Seconds(click.FloatRange):
    """A number of seconds within a range, and finite: ``FloatRange`` lets ``nan`` and ``inf`` through."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number is not None and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


@contextlib.contextmanager
def naming_port_option() -> Iterator[None]:
    """Turn "cannot listen: address already in use" into an error naming ``--port`` (and ``--port 0``)."""
    try:
        yield
    except ConfigError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            raise ConfigError(f"{exc}: choose another with --port PORT (--port 0: a free one)") from cause
        raise


db_option = click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_DB,
    show_default=True,
    help="Recording store (SQLite).",
)


match_config_option = click.option(
    "--match-config",
    "match_config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    callback=lambda _ctx, _param, path: None if path is None else _match_config(path),
    help="Matching config (TOML: thresholds, per-tool free-text/identifier overrides).",
)


def _match_config(path: Path) -> Any:
    from replay_sim.resolve.calibration import MatchConfig  # numpy: only when one is given

    return MatchConfig.load(path)


class _Commands(click.Group):
    """A group whose commands' modules are imported when one of them is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is not None and cmd_name not in self.commands:
            importlib.import_module(f"replay_sim.cli.{module}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="replay-sim")
def cli() -> None:
    """Record real MCP servers, index the recordings, replay them offline."""


def main() -> None:
    """Console-script entry point."""
    configure_runtime()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ReplaySimError as exc:
        click.echo(f"replay-sim: error: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:  # a path given on the command line (e.g. export -o) the library never saw
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"replay-sim: error: {where}{exc.strerror or exc}", err=True)
        sys.exit(1)
