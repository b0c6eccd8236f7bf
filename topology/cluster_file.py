"""The cluster file (hostfiles/*.yaml): parsed and validated from its text, no I/O.

Every value that may reach a command line (ssh destination, python path, address, env) is
checked against a strict pattern so no shell metacharacter ever gets through.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from topology.errors import InputError

BACKENDS = ("auto", "jaccl", "jaccl-ring", "ring")
STRATEGIES = ("auto", "tensor", "pipeline")

# user@host, host, alias, host:port is not ssh syntax (use ssh_options -p); no shell specials.
_SSH_RE = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PATH_RE = re.compile(r"^[A-Za-z0-9_./~+][A-Za-z0-9_./~+@=-]*$")  # no leading "-": not an option
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_./:,+@=-]*$")
_SSH_OPT_RE = re.compile(r"^[A-Za-z0-9_./:,+@=~-]+$")

_HOST_KEYS = {"name", "ssh", "ips", "python", "wired_limit_gb", "bandwidth_gbs"}
_TOP_KEYS = {"hosts", "backend", "strategy", "env", "ssh_options", "python"}


@dataclass(frozen=True)
class HostSpec:
    name: str
    ssh: str
    ips: tuple[str, ...] = ()
    python: str | None = None
    wired_limit_gb: float | None = None
    bandwidth_gbs: float | None = None


@dataclass(frozen=True)
class ClusterSpec:
    hosts: tuple[HostSpec, ...]
    backend: str = "auto"
    strategy: str = "auto"
    env: tuple[str, ...] = ()
    ssh_options: tuple[str, ...] = ()
    python: str | None = None
    source: str = "<cluster>"

    def python_for(self, host: HostSpec) -> str:
        return host.python or self.python or "python3"


def _fail(source: str, key: str, what: str) -> InputError:
    return InputError(f"{source}: {key}: {what}")


def _str(source: str, key: str, value: Any, pattern: re.Pattern[str], kind: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(source, key, f"must be a non-empty string, got {value!r}")
    if not pattern.match(value):
        raise _fail(source, key, f"{value!r} is not a valid {kind} (no spaces or shell characters)")
    return value


def _ips(source: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(source, key, "must be a list of IP addresses, e.g. [10.0.0.11]")
    for v in value:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise _fail(source, key, f"{v!r} is not an IP address") from None
    return tuple(value)


def _number(source: str, key: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise _fail(source, key, f"must be a positive number, got {value!r}")
    return float(value)


def _strings(
    source: str, key: str, value: Any, pattern: re.Pattern[str], kind: str
) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(source, key, f"must be a list of strings, got {value!r}")
    return tuple(_str(source, f"{key}[{i}]", v, pattern, kind) for i, v in enumerate(value))


def _default_name(ssh: str) -> str:
    host = ssh.split("@")[-1]
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host.split(".")[0] or host


def _host(source: str, i: int, raw: Any) -> HostSpec:
    where = f"hosts[{i}]"
    if isinstance(raw, str):  # a bare "studio-a.local" entry is allowed
        raw = {"name": _default_name(raw), "ssh": raw}
    if not isinstance(raw, dict):
        raise _fail(source, where, "must be a mapping with at least `name` and `ssh`")
    unknown = sorted(map(str, set(raw) - _HOST_KEYS))
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}", f"unknown key (allowed: {sorted(_HOST_KEYS)})")
    if "ssh" not in raw and "name" not in raw:
        raise _fail(source, where, "needs `ssh` (the ssh destination) and `name`")
    ssh = _str(source, f"{where}.ssh", raw.get("ssh", raw.get("name")), _SSH_RE, "ssh destination")
    name = _str(source, f"{where}.name", raw.get("name", _default_name(ssh)), _NAME_RE, "host name")
    return HostSpec(
        name=name,
        ssh=ssh,
        ips=_ips(source, f"{where}.ips", raw["ips"]) if "ips" in raw else (),
        python=_str(source, f"{where}.python", raw["python"], _PATH_RE, "path")
        if "python" in raw
        else None,
        wired_limit_gb=_number(source, f"{where}.wired_limit_gb", raw["wired_limit_gb"])
        if "wired_limit_gb" in raw
        else None,
        bandwidth_gbs=_number(source, f"{where}.bandwidth_gbs", raw["bandwidth_gbs"])
        if "bandwidth_gbs" in raw
        else None,
    )


def parse_cluster(text: str, source: str = "<cluster>") -> ClusterSpec:
    """Parse a cluster file's text; raise InputError naming the file and key on anything wrong."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        raise _fail(source, where, "is not valid YAML; check indentation and quoting") from None
    if not isinstance(raw, dict):
        raise InputError(f"{source}: must be a YAML mapping with a `hosts:` list")
    unknown = sorted(map(str, set(raw) - _TOP_KEYS))
    if unknown:
        raise _fail(source, unknown[0], f"unknown key (allowed: {sorted(_TOP_KEYS)})")
    hosts_raw = raw.get("hosts")
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise _fail(source, "hosts", "must be a non-empty list of hosts")
    hosts = tuple(_host(source, i, h) for i, h in enumerate(hosts_raw))
    seen: set[str] = set()
    for i, h in enumerate(hosts):
        if h.name in seen:
            raise _fail(source, f"hosts[{i}].name", f"duplicate host name {h.name!r}")
        seen.add(h.name)
    backend = raw.get("backend", "auto")
    if backend not in BACKENDS:
        raise _fail(source, "backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    strategy = raw.get("strategy", "auto")
    if strategy not in STRATEGIES:
        raise _fail(source, "strategy", f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return ClusterSpec(
        hosts=hosts,
        backend=backend,
        strategy=strategy,
        env=_strings(source, "env", raw.get("env", []), _ENV_RE, "NAME=value setting"),
        ssh_options=_strings(
            source, "ssh_options", raw.get("ssh_options", []), _SSH_OPT_RE, "ssh option"
        ),
        python=_str(source, "python", raw["python"], _PATH_RE, "path") if "python" in raw else None,
        source=source,
    )


def hosts_from_list(hosts: str, source: str = "--hosts") -> ClusterSpec:
    """`--hosts a,b,user@c`: a cluster of ssh destinations with default settings."""
    items = [h.strip() for h in hosts.split(",")]
    if not items or any(not h for h in items):
        raise InputError(f"{source}: give comma-separated ssh destinations, e.g. --hosts a,b")
    return parse_cluster(yaml.safe_dump({"hosts": items}), source)
