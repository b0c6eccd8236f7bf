// Small time-series charts: one SVG per figure, the last two minutes, newest at the right.
"use strict";

const MLXCharts = (() => {
  const COLORS = ["#2563eb", "#9333ea", "#15803d", "#b45309"];
  const WIDTH = 240, HEIGHT = 60;

  // lines: [{name, values: [number|null]}]; ago: seconds before now of each point
  function chart(title, ago, lines, format) {
    const box = MLX.el("div", { class: "chart", "data-chart": title });
    const latest = lines.map((l) => {
      const v = [...l.values].reverse().find((x) => x !== null && x !== undefined);
      return `${l.name ? l.name + " " : ""}${v === undefined ? "–" : format(v)}`;
    }).join(" · ");
    box.append(MLX.el("div", { class: "title" }, MLX.el("span", {}, title), MLX.el("span", {}, latest)));
    const root = MLX.svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: "none" });
    const all = lines.flatMap((l) => l.values.filter((v) => v !== null && v !== undefined));
    const top = Math.max(1e-9, ...all) * 1.1;
    const span = Math.max(60, ...ago);
    lines.forEach((l, i) => {
      const points = [];
      l.values.forEach((v, j) => {
        if (v === null || v === undefined) return;
        const x = WIDTH - (ago[j] / span) * WIDTH;
        points.push(`${x.toFixed(1)},${(HEIGHT - 2 - (v / top) * (HEIGHT - 6)).toFixed(1)}`);
      });
      root.append(MLX.svg("polyline", { points: points.join(" "), stroke: COLORS[i % COLORS.length] }));
    });
    box.append(root);
    return box;
  }

  return { chart };
})();
