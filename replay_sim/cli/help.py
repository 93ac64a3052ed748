"""``--help`` with options grouped by concern: click lists every option in one block.

A command built with ``cls=GroupedCommand, groups={TITLE: (PARAM_NAME, ...)}`` lists each group under
its title, in the mapping's order, options in declaration order; options no group names come last
under "Options" (``--help`` among them). Click has no option groups of its own, and the well-kept add-on
(``click-option-group``) changes how options are declared and parsed; this only changes how
``--help`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

__all__ = ["GroupedCommand"]


class GroupedCommand(click.Command):
    """A :class:`click.Command` whose ``--help`` lists its options under group titles.

    Args:
        groups: Each title, and the parameter names (``param.name``) listed under it.
    """

    def __init__(self, *args: Any, groups: Mapping[str, Sequence[str]] = {}, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups = {title: tuple(names) for title, names in groups.items()}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            row = param.get_help_record(ctx)
            if row is not None and param.name is not None:
                rows[param.name] = row
        for title, names in self.groups.items():
            listed = [rows.pop(name) for name in names if name in rows]
            if listed:
                with formatter.section(title):
                    formatter.write_dl(listed)
        if rows:
            with formatter.section("Options"):
                formatter.write_dl(list(rows.values()))
