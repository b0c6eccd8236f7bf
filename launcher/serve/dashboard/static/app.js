// The dashboard's data: GET /v1/cluster/state once, then /v1/cluster/stream (server-sent
// events read through fetch, since EventSource cannot send the API key), reconnecting when the
// stream ends. With --api-key the page asks for the key once and keeps it for this tab.
"use strict";

const MLXApp = (() => {
  const KEY = "mlx-cluster-api-key";
  const $ = (id) => document.getElementById(id);
  let key = sessionStorage.getItem(KEY) || "";
  let shownWiring = "", shownPlan = "";
  const state = { latest: null };

  function headers() { return key ? { Authorization: `Bearer ${key}` } : {}; }

  function askKey(wrong) {
    $("key-form").hidden = false;
    $("key-error").textContent = wrong ? "that key was refused" : "";
    setStatus("unauthorized", "the API key is needed");
    $("key-input").focus();
  }

  function setStatus(status, reason) {
    $("status").textContent = status;
    $("status").className = `badge ${status}`;
    $("reason").textContent = reason || "";
  }

  function render(s) {
    state.latest = s;
    $("model").textContent = s.model;
    setStatus(s.serving.status, s.serving.reason);
    const wiring = JSON.stringify([s.hosts, s.links, s.problems, s.check]);
    if (wiring !== shownWiring) {  // the graph is redrawn only when the facts change
      shownWiring = wiring;
      MLX.renderWiring($("wiring"), s);
    }
    const plan = JSON.stringify([s.plan, s.serving.tok_s]);
    if (plan !== shownPlan) {
      shownPlan = plan;
      MLXPanels.plan($("plan"), s.plan, s.serving);
      $("backend-in-use").textContent = s.plan
        ? `backend in use: ${s.plan.backend} — ${s.plan.backend_why}` : "";
    }
    MLXPanels.serving($("figures"), $("charts"), $("ranks"), s.serving);
    MLXPanels.events($("events"), $("last-failure"), s.events);
    document.body.dataset.updated = String(s.time);
  }

  async function start() {
    let answer;
    try {
      answer = await fetch("/v1/cluster/state", { headers: headers() });
    } catch (e) {
      setStatus("offline", "the server does not answer; retrying");
      setTimeout(start, 2000);
      return;
    }
    if (answer.status === 401) { askKey(Boolean(key)); return; }
    if (!answer.ok) { setStatus("error", `state: HTTP ${answer.status}`); setTimeout(start, 2000); return; }
    $("key-form").hidden = true;
    render(await answer.json());
    stream();
  }

  function frames(buffer, onState) {
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
      if (data) onState(JSON.parse(data));
    }
    return buffer;
  }

  async function stream() {
    try {
      const answer = await fetch("/v1/cluster/stream", { headers: headers() });
      if (answer.status === 401) { askKey(true); return; }
      if (!answer.ok || !answer.body) throw new Error(`HTTP ${answer.status}`);
      const reader = answer.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer = frames(buffer + decoder.decode(value, { stream: true }), render);
      }
    } catch (e) {
      // The server restarting or the network dropping: try again below.
    }
    setStatus("reconnecting", "the live stream ended; reconnecting");
    setTimeout(start, 2000);
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    key = $("key-input").value.trim();
    sessionStorage.setItem(KEY, key);
    start();
  });
  MLXChat.attach(() => ({ headers: headers(), model: state.latest ? state.latest.model : "default" }));
  start();
  return { state };
})();
