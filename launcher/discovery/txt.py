"""The agent's mDNS advertisement: service type, and its facts as TXT record keys.

Both ends live here so the agent (encode) and `discover` (decode) cannot drift apart. Decoding
treats every value as untrusted: anything on the network can answer mDNS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topology.facts import HostFacts, RdmaState
from topology.untrusted import show

SERVICE_TYPE = "_mlx-cluster._tcp.local."
PROTOCOL = "1"  # bump when keys change meaning; discover ignores agents speaking another one

# DNS-SD: one TXT string (key=value) is at most 255 bytes; keep the whole record small.
_TXT_STRING_MAX = 255
_NAME_MAX = 63
# A cluster file host name, minus '.': the name is one DNS label of the service instance.
# Matched whole (fullmatch): `$` would let a trailing newline through.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_SSH_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9._-]*")
_UUID_RE = re.compile(r"[0-9A-Fa-f-]{1,64}")
_TEXT_RE = re.compile(r"[\x20-\x7e]{1,100}")  # chip / macOS: printable, short
_MEM_RE = re.compile(r"[0-9]{1,16}")  # bytes: up to 9 PB
_RDMA_STATES: tuple[RdmaState, ...] = ("enabled", "disabled", "unknown")


@dataclass(frozen=True)
class AgentFacts:
    """What an agent says about its host in mDNS, before anyone fetches its snapshot."""

    name: str
    ssh: str  # what other hosts use to ssh here (an address unless the agent was told a name)
    version: str
    chip: str | None = None
    memory_bytes: int | None = None
    macos: str | None = None
    rdma: RdmaState = "unknown"
    is_mac: bool = False
    tb_uuids: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "chip": self.chip,
            "memory_bytes": self.memory_bytes,
            "macos": self.macos,
            "rdma": self.rdma,
            "is_mac": self.is_mac,
            "tb_uuids": list(self.tb_uuids),
        }


def valid_name(name: str) -> bool:
    return len(name) <= _NAME_MAX and bool(_NAME_RE.fullmatch(name))


def valid_ssh(ssh: str) -> bool:
    # No leading '-': ssh would read the destination as an option.
    return len(ssh) <= _NAME_MAX * 2 and not ssh.startswith("-") and bool(_SSH_RE.fullmatch(ssh))


def agent_facts(facts: HostFacts, ssh: str, version: str) -> AgentFacts:
    return AgentFacts(
        name=facts.name,
        ssh=ssh,
        version=version,
        chip=facts.chip,
        memory_bytes=facts.memory_bytes,
        macos=facts.macos,
        rdma=facts.rdma,
        is_mac=facts.is_mac,
        tb_uuids=tuple(p.bus_uuid for p in facts.tb_ports),
    )


def _uuid_chunks(uuids: tuple[str, ...]) -> dict[str, str]:
    """Comma-separated uuids under keys tb, tb1, tb2, ... each string within 255 bytes."""
    out: dict[str, str] = {}
    current: list[str] = []
    for u in uuids:
        key = "tb" if not out else f"tb{len(out)}"
        if current and len(f"{key}={','.join([*current, u])}") > _TXT_STRING_MAX:
            out[key] = ",".join(current)
            current = []
        current.append(u)
    if current:
        out["tb" if not out else f"tb{len(out)}"] = ",".join(current)
    return out


def encode_txt(facts: AgentFacts) -> dict[str, str]:
    """TXT record properties; values that are unknown are left out rather than sent empty."""
    txt = {"proto": PROTOCOL, "name": facts.name, "ssh": facts.ssh, "ver": facts.version}
    if facts.chip:
        txt["chip"] = facts.chip[:100]
    if facts.memory_bytes is not None:
        txt["mem"] = str(facts.memory_bytes)
    if facts.macos:
        txt["macos"] = facts.macos[:100]
    txt["rdma"] = facts.rdma
    txt["mac"] = "1" if facts.is_mac else "0"
    txt.update(_uuid_chunks(tuple(u for u in facts.tb_uuids if _UUID_RE.fullmatch(u))))
    return txt


class TxtError(ValueError):
    """An advertisement that is not a usable mlx-cluster agent (message says why)."""


def _text(props: Mapping[str, str | None], key: str) -> str | None:
    value = props.get(key)
    if value is None or not _TEXT_RE.fullmatch(value):
        return None
    return value


def decode_txt(props: Mapping[str, str | None]) -> AgentFacts:
    """AgentFacts from decoded TXT properties; TxtError when name/ssh/protocol are unusable."""
    proto = props.get("proto")
    if proto != PROTOCOL:
        raise TxtError(f"speaks agent protocol {show(proto, 20)}, this one speaks {PROTOCOL!r}")
    name = props.get("name") or ""
    if not valid_name(name):
        raise TxtError(f"advertises an unusable host name {show(name, 70)}")
    ssh = props.get("ssh") or ""
    if not valid_ssh(ssh):
        raise TxtError(f"{name}: advertises an unusable ssh destination {show(ssh, 70)}")
    mem = props.get("mem")
    rdma = props.get("rdma")
    uuids: list[str] = []
    for i in range(16):
        chunk = props.get("tb" if i == 0 else f"tb{i}")
        if chunk is None:
            break
        uuids.extend(u for u in chunk.split(",") if _UUID_RE.fullmatch(u))
    return AgentFacts(
        name=name,
        ssh=ssh,
        version=_text(props, "ver") or "unknown",
        chip=_text(props, "chip"),
        memory_bytes=int(mem) if mem is not None and _MEM_RE.fullmatch(mem) else None,
        macos=_text(props, "macos"),
        rdma=next((s for s in _RDMA_STATES if s == rdma), "unknown"),
        is_mac=props.get("mac") == "1",
        tb_uuids=tuple(uuids),
    )


def is_ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False
