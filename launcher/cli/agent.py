"""`mlx-cluster agent`: probe this host once, advertise it on mDNS, serve it until stopped."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from types import FrameType

import click

from launcher.cli.options import DIRECTORY, PORT, Number, Text
from launcher.discovery.agent import (
    DEFAULT_TTL_S,
    Agent,
    default_ssh,
    ipv4_addresses,
    read_host_snapshot,
)
from launcher.discovery.txt import SERVICE_TYPE, valid_name, valid_ssh
from launcher.hosts.probe import probe_local
from topology.errors import InputError
from topology.host_facts import host_facts


def _name(name: str | None) -> str:
    if name is None:
        name = socket.gethostname().split(".")[0]
        if not valid_name(name):
            raise InputError(f"this host's name {name!r} is not usable as a host name; pass --name")
    elif not valid_name(name):
        raise InputError(
            f"--name {name!r}: use letters, digits, '_' or '-' (at most 63, no spaces or dots)"
        )
    return name


def _serve_until_signalled(agent: Agent) -> None:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with agent:
            where = ", ".join(f"{a}:{agent.port}" for a in agent.addresses)
            click.echo(f"mlx-cluster agent: {agent.advertised.name} on {where} ({SERVICE_TYPE})")
            # Poll, never `stop.wait()`: the handler runs on this thread, and `set()` would
            # deadlock on the Event's lock if the signal landed while `wait()` held it.
            while not stop.is_set():
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@click.command("agent")
@click.option(
    "--port",
    type=PORT,
    default=0,
    show_default=True,
    help="HTTP port for the snapshot (0: any free port; it is advertised).",
)
@click.option(
    "--interface",
    type=Text("a network interface, e.g. en0", max_chars=64),
    metavar="IF",
    help="Serve and advertise only on this interface.",
)
@click.option(
    "--name",
    type=Text("a host name", max_chars=255),
    metavar="N",
    help="Host name to advertise (default: this host's name).",
)
@click.option(
    "--ttl",
    type=Number(int, 1, 4500, note="seconds"),
    default=DEFAULT_TTL_S,
    show_default=True,
    help="Seconds others keep this agent after it vanishes without saying goodbye.",
)
@click.option(
    "--ssh",
    "ssh_dest",
    type=Text("an ssh destination: host, user@host or an address", max_chars=255),
    metavar="DEST",
    help="What other hosts should ssh to (default: this host's first address).",
)
@click.option(
    "--snapshot",
    "snapshot_dir",
    type=DIRECTORY,
    metavar="DIR",
    help="Serve this recorded host snapshot instead of probing (demos, tests).",
)
def agent_cmd(
    port: int,
    interface: str | None,
    name: str | None,
    ttl: int,
    ssh_dest: str | None,
    snapshot_dir: Path | None,
) -> int:
    """Advertise this host (mDNS) and serve its snapshot read-only (HTTP)."""
    host = _name(name)
    if ssh_dest is not None and not valid_ssh(ssh_dest):
        raise InputError(f"--ssh {ssh_dest!r}: give host, user@host or an address (no spaces)")
    addresses = ipv4_addresses(interface)
    ssh = ssh_dest or default_ssh(addresses)
    snapshot = read_host_snapshot(snapshot_dir) if snapshot_dir else probe_local()
    facts = host_facts(host, snapshot, {"ssh": ssh, "ips": list(addresses)})
    try:
        agent = Agent(facts, snapshot, addresses, port=port, ttl=ttl, ssh=ssh)
    except OSError as e:
        raise InputError(f"--port {port}: cannot listen on {', '.join(addresses)} ({e})") from None
    _serve_until_signalled(agent)
    return 0
