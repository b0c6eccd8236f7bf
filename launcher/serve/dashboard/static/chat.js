// The chat box: streams from /v1/chat/completions and shows, per answer, the time to its first
// token and its tokens/s (completion tokens from the stream's usage, over the time after the
// first token).
"use strict";

const MLXChat = (() => {
  const $ = (id) => document.getElementById(id);
  const history = [];

  function message(who, cls) {
    const text = MLX.el("span", { class: "text" });
    const stats = MLX.el("div", { class: "stats" });
    const box = MLX.el("div", { class: `msg ${cls}` }, MLX.el("span", { class: "who" }, who), text, stats);
    $("chat-log").append(box);
    return { box, text, stats };
  }

  async function ask(context, prompt) {
    history.push({ role: "user", content: prompt });
    message("you:", "user").text.textContent = prompt;
    const out = message("model:", "assistant");
    const sent = performance.now();
    let first = null, tokens = null, answer = "";
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...context.headers },
        body: JSON.stringify({
          model: context.model, messages: history, stream: true, max_tokens: 256,
          stream_options: { include_usage: true },
        }),
      });
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, cut).trim();
          buffer = buffer.slice(cut + 1);
          if (!line.startsWith("data:") || line === "data: [DONE]") continue;
          const chunk = JSON.parse(line.slice(5));
          if (chunk.error) throw new Error(chunk.error.message);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            if (first === null) first = performance.now();
            answer += delta.content;
            out.text.textContent = answer;
            out.box.dataset.pieces = String(Number(out.box.dataset.pieces || 0) + 1);
          }
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
        }
      }
      history.push({ role: "assistant", content: answer });
      const end = performance.now();
      const ttft = first === null ? null : first - sent;
      const rate = first !== null && tokens && end > first ? (tokens - 1) / ((end - first) / 1000) : null;
      out.stats.textContent = `TTFT ${ttft === null ? "–" : ttft.toFixed(0) + " ms"} · ` +
        `${rate === null ? "–" : rate.toFixed(1)} tok/s · ${tokens ?? "?"} tokens`;
      out.box.dataset.done = "1";
    } catch (e) {
      history.pop();
      out.stats.textContent = `failed: ${e.message}`;
      out.box.dataset.done = "error";
    }
  }

  function attach(context) {
    $("chat-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const prompt = $("chat-input").value.trim();
      if (!prompt) return;
      $("chat-input").value = "";
      $("chat-send").disabled = true;
      try { await ask(context(), prompt); } finally { $("chat-send").disabled = false; }
    });
  }

  return { attach };
})();
