"""Edit recorded `ifconfig` output the way a Mac's own would change: what `topology setup`'s
commands do to a host, written back into its snapshot.

Plain text in, text out, no project imports: the fake Mac commands of tests/hosts (run on an
emulated host by any python) import this too.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_IFACE_LINE = re.compile(r"^([A-Za-z0-9_.-]+): flags=")


def _blocks(text: str) -> list[list[str]]:
    """The output cut into one list of lines per interface (a preamble, if any, first)."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _IFACE_LINE.match(line):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _name(block: list[str]) -> str | None:
    m = _IFACE_LINE.match(block[0]) if block else None
    return m.group(1) if m else None


def set_inet(ifconfig: str, iface: str, ip: str, prefix: int) -> str:
    """`iface` with this one IPv4 address instead of any it had (as networksetup -setmanual)."""
    net = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    inet = f"\tinet {ip} netmask 0x{int(net.netmask):08x} broadcast {net.broadcast_address}\n"
    out = []
    found = False
    for block in _blocks(ifconfig):
        if _name(block) == iface:
            found = True
            kept = [line for line in block if not line.lstrip().startswith("inet ")]
            at = next((i + 1 for i, line in enumerate(kept) if "ether " in line), 1)
            block = [*kept[:at], inet, *kept[at:]]
        out.extend(block)
    if not found:
        raise ValueError(f"no interface {iface} in this ifconfig output")
    return "".join(out)


def drop_bridge_member(ifconfig: str, iface: str) -> str:
    """bridge0 without `iface` among its members (as `ifconfig bridge0 deletem iface`)."""
    out = []
    for block in _blocks(ifconfig):
        if _name(block) == "bridge0":
            kept: list[str] = []
            skip_detail = False
            for line in block:
                words = line.split()
                if words[:2] == ["member:", iface]:
                    skip_detail = True
                    continue
                if skip_detail and words[:1] == ["ifmaxaddr"]:
                    continue
                skip_detail = False
                kept.append(line)
            block = kept
        out.extend(block)
    return "".join(out)


def service_iface(networksetup: str, service: str) -> str:
    """The interface of a hardware port, from `networksetup -listallhardwareports` output."""
    port = None
    for line in networksetup.splitlines():
        if line.startswith("Hardware Port:"):
            port = line.partition(":")[2].strip()
        elif line.startswith("Device:") and port == service:
            return line.partition(":")[2].strip()
    raise ValueError(f"no hardware port {service!r}")


def run_command(files: dict[str, str | None], argv: list[str]) -> None:
    """What one of setup's commands (without sudo) does to a host's recorded files."""
    ifconfig = files["ifconfig.txt"] or ""
    if argv[:3] == ["ifconfig", "bridge0", "deletem"]:
        files["ifconfig.txt"] = drop_bridge_member(ifconfig, argv[3])
    elif argv[:2] == ["networksetup", "-setmanual"]:
        iface = service_iface(files["networksetup_listallhardwareports.txt"] or "", argv[2])
        prefix = ipaddress.IPv4Network(f"0.0.0.0/{argv[4]}").prefixlen
        files["ifconfig.txt"] = set_inet(ifconfig, iface, argv[3], prefix)
    else:
        raise ValueError(f"not a setup command: {argv}")


def apply_setup(files_by_host: Mapping[str, dict[str, str | None]], setup: Any) -> None:
    """Run every command of a `topology setup --json` object on the recorded files, in place."""
    for host in setup["hosts"]:
        for line in host["commands"]:
            words = shlex.split(line)
            assert words[0] == "sudo", line
            run_command(files_by_host[host["name"]], words[1:])


def apply_setup_to_dir(snapshot: Path, setup: Any) -> None:
    """The same on a snapshot directory: each host's ifconfig.txt rewritten."""
    for host in setup["hosts"]:
        d = snapshot / host["name"]
        names = ("ifconfig.txt", "networksetup_listallhardwareports.txt")
        files: dict[str, str | None] = {
            f: (d / f).read_text() if (d / f).is_file() else None for f in names
        }
        for line in host["commands"]:
            words = shlex.split(line)
            run_command(files, words[1:])
        if files["ifconfig.txt"] is not None:
            (d / "ifconfig.txt").write_text(files["ifconfig.txt"])
