"""`mlx-cluster`: the click group and entry point. Each command lives in its own module here."""

from __future__ import annotations

import sys

import click

from launcher.cli.agent import agent_cmd
from launcher.cli.bench import bench_cmd
from launcher.cli.demo import demo
from launcher.cli.discover import discover_cmd
from launcher.cli.launch import launch
from launcher.cli.plan import plan_cmd
from launcher.cli.serve import serve_cmd
from launcher.cli.tiny_model import tiny_model
from launcher.cli.topology import topology as topology_group
from topology.errors import InputError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-cluster")
def cli() -> None:
    """Check, plan, launch and serve an LLM across Thunderbolt-wired Apple Silicon Macs."""


_COMMANDS = (topology_group, plan_cmd, tiny_model, agent_cmd, discover_cmd, launch, demo)
for command in (*_COMMANDS, bench_cmd, serve_cmd):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input is one line on stderr and exit 2, never a traceback."""
    try:
        rv = cli.main(args=argv, prog_name="mlx-cluster", standalone_mode=False)
    except InputError as e:
        click.echo(f"mlx-cluster: error: {e}", err=True)
        return InputError.exit_code
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        click.echo(f"mlx-cluster: error: {e.format_message()}{hint}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort:
        click.echo("mlx-cluster: interrupted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"mlx-cluster: error: {e.format_message()}", err=True)
        return e.exit_code
    return int(rv) if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
