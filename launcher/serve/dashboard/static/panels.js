// The dashboard's panels drawn from one /v1/cluster/state object: plan, live serving, events.
"use strict";

const MLXPanels = (() => {
  const { el, bytes, table } = MLX;
  const num = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
  const ms = (s) => (s === null || s === undefined ? "–" : `${(s * 1000).toFixed(0)} ms`);
  const pct = (r) => (r === null || r === undefined ? "–" : `${(r * 100).toFixed(0)} %`);

  function memoryBar(m) {
    const usable = m.usable_bytes || m.weight_bytes + m.kv_cache_bytes || 1;
    const bar = el("div", { class: "bar", title: "weights | KV cache | free" });
    bar.append(el("span", { class: "w", style: `width:${(100 * m.weight_bytes) / usable}%` }));
    bar.append(el("span", { class: "kv", style: `width:${(100 * m.kv_cache_bytes) / usable}%` }));
    return bar;
  }

  function plan(root, p, serving) {
    if (!p) { root.replaceChildren(el("p", { class: "muted" }, "no plan yet")); return; }
    const measured = serving ? serving.tok_s : {};
    root.replaceChildren(
      el("p", { id: "plan-summary" }, el("strong", {}, `${p.strategy} ×${p.ranks.length}`),
        ` over ${p.backend} — ${p.model}`),
      el("p", { class: "muted", id: "backend-why" }, p.backend_why),
      el("h3", {}, "Ranks"),
      table(["rank", "host", "layers", "heads", "weights", "KV cache"], p.ranks.map((r) => [
        String(r.rank), r.host, `${r.layers[0]}–${r.layers[1] - 1}`, r.heads,
        bytes(r.weight_bytes), bytes(r.kv_cache_bytes),
      ])),
      el("h3", {}, "Memory per host"),
      table(["host", "weights", "KV cache", "free", ""], p.memory.map((m) => [
        m.host, bytes(m.weight_bytes), bytes(m.kv_cache_bytes), bytes(m.free_bytes), memoryBar(m),
      ])),
      el("h3", {}, "Tokens/s"),
      table(["predicted (decode, one sequence)", "measured (all sequences, last second)",
        "measured per sequence (1 / ITL p50)", "prediction error"], [[
        num(p.predicted_tok_s), num(measured.measured), num(measured.per_sequence),
        predictionError(p.predicted_tok_s, measured.per_sequence),
      ]]),
    );
  }

  // The plan's decode figure against one sequence's measured speed; off by more than 25 %:
  // flagged, so nobody sizes a cluster on a figure this machine does not bear out.
  function predictionError(predicted, perSequence) {
    if (!predicted || !perSequence) return el("span", { id: "prediction-error" }, "–");
    const error = (predicted - perSequence) / perSequence;
    const flagged = Math.abs(error) > 0.25;
    const sign = error >= 0 ? "+" : "−";
    return el("span", {
      id: "prediction-error", class: flagged ? "bad" : "good", "data-flagged": String(flagged),
      title: flagged ? "the prediction is off by more than 25 %" : "within 25 %",
    }, `${sign}${Math.abs(100 * error).toFixed(0)} %${flagged ? " (off by over 25 %)" : ""}`);
  }

  function figure(label, value, id) {
    return el("div", { class: "figure", id }, el("div", { class: "value" }, value),
      el("div", { class: "label" }, label));
  }

  // The measured step-cost model rank 0 chooses the draft width from: fixed + per position,
  // and a check's own line (what it adds, per position it computes).
  function stepCost(sp) {
    if (!sp.step_cost_fixed_s && !sp.step_cost_per_position_s) return "–";
    const f = (sp.step_cost_fixed_s * 1000).toFixed(1);
    const p = (sp.step_cost_per_position_s * 1000).toFixed(2);
    const c = (sp.step_cost_check_s * 1000).toFixed(1);
    const cp = ((sp.step_cost_check_per_position_s ?? sp.step_cost_per_position_s) * 1000)
      .toFixed(2);
    return `${f} ms + ${p} ms/position (a check: ${c} ms more, ${cp} ms/position)`;
  }

  function serving(figRoot, chartRoot, rankRoot, s) {
    const t = s.totals;
    figRoot.replaceChildren(
      figure("running", num(s.running, 0), "fig-running"),
      figure("queued", num(s.queued, 0), "fig-queued"),
      figure("prompt tok/s", num(s.prompt_tps), "fig-prompt-tps"),
      figure("generation tok/s", num(s.generation_tps), "fig-generation-tps"),
      figure("TTFT p50 / p99", `${ms(s.ttft_s.p50)} / ${ms(s.ttft_s.p99)}`, "fig-ttft"),
      figure("ITL p50 / p99", `${ms(s.itl_s.p50)} / ${ms(s.itl_s.p99)}`, "fig-itl"),
      figure("prefix-cache hits", pct(s.prefix_cache.hit_ratio), "fig-cache"),
      figure("drafts accepted", pct(s.speculative.acceptance), "fig-acceptance"),
      figure("draft width", s.speculative.width === null ? "bound" : num(s.speculative.width, 0),
        "fig-draft-width"),
      figure("step cost", stepCost(s.speculative), "fig-step-cost"),
      figure("requests answered", num(t.requests, 0), "fig-requests"),
      figure("tokens generated", num(t.generated_tokens, 0), "fig-generated"),
      figure("failovers", num(t.failovers, 0), "fig-failovers"),
    );
    const x = s.series, ago = x.ago_s || [];
    const col = (k) => x[k] || [];
    const scaled = (k, f) => col(k).map((v) => (v === null ? null : v * f));
    // One line per rank: the figures the state names <prefix><rank> (peak_memory_rank1...).
    const perRank = (prefix, f) => Object.keys(x).filter((k) => k.startsWith(prefix)).sort()
      .map((k) => ({ name: `r${k.slice(prefix.length)}`, values: scaled(k, f) }));
    const memory = perRank("peak_memory_rank", 1e-6);
    chartRoot.replaceChildren(
      MLXCharts.chart("requests running / queued", ago,
        [{ name: "run", values: col("running") }, { name: "q", values: col("queued") }], (v) => v.toFixed(0)),
      MLXCharts.chart("tokens/s prompt / generation", ago,
        [{ name: "p", values: col("prompt_tps") }, { name: "g", values: col("generation_tps") }], (v) => v.toFixed(1)),
      MLXCharts.chart("TTFT p50 / p99 (ms, last minute)", ago,
        [{ name: "p50", values: scaled("ttft_p50", 1000) }, { name: "p99", values: scaled("ttft_p99", 1000) }],
        (v) => v.toFixed(0)),
      MLXCharts.chart("ITL p50 / p99 (ms, last minute)", ago,
        [{ name: "p50", values: scaled("itl_p50", 1000) }, { name: "p99", values: scaled("itl_p99", 1000) }],
        (v) => v.toFixed(0)),
      MLXCharts.chart("prefix-cache hit rate (%)", ago,
        [{ name: "", values: scaled("prefix_cache_hit_ratio", 100) }], (v) => v.toFixed(0)),
      MLXCharts.chart("drafts accepted (%)", ago,
        [{ name: "", values: scaled("acceptance", 100) }], (v) => v.toFixed(0)),
      MLXCharts.chart("step time, batch p50 and each rank's (ms)", ago,
        [{ name: "p50", values: scaled("step_p50", 1000) }, ...perRank("step_rank", 1000)],
        (v) => v.toFixed(1)),
      MLXCharts.chart("peak memory per rank (MB)", ago, memory, (v) => v.toFixed(1)),
    );
    rankRoot.replaceChildren(
      el("h3", {}, "Ranks"),
      table(["rank", "host", "step time (own)", "peak memory", "last heard"], s.ranks.map((r) => [
        String(r.rank), r.host, ms(r.step_s), bytes(r.peak_memory_bytes), `${num(r.heard_s_ago)} s ago`,
      ])),
    );
  }

  function events(listRoot, failureRoot, ev) {
    listRoot.replaceChildren(...ev.items.map((e) => {
      const when = new Date(e.at * 1000).toLocaleTimeString();
      const item = el("li", { "data-kind": e.kind }, el("span", { class: "time" }, when),
        el("span", { class: "kind" }, e.kind.replace("_", " ")), e.message);
      if (e.progress !== undefined) {
        item.append(" ", el("progress", { max: "1", value: String(e.progress) }));
      }
      return item;
    }));
    failureRoot.hidden = !ev.last_failure;
    if (ev.last_failure) {
      const when = new Date(ev.last_failure.at * 1000).toLocaleString();
      failureRoot.querySelector("pre").textContent = `${when}\n${ev.last_failure.message}`;
    }
  }

  return { plan, serving, events };
})();
