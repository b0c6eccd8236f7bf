"""Find `mlx-cluster agent`s on the local network (mDNS) and fetch their snapshots (HTTP).

Liveness: zeroconf keeps a PTR record at least 1125 s whatever its TTL, so a crashed agent would
linger. An agent therefore counts as present only while its SRV/TXT/A records (which carry the
agent's own TTL) are fresh: they are re-asked for when they expire, and an agent that does not
answer is gone. A stopped agent sends goodbye packets and is gone at once.
"""

from __future__ import annotations

import http.client
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zeroconf import (
    InterfaceChoice,
    IPVersion,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from launcher.discovery.http import SNAPSHOT_PATH
from launcher.discovery.txt import SERVICE_TYPE, AgentFacts, TxtError, decode_txt, is_ipv4
from launcher.hosts.snapshots import snapshot_file_name
from topology.untrusted import clean, parse_json

_RESOLVE_TIMEOUT_MS = 1500  # one agent's SRV/TXT/A answer; LAN answers take well under 200 ms
_REFRESH_EVERY_S = 0.5  # how often known agents are re-checked (a cache hit costs nothing)
_SNAPSHOT_MAX_BYTES = 16 * 1024 * 1024  # a real snapshot is ~100 KB
_SNAPSHOT_MAX_DEPTH = 4


@dataclass(frozen=True)
class FoundAgent:
    instance: str  # the mDNS service instance name
    addresses: tuple[str, ...]  # IPv4, as advertised
    port: int
    facts: AgentFacts

    @property
    def name(self) -> str:
        return self.facts.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "addresses": list(self.addresses),
            "port": self.port,
            "ssh": self.facts.ssh,
            "version": self.facts.version,
            "facts": self.facts.to_json(),
        }


@dataclass(frozen=True)
class GoneAgent:
    """An agent seen during the browse that left before it ended (wall-clock times)."""

    name: str
    seen_at: float
    gone_at: float
    how: str  # "goodbye" (it unregistered), "expired" (no answer once its TTL ran out), "unusable"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seen_at": self.seen_at,
            "gone_at": self.gone_at,
            "how": self.how,
        }


@dataclass(frozen=True)
class Discovery:
    agents: tuple[FoundAgent, ...]  # present when the browse ended, sorted by name
    gone: tuple[GoneAgent, ...] = ()
    ignored: tuple[str, ...] = ()  # advertisements that are not usable agents, and why

    def to_json(self) -> dict[str, Any]:
        return {
            "agents": [a.to_json() for a in self.agents],
            "gone": [g.to_json() for g in self.gone],
        }


class _NoAnswer(Exception):
    """The agent's records ran out and it did not answer when asked again."""


def _resolve(zc: Zeroconf, instance: str) -> FoundAgent:
    """The agent behind a service instance (fresh cache or a new answer)."""
    info = ServiceInfo(SERVICE_TYPE, instance)
    if not info.request(zc, _RESOLVE_TIMEOUT_MS) or info.port is None:
        raise _NoAnswer(instance)
    facts = decode_txt(info.decoded_properties)
    addresses = tuple(a for a in info.parsed_addresses(IPVersion.V4Only) if is_ipv4(a))
    if not addresses:
        raise TxtError(f"{facts.name}: advertises no IPv4 address")
    return FoundAgent(instance, addresses, info.port, facts)


