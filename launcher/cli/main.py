"""`mlx-cluster`: the click group and entry point. Each command lives in its own module here."""

from __future__ import annotations

import importlib
import os
import sys

import click

from cluster import transformers_table
from topology.errors import InputError, one_line

# Each command's module is imported when that command runs (or `--help` lists them): serve's
# HTTP stack, the agent's mDNS and bench cost ~0.3 s of CPU at start that `plan` need not pay.
COMMANDS = {
    "topology": "launcher.cli.topology:topology",
    "plan": "launcher.cli.plan:plan_cmd",
    "tiny-model": "launcher.cli.tiny_model:tiny_model",
    "agent": "launcher.cli.agent:agent_cmd",
    "discover": "launcher.cli.discover:discover_cmd",
    "launch": "launcher.cli.launch:launch",
    "demo": "launcher.cli.demo:demo",
    "bench": "launcher.cli.bench:bench_cmd",
    "serve": "launcher.cli.serve:serve_cmd",
    "import-gguf": "launcher.cli.import_gguf:import_gguf_cmd",
}


class _LazyGroup(click.Group):
    """A group whose commands are loaded by name on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-cluster")
def cli() -> None:
    """Check, plan, launch and serve an LLM across Thunderbolt-wired Apple Silicon Macs."""


EXIT_INTERNAL = 1


def _error(message: str) -> None:
    click.echo(f"mlx-cluster: error: {one_line(message)}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input is one line on stderr and exit 2, never a traceback."""
    transformers_table.install()  # serve, demo, tiny-model: half of transformers' import CPU
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
