"""A CheckResult as a readable report, as the contract's JSON object, and as Graphviz dot."""

from __future__ import annotations

from topology.facts import CheckResult, HostFacts, Link
from topology.problems import unknown_hosts

_GIB = 1 << 30
_KIND = {"jaccl": "full RDMA mesh", "jaccl-ring": "RDMA ring", "ring": "TCP ring"}


def check_json(result: CheckResult) -> dict[str, object]:
    """The `topology check --json` object, exactly the contract's fields."""
    return {
        "ok": result.ok,
        "backend": result.backend,
        "hosts": [
            {
                "name": h.name,
                "chip": h.chip,
                "memory_bytes": h.memory_bytes,
                "macos": h.macos,
                "rdma": h.rdma,
                **({"blas": h.blas} if h.blas is not None else {}),  # Linux hosts' blas.txt
                **({"rates": h.rates.to_json()} if h.rates is not None else {}),  # rates.json
            }
            for h in result.hosts
        ],
        "links": [
            {
                "a": k.a,
                "a_port": k.a_port,
                "a_iface": k.a_iface,
                "b": k.b,
                "b_port": k.b_port,
                "b_iface": k.b_iface,
                "speed_gbps": k.speed_gbps,
                "rdma": k.rdma,
            }
            for k in result.links
        ],
        "problems": [p.to_json() for p in result.problems],
    }


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def _memory(h: HostFacts) -> str:
    return f"{h.memory_bytes / _GIB:.0f} GB" if h.memory_bytes else "?"


def _host_rows(result: CheckResult) -> list[str]:
    rows = [["host", "chip", "memory", "macOS", "RDMA", "TB ports used"]]
    for h in result.hosts:
        used = sum(1 for p in h.tb_ports if p.connected)
        ports = f"{used}/{len(h.tb_ports)}" if h.tb_ports else "-"
        chip = h.chip or ("not a Mac" if not h.is_mac else "?")
        rows.append([h.name, chip, _memory(h), h.macos or "?", h.rdma, ports])
    return _table(rows)


def _blas_rows(result: CheckResult) -> list[str]:
    """The BLAS ranks would use on the hosts that are not Macs (when their probe said)."""
    rows = [[h.name, h.blas] for h in result.hosts if not h.is_mac and h.blas is not None]
    return ["", "BLAS on Linux hosts", *_table(rows)] if rows else []


def _cell(links: list[Link], row: str) -> str:
    if not links:
        return "-"
    parts = []
    for k in links:
        other = k.other(row)
        speed = f"{k.speed_gbps:g}" if k.speed_gbps is not None else "?"
        parts.append(f"{k.port_of(row)}→{k.port_of(other)} {speed}{'*' if k.rdma else ''}")
    return ",".join(parts)


def _matrix_rows(result: CheckResult) -> list[str]:
    names = [h.name for h in result.hosts]
    rows = [["", *names]]
    for r in names:
        cells = []
        for c in names:
            links = [k for k in result.links if {k.a, k.b} == {r, c}]
            cells.append("·" if r == c else _cell(links, r))
        rows.append([r, *cells])
    return _table(rows)


def _verdict(result: CheckResult) -> str:
    goal = "jaccl" if result.target == "auto" else result.target
    best = (
        f"{result.backend} ({_KIND[result.backend]})"
        if result.backend
        else "none (fix the errors above)"
    )
    errors = sum(1 for p in result.problems if p.severity == "error")
    n = len(result.hosts)
    unknown = unknown_hosts(result.hosts)
    if unknown:  # no verdict rests on facts that were never gathered
        return (
            f"Verdict: NOT ready for {goal}: nothing reliable is known about "
            f"{', '.join(unknown)} (probe_missing above says what and how to get it). "
            f"Best backend today: {best}."
        )
    if result.ok and result.backend == goal:
        return f"Verdict: ready for {goal} ({_KIND[goal]} over {n} hosts)."
    if result.ok:
        return (
            f"Verdict: ready for {goal} ({_KIND[goal]} over {n} hosts); the wiring allows {best}."
        )
    return (
        f"Verdict: NOT ready for {goal}: {errors} error{'s' if errors != 1 else ''} above. "
        f"Best backend today: {best}."
    )


def text_report(result: CheckResult) -> str:
    goal = "jaccl" if result.target == "auto" else result.target
    n = len(result.hosts)
    lines = [f"Topology check: {n} host{'s' if n != 1 else ''}, target backend {goal}", "", "Hosts"]
    lines += _host_rows(result)
    lines += _blas_rows(result)
    lines += ["", "Links (row's port → column's port, Gb/s; * = RDMA active)"]
    lines += _matrix_rows(result)
    lines += ["", "Problems" if result.problems else "Problems: none"]
    for p in result.problems:
        lines.append(f"  {p.severity.upper():7} {p.code}: {p.message}")
        lines.append(f"          fix: {p.fix}")
    lines += ["", _verdict(result)]
    return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    """A dot string; `\\n` inside stays dot's line break (names carry no quotes or backslashes)."""
    return '"' + s.replace('"', '\\"') + '"'


def dot(result: CheckResult) -> str:
    """Graphviz of the wiring: bold = RDMA active, dashed = no RDMA, red dotted = missing cable."""
    out = ["graph cluster {", "  node [shape=box, fontname=Helvetica];"]
    for h in result.hosts:
        label = f"{h.name}\\n{h.chip or '?'} {_memory(h)}\\nmacOS {h.macos or '?'}, RDMA {h.rdma}"
        out.append(f"  {_q(h.name)} [label={_q(label)}];")
    for k in result.links:
        label = f"{k.a_port} ({k.a_iface or '?'}) – {k.b_port} ({k.b_iface or '?'})"
        speed = f"{k.speed_gbps:g} Gb/s" if k.speed_gbps is not None else "? Gb/s"
        style = "bold" if k.rdma else "dashed"
        tag = " RDMA" if k.rdma else ""
        text = _q(f"{label}\\n{speed}{tag}")
        out.append(f"  {_q(k.a)} -- {_q(k.b)} [label={text}, style={style}];")
    for p in result.problems:
        if p.code == "missing_link" and len(p.hosts) == 2:
            a, b = p.hosts
            out.append(f'  {_q(a)} -- {_q(b)} [label="missing", style=dotted, color=red];')
    out.append("}")
    return "\n".join(out) + "\n"
