"""The cluster file (hostfiles/*.yaml): parsed and validated from its text, no I/O.

Every value that may reach a command line (ssh destination, python path, address, env) is
checked against a strict pattern so no shell metacharacter ever gets through.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from topology.errors import InputError
from topology.ssh_options import check_ssh_options
from topology.untrusted import load_yaml, number, show, text

BACKENDS = ("auto", "jaccl", "jaccl-ring", "ring")
STRATEGIES = ("auto", "tensor", "pipeline")

# user@host, host, alias, host:port is not ssh syntax (use ssh_options -p); no shell specials,
# no leading "-" anywhere ssh could read it as an option. Always matched whole (fullmatch).
_SSH_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_PATH_RE = re.compile(r"[A-Za-z0-9_./~+][A-Za-z0-9_./~+@=-]*")  # no leading "-": not an option
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_./:,+@=-]*")
_SSH_OPT_RE = re.compile(r"[A-Za-z0-9_./:,+@=~%-]+")
_IP_CHARS = re.compile(r"[0-9A-Fa-f.:]{2,45}")  # no IPv6 "%scope": it could carry anything

_HOST_KEYS = {"name", "ssh", "ips", "python", "wired_limit_gb", "bandwidth_gbs"}
_TOP_KEYS = {"hosts", "backend", "strategy", "env", "ssh_options", "python"}

MAX_FILE_BYTES = 1 << 20  # a cluster file of 64 hosts is a few KB
MAX_HOSTS = 64  # a Thunderbolt mesh stops at 8 Macs; a TCP ring of 64 is already generous
NAME_MAX = 64  # a host name is a directory name in snapshots and a label in reports
_LIST_MAX = 64  # ips, env and ssh_options entries
# GPU-usable memory (GB) and memory bandwidth (GB/s) a host may claim: beyond any machine
# made today by orders of magnitude, yet small enough that no figure derived from them overflows.
WIRED_LIMIT_GB = (1.0, 16384.0)
BANDWIDTH_GBS = (1.0, 100_000.0)


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
    return text(value, source, key, pattern, kind, max_len=NAME_MAX if kind == "host name" else 255)


def _list(source: str, key: str, value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(source, key, f"must be a list of {what}, got {show(value)}")
    if len(value) > _LIST_MAX:
        raise _fail(source, key, f"more than {_LIST_MAX} entries")
    return value


def _ips(source: str, key: str, value: Any) -> tuple[str, ...]:
    items = _list(source, key, value, "IP addresses, e.g. [10.0.0.11]")
    for i, v in enumerate(items):
        if not isinstance(v, str) or not _IP_CHARS.fullmatch(v):
            raise _fail(source, f"{key}[{i}]", f"{show(v)} is not an IP address")
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise _fail(source, f"{key}[{i}]", f"{show(v)} is not an IP address") from None
    return tuple(items)


def _strings(
    source: str, key: str, value: Any, pattern: re.Pattern[str], kind: str
) -> tuple[str, ...]:
    items = _list(source, key, value, "strings")
    return tuple(_str(source, f"{key}[{i}]", v, pattern, kind) for i, v in enumerate(items))


# Settings that make every rank load code of someone's choosing: a cluster file is data.
_CODE_ENV = re.compile(r"(?:LD_|DYLD_)\w*|PYTHON(?:PATH|HOME|STARTUP|INSPECT)|BASH_ENV|ENV")


def _env(source: str, value: Any) -> tuple[str, ...]:
    env = _strings(source, "env", value, _ENV_RE, "NAME=value setting")
    for i, item in enumerate(env):
        name = item.partition("=")[0]
        if _CODE_ENV.fullmatch(name):
            raise _fail(
                source, f"env[{i}]", f"{name} makes every rank load other code; a cluster file "
                "may not set it (set it on the host itself if you mean it)",
            )  # fmt: skip
    return env


def _default_name(ssh: str) -> str:
    host = ssh.split("@")[-1]
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host.split(".")[0] or host


def parse_host(source: str, where: str, raw: Any) -> HostSpec:
    """One host entry (a mapping, or a bare ssh destination); `where` prefixes its keys."""
    key = f"{where}." if where else ""
    if isinstance(raw, str):  # a bare "studio-a.local" entry is allowed
        _str(source, f"{key}ssh", raw, _SSH_RE, "ssh destination")
        raw = {"name": _default_name(raw), "ssh": raw}
    if not isinstance(raw, dict):
        raise InputError(
            f"{source}: {where or 'host'}: must be a mapping with at least `name` and `ssh`"
        )
    unknown = sorted(show(k) if not isinstance(k, str) else k for k in set(raw) - _HOST_KEYS)
    if unknown:
        raise _fail(source, f"{key}{unknown[0]}", f"unknown key (allowed: {sorted(_HOST_KEYS)})")
    if "ssh" not in raw and "name" not in raw:
        raise _fail(source, where or "host", "needs `ssh` (the ssh destination) and `name`")
    ssh = _str(source, f"{key}ssh", raw.get("ssh", raw.get("name")), _SSH_RE, "ssh destination")
    name = _str(source, f"{key}name", raw.get("name", _default_name(ssh)), NAME_RE, "host name")
    wired, bandwidth = raw.get("wired_limit_gb"), raw.get("bandwidth_gbs")
    return HostSpec(
        name=name,
        ssh=ssh,
        ips=_ips(source, f"{key}ips", raw["ips"]) if "ips" in raw else (),
        python=_str(source, f"{key}python", raw["python"], _PATH_RE, "path")
        if "python" in raw
        else None,
        wired_limit_gb=None
        if wired is None
        else number(wired, source, f"{key}wired_limit_gb", *WIRED_LIMIT_GB),
        bandwidth_gbs=None
        if bandwidth is None
        else number(bandwidth, source, f"{key}bandwidth_gbs", *BANDWIDTH_GBS),
    )


def _choice(source: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(source, key, f"must be one of {', '.join(choices)}, got {show(value)}")
    return str(value)


def cluster_from_mapping(raw: Any, source: str) -> ClusterSpec:
    """A decoded cluster file (or one built from other inputs) checked key by key."""
    if not isinstance(raw, dict):
        raise InputError(f"{source}: must be a YAML mapping with a `hosts:` list")
    unknown = sorted(show(k) if not isinstance(k, str) else k for k in set(raw) - _TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0], f"unknown key (allowed: {sorted(_TOP_KEYS)})")
    hosts_raw = raw.get("hosts")
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise _fail(source, "hosts", "must be a non-empty list of hosts")
    if len(hosts_raw) > MAX_HOSTS:
        raise _fail(source, "hosts", f"{len(hosts_raw)} hosts; at most {MAX_HOSTS} are supported")
    hosts = tuple(parse_host(source, f"hosts[{i}]", h) for i, h in enumerate(hosts_raw))
    seen: set[str] = set()
    for i, h in enumerate(hosts):
        if h.name in seen:
            raise _fail(source, f"hosts[{i}].name", f"duplicate host name {h.name!r}")
        seen.add(h.name)
    options = _list(source, "ssh_options", raw.get("ssh_options", []), "strings")
    for i, o in enumerate(options):
        if not isinstance(o, str) or not o or len(o) > 1024:
            raise _fail(source, f"ssh_options[{i}]", f"must be a non-empty string, got {show(o)}")
    # The allow-list first: its refusal names the option (ProxyCommand, ...) and says why.
    check_ssh_options(options, source)
    return ClusterSpec(
        hosts=hosts,
        backend=_choice(source, "backend", raw.get("backend", "auto"), BACKENDS),
        strategy=_choice(source, "strategy", raw.get("strategy", "auto"), STRATEGIES),
        env=_env(source, raw.get("env", [])),
        ssh_options=_strings(source, "ssh_options", options, _SSH_OPT_RE, "ssh option"),
        python=_str(source, "python", raw["python"], _PATH_RE, "path") if "python" in raw else None,
        source=source,
    )


def parse_cluster(data: str | bytes, source: str = "<cluster>") -> ClusterSpec:
    """Parse a cluster file's text; raise InputError naming the file and key on anything wrong."""
    return cluster_from_mapping(load_yaml(data, source, max_bytes=MAX_FILE_BYTES), source)


def hosts_from_list(hosts: str, source: str = "--hosts") -> ClusterSpec:
    """`--hosts a,b,user@c`: a cluster of ssh destinations with default settings."""
    items = [h.strip() for h in hosts.split(",")]
    if not items or any(not h for h in items):
        raise InputError(f"{source}: give comma-separated ssh destinations, e.g. --hosts a,b")
    return cluster_from_mapping({"hosts": items}, source)
