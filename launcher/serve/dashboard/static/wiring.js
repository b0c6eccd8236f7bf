// The wiring view, shared by serve's dashboard and `topology check --html`: every host and
// cable drawn as a graph, the host and cable tables, and the problems with their fixes.
// Every value from the server goes in as text (textContent), never as markup.
"use strict";

const MLX = (() => {
  const SVG_NS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "?";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return `${n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
  }

  function table(headers, rows) {
    const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
    const body = rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
  }

  function placeHosts(names, width, height) {
    const cx = width / 2, cy = height / 2, r = Math.min(width, height) / 2 - 50;
    const at = {};
    names.forEach((name, i) => {
      const angle = -Math.PI / 2 + (2 * Math.PI * i) / Math.max(1, names.length);
      at[name] = names.length === 1 ? [cx, cy] : [cx + r * Math.cos(angle), cy + r * Math.sin(angle)];
    });
    return at;
  }

  function graph(hosts, links) {
    const width = 720, height = hosts.length > 1 ? 380 : 110;
    const root = svg("svg", { class: "graph", viewBox: `0 0 ${width} ${height}`, role: "img" });
    root.append(svg("title", {}, "hosts and the cables between them"));
    const at = placeHosts(hosts.map((h) => h.name), width, height);
    const pairs = {};
    for (const k of links) {
      const key = [k.a, k.b].sort().join("\u0000");
      (pairs[key] = pairs[key] || []).push(k);
    }
    for (const cables of Object.values(pairs)) {
      cables.forEach((k, i) => {
        const a = at[k.a], b = at[k.b];
        if (!a || !b) return;
        const dx = b[0] - a[0], dy = b[1] - a[1], len = Math.hypot(dx, dy) || 1;
        const shift = (i - (cables.length - 1) / 2) * 14;  // several cables between one pair
        const ox = (-dy / len) * shift, oy = (dx / len) * shift;
        const line = svg("line", {
          class: `cable ${k.rdma ? "rdma" : "tcp"}`,
          x1: a[0] + ox, y1: a[1] + oy, x2: b[0] + ox, y2: b[1] + oy,
        });
        line.append(svg("title", {}, cableText(k)));
        root.append(line);
        const speed = k.speed_gbps === null ? "?" : `${k.speed_gbps} Gb/s`;
        const label = `${k.a_iface || "p" + k.a_port}↔${k.b_iface || "p" + k.b_port} ${speed}` +
          `${k.rdma ? " RDMA" : ""}`;
        // At the middle, unless that is the centre, where a mesh's diagonals cross.
        const centre = Math.hypot(a[0] + dx / 2 - width / 2, a[1] + dy / 2 - height / 2) < 20;
        const t = centre ? 0.3 : 0.5;
        root.append(svg("text", {
          class: "cable-label", x: a[0] + t * dx + ox, y: a[1] + t * dy + oy - 3,
          "text-anchor": "middle",
        }, label));
      });
    }
    for (const h of hosts) {
      const [x, y] = at[h.name];
      const g = svg("g", { class: "host" });
      g.append(svg("rect", { x: x - 90, y: y - 24, width: 180, height: 48, rx: 8 }));
      g.append(svg("text", { x, y: y - 6, "text-anchor": "middle", "font-weight": "600" }, h.name));
      const what = `${h.chip || (h.is_mac ? "?" : "not a Mac")} · ${bytes(h.memory_bytes)}`;
      g.append(svg("text", { x, y: y + 12, "text-anchor": "middle" }, what));
      root.append(g);
    }
    return root;
  }

  function cableText(k) {
    const end = (host, port, iface, addrs) =>
      `${host} port ${port}${iface ? " (" + iface + ")" : ""}${addrs.length ? " " + addrs.join(", ") : ""}`;
    const speed = k.speed_gbps === null ? "unknown speed" : `${k.speed_gbps} Gb/s`;
    return `${end(k.a, k.a_port, k.a_iface, k.a_addresses)} ↔ ` +
      `${end(k.b, k.b_port, k.b_iface, k.b_addresses)}, ${speed}, RDMA ${k.rdma ? "on" : "off"}`;
  }

  function version(h, name) {
    const v = (h.versions || {})[name];
    return v === undefined ? "?" : v === null ? "missing" : v;
  }

  function hostRows(hosts) {
    return hosts.map((h) => [
      h.name, h.chip || (h.is_mac ? "?" : "not a Mac"), bytes(h.memory_bytes),
      h.is_mac ? `${h.macos || "?"} (${h.macos_build || "?"})` : "-", h.rdma,
      version(h, "mlx"), version(h, "mlx-lm"), version(h, "mlx-cluster"),
    ]);
  }

  function linkRows(links) {
    const end = (host, port, iface, addrs) =>
      `${host} port ${port} ${iface || ""} ${addrs.join(", ") || "no address"}`;
    return links.map((k) => [
      end(k.a, k.a_port, k.a_iface, k.a_addresses), end(k.b, k.b_port, k.b_iface, k.b_addresses),
      k.speed_gbps === null ? "?" : `${k.speed_gbps} Gb/s`, k.rdma ? "on" : "off",
    ]);
  }

  function problems(list) {
    if (!list.length) return el("p", { class: "good", id: "no-problems" }, "topology check found no problem");
    return el("ul", { class: "problems", id: "problems" }, ...list.map((p) => el(
      "li", {}, el("strong", { class: p.severity === "error" ? "bad" : "warn" }, `${p.code} `),
      p.message, el("br"), el("span", { class: "muted" }, "fix: "), p.fix,
    )));
  }

  // wiring: {hosts, links, problems, check}
  function renderWiring(root, wiring) {
    const check = wiring.check;
    const summary = check
      ? `the wiring supports: ${check.backend || "no backend"} (target ${check.target}; ` +
        `${check.ok ? "nothing blocks it" : "something blocks it"})`
      : "no facts yet";
    root.replaceChildren(
      graph(wiring.hosts, wiring.links),
      el("p", { class: "muted", id: "wiring-summary" }, summary),
      el("h3", {}, "Hosts"),
      table(["host", "chip", "memory", "macOS (build)", "RDMA", "mlx", "mlx-lm", "mlx-cluster"],
        hostRows(wiring.hosts)),
      el("h3", {}, "Cables"),
      wiring.links.length
        ? table(["one end", "other end", "speed", "RDMA"], linkRows(wiring.links))
        : el("p", { class: "muted" }, "no Thunderbolt cable between these hosts"),
      el("h3", {}, "Problems"),
      problems(wiring.problems),
    );
  }

  return { el, svg, bytes, table, renderWiring };
})();
