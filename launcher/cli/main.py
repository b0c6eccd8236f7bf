"""`mlx-cluster`: the click group and entry point. Each command lives in its own module here."""

from __future__ import annotations

import os
import sys

import click

from launcher.cli.agent import agent_cmd
from launcher.cli.bench import bench_cmd
from launcher.cli.demo import demo
from launcher.cli.discover import discover_cmd
from launcher.cli.import_gguf import import_gguf_cmd
from launcher.cli.launch import launch
from launcher.cli.plan import plan_cmd
from launcher.cli.serve import serve_cmd
from launcher.cli.tiny_model import tiny_model
from launcher.cli.topology import topology as topology_group
from topology.errors import InputError, one_line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-cluster")
def cli() -> None:
    """Check, plan, launch and serve an LLM across Thunderbolt-wired Apple Silicon Macs."""


_COMMANDS = (topology_group, plan_cmd, tiny_model, agent_cmd, discover_cmd, launch, demo)
for command in (*_COMMANDS, bench_cmd, serve_cmd, import_gguf_cmd):
    cli.add_command(command)


EXIT_INTERNAL = 1


def _error(message: str) -> None:
    click.echo(f"mlx-cluster: error: {one_line(message)}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input is one line on stderr and exit 2, never a traceback."""
    try:
        rv = cli.main(args=argv, prog_name="mlx-cluster", standalone_mode=False)
    except InputError as e:
        _error(str(e))
        return InputError.exit_code
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        _error(f"{e.format_message()}{hint}")
        return 2
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort:
        click.echo("mlx-cluster: interrupted", err=True)
        return 130
    except click.ClickException as e:
        _error(e.format_message())
        return e.exit_code
    except Exception as e:  # a bug, not bad input: still one line, with how to see more
        if os.environ.get("MLX_CLUSTER_DEBUG"):
            raise
        where = (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0][:300]
        _error(f"internal error ({where}); run again with MLX_CLUSTER_DEBUG=1 for the traceback")
        return EXIT_INTERNAL
    return int(rv) if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