class _Browse:
    """State of one browse; zeroconf calls `on_change` from its own thread, so only enqueue."""

    def __init__(self, zc: Zeroconf) -> None:
        self.zc = zc
        self.changes: queue.Queue[tuple[str, ServiceStateChange]] = queue.Queue()
        self.present: dict[str, FoundAgent] = {}
        self.seen_at: dict[str, float] = {}
        self.gone: dict[str, GoneAgent] = {}
        self.ignored: dict[str, str] = {}
        # instances whose goodbye came in, as zeroconf's thread saw it: a refresh that asks a
        # stopping agent in vain is its goodbye, not an expiry
        self.said_goodbye: set[str] = set()

    def on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if state_change is ServiceStateChange.Removed:
            self.said_goodbye.add(name)
        else:
            self.said_goodbye.discard(name)
        self.changes.put((name, state_change))

    def _leave(self, instance: str, how: str) -> None:
        agent = self.present.pop(instance, None)
        if agent is not None:
            self.gone[instance] = GoneAgent(agent.name, self.seen_at[instance], time.time(), how)

    def _check(self, instance: str) -> None:
        try:
            agent = _resolve(self.zc, instance)
        except (_NoAnswer, TxtError) as e:
            if isinstance(e, TxtError):
                how = "unusable"
            else:
                how = "goodbye" if instance in self.said_goodbye else "expired"
            self._leave(instance, how)
            if isinstance(e, TxtError):
                self.ignored[instance] = str(e)
            return
        self.ignored.pop(instance, None)
        if instance not in self.present:
            self.seen_at[instance] = time.time()
            self.gone.pop(instance, None)
        self.present[instance] = agent

    def step(self) -> None:
        while True:
            try:
                instance, change = self.changes.get_nowait()
            except queue.Empty:
                return
            if change is ServiceStateChange.Removed:
                self._leave(instance, "goodbye")
            else:
                self._check(instance)

    def refresh(self) -> None:
        for instance in list(self.present):
            self._check(instance)


def discover(timeout_s: float, interfaces: list[str] | None = None) -> Discovery:
    """Browse for `timeout_s` seconds; agents present at the end, and those that left meanwhile."""
    zc = Zeroconf(interfaces=interfaces or InterfaceChoice.All, ip_version=IPVersion.V4Only)
    state = _Browse(zc)
    browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[state.on_change])
    try:
        deadline = time.monotonic() + timeout_s
        next_refresh = time.monotonic() + _REFRESH_EVERY_S
        while time.monotonic() < deadline:
            state.step()
            if time.monotonic() >= next_refresh:
                state.refresh()
                next_refresh = time.monotonic() + _REFRESH_EVERY_S
            time.sleep(0.05)
        state.step()
        state.refresh()  # what is listed answered (or was cached fresh) just now
    finally:
        browser.cancel()
        zc.close()
    return Discovery(
        agents=tuple(sorted(state.present.values(), key=lambda a: (a.name, a.instance))),
        gone=tuple(sorted(state.gone.values(), key=lambda g: g.gone_at)),
        ignored=tuple(f"{i}: {why}" for i, why in sorted(state.ignored.items())),
    )


def _get_json(address: str, port: int, path: str, timeout_s: float) -> Any:
    # http.client, not urllib: a LAN agent must never be reached through an http_proxy.
    conn = http.client.HTTPConnection(address, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read(_SNAPSHOT_MAX_BYTES + 1)
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}")
        if len(body) > _SNAPSHOT_MAX_BYTES:
            raise OSError("answer too large")
        # {file: text} is two levels deep; Refused and UnicodeDecodeError are ValueErrors
        return parse_json(body.decode("utf-8"), max_depth=_SNAPSHOT_MAX_DEPTH)
    finally:
        conn.close()


def fetch_snapshot(agent: FoundAgent, timeout_s: float = 5.0) -> dict[str, str | None]:
    """The agent's snapshot files {filename: content or None}; OSError naming what failed."""
    errors = []
    for address in agent.addresses:
        try:
            raw = _get_json(address, agent.port, SNAPSHOT_PATH, timeout_s)
        except (OSError, ValueError, http.client.HTTPException) as e:
            errors.append(f"{address}:{agent.port}: {clean(str(e) or type(e).__name__, 120)}")
            continue
        if not isinstance(raw, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in raw.items()
        ):
            errors.append(f"{address}:{agent.port}: not a snapshot ({{file: text}} JSON)")
            continue
        return {k: v for k, v in raw.items() if snapshot_file_name(k)}  # names, never paths
    raise OSError(f"{agent.name}: could not fetch its snapshot ({'; '.join(errors)})")


def fetch_snapshots(
    agents: tuple[FoundAgent, ...], warn: Callable[[str], None] | None = None
) -> dict[str, dict[str, str | None]]:
    """Every agent's snapshot by host name; an unreachable agent gets no files (a probe gap)."""
    warn = warn or (lambda line: print(f"mlx-cluster: warning: {line}", file=sys.stderr))
    out: dict[str, dict[str, str | None]] = {}
    for agent in agents:
        try:
            out[agent.name] = fetch_snapshot(agent)
        except OSError as e:
            warn(str(e))
            out[agent.name] = {}
    return out
