"""A SetupPlan as the contract's JSON object and as text a person follows."""

from __future__ import annotations

from topology.setup.plan import SetupPlan

_KIND = {"jaccl": "full RDMA mesh", "jaccl-ring": "RDMA ring", "ring": "TCP ring"}


def setup_json(plan: SetupPlan) -> dict[str, object]:
    """`topology setup --json`: exactly hosts, links and manual."""
    return {
        "hosts": [{"name": h.name, "commands": h.lines()} for h in plan.hosts],
        "links": [
            {
                "a": k.a,
                "a_iface": k.a_iface,
                "a_ip": k.a_ip,
                "b": k.b,
                "b_iface": k.b_iface,
                "b_ip": k.b_ip,
                "prefix_len": k.prefix_len,
            }
            for k in plan.links
        ],
        "manual": [{"host": m.host, "step": m.step} for m in plan.manual],
    }


def setup_text(plan: SetupPlan, applying: bool = False) -> str:
    n = len(plan.hosts)
    lines = [
        f"Topology setup: {n} host{'s' if n != 1 else ''}, target backend {plan.target} "
        f"({_KIND[plan.target]})",
        "",
        "Commands (run on each Mac as shown)" if plan.commands else "Commands: none needed",
    ]
    for h in plan.hosts:
        if h.commands:
            lines.append(f"  {h.name}:")
            lines += [f"    {line}" for line in h.lines()]
    if plan.links:
        lines += ["", "Links in use (addresses once set up; * = set by the commands above)"]
        for k in plan.links:
            lines.append(
                f"  {k.a} {k.a_iface} {k.a_ip}/{k.prefix_len} ↔ {k.b} {k.b_iface} "
                f"{k.b_ip}/{k.prefix_len}{' *' if k.new else ''}"
            )
    lines += [
        "",
        "Manual steps (only a person can do these)" if plan.manual else "Manual steps: none",
    ]
    for m in plan.manual:
        lines.append(f"  {m.host}: {m.step}" if m.host else f"  {m.step}")
    lines.append("")
    if plan.nothing_to_do:
        lines.append(f"Nothing to do: the wiring is ready for {plan.target}.")
    elif plan.commands and not applying:
        lines.append(
            "Run the commands on each Mac, or run this again with --apply (over ssh, needs "
            "password-less sudo); then `mlx-cluster topology check`."
        )
    elif not plan.commands:
        lines.append("No command can fix the rest: do the manual steps, then run setup again.")
    return "\n".join(lines) + "\n"
