"""The list of subcommands: one module each, registered here so cli.py stays tiny."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    from launcher import cmd_topology

    cli.add_command(cmd_topology.topology)
    from launcher.cmd_plan import plan_cmd

    cli.add_command(plan_cmd)
    from launcher.cmd_tiny_model import tiny_model

    cli.add_command(tiny_model)
    from launcher.cmd_agent import agent_cmd

    cli.add_command(agent_cmd)
    from launcher.cmd_discover import discover_cmd

    cli.add_command(discover_cmd)
    from launcher.cmd_launch import launch

    cli.add_command(launch)
    from launcher.cmd_demo import demo

    cli.add_command(demo)
    from launcher.cmd_bench import bench_cmd

    cli.add_command(bench_cmd)
    from launcher.cmd_serve import serve_cmd

    cli.add_command(serve_cmd)
