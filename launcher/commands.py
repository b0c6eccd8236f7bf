"""The list of subcommands: one module each, registered here so cli.py stays tiny."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    from launcher import cmd_topology

    cli.add_command(cmd_topology.topology)
