"""The viewer page's script (a string constant). It builds every element with DOM calls and
`textContent`, never `innerHTML`, so rollout text (which may hold markup) is shown, not run."""

JS = r"""
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("ludic-data").textContent);
  const EPS = DATA.episodes;
  const COLLAPSE_MIN = 220, KEEP_HEAD = 24, KEEP_TAIL = 120, KEEP_SHARED = 12, HIST_BINS = 14;
  const TONES = {
    win: "good", success: "good", right: "good", correct: "good", pass: "good", solved: "good",
    loss: "bad", failure: "bad", wrong: "bad", incorrect: "bad", fail: "bad", illegal: "bad",
    draw: "warn", close: "warn", partial: "warn", truncated: "violet", error: "bad",
  };
  const TONE_COLORS = { good: "#22c55e", bad: "#ef4444", warn: "#f59e0b", violet: "#8b5cf6" };
  const $ = (id) => document.getElementById(id);

  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }
  const num = (x, d) => (x === null || x === undefined ? "—" : (x > 0 ? "+" : "") + Number(x).toFixed(d ?? 2));
  const sign = (x) => (x > 0 ? "pos" : x < 0 ? "neg" : "zero");
  const tone = (o) => TONES[String(o).toLowerCase()] || "";
  function outcomeColor(o) {
    const t = tone(o);
    if (t) return TONE_COLORS[t];
    let h = 0;
    for (const ch of String(o)) h = (h * 31 + ch.charCodeAt(0)) % 360;
    return "hsl(" + h + ", 55%, 52%)";
  }
  const badge = (text, cls, title) => el("span", { class: "badge " + (cls || ""), title }, text);
  const outcomeBadge = (o) => badge(o, tone(o) || "ghost");

  // ---- state, kept in the URL hash so a view can be shared or reloaded ----------------------
  const state = { ep: null, outcomes: new Set(), rmin: "", rmax: "", q: "", flag: "", sort: "index" };
  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    state.ep = p.get("ep");
    state.outcomes = new Set((p.get("outcome") || "").split(",").filter(Boolean));
    state.rmin = p.get("rmin") || "";
    state.rmax = p.get("rmax") || "";
    state.q = p.get("q") || "";
    state.flag = p.get("flag") || "";
    state.sort = p.get("sort") || "index";
  }
  function writeHash() {
    const p = new URLSearchParams();
    if (state.ep) p.set("ep", state.ep);
    if (state.outcomes.size) p.set("outcome", [...state.outcomes].join(","));
    for (const k of ["rmin", "rmax", "q", "flag"]) if (state[k] !== "") p.set(k, state[k]);
    if (state.sort !== "index") p.set("sort", state.sort);
    try { history.replaceState(null, "", "#" + p.toString()); } catch (err) { /* file:// quirks */ }
  }

  function matches(e) {
    const r = e.reward ?? 0;
    if (state.outcomes.size && !state.outcomes.has(e.outcome)) return false;
    if (state.rmin !== "" && r < Number(state.rmin)) return false;
    if (state.rmax !== "" && r > Number(state.rmax)) return false;
    if (state.flag === "truncated" && !e.truncated) return false;
    if (state.flag === "parse" && !e.parse_errors) return false;
    if (state.flag === "failed" && !e.failed) return false;
    if (state.q) {
      const hay = [e.id, e.group, e.request, e.env, e.seed, e.outcome, e.agent].join(" ").toLowerCase();
      if (!hay.includes(state.q.toLowerCase())) return false;
    }
    return true;
  }
  const SORTS = {
    index: (a, b) => a.index - b.index,
    "reward-desc": (a, b) => (b.reward ?? 0) - (a.reward ?? 0) || a.index - b.index,
    "reward-asc": (a, b) => (a.reward ?? 0) - (b.reward ?? 0) || a.index - b.index,
    "turns-desc": (a, b) => b.num_turns - a.num_turns || a.index - b.index,
  };
  const visible = () => EPS.filter(matches).sort(SORTS[state.sort] || SORTS.index);

  // ---- top bar --------------------------------------------------------------------------------
  function renderTopbar(shown) {
    const mean = (xs) => (xs.length ? xs.reduce((s, e) => s + (e.reward ?? 0), 0) / xs.length : null);
    const counts = {};
    for (const e of shown) counts[e.outcome] = (counts[e.outcome] || 0) + 1;
    const dist = el("div", { class: "dist", title: "outcomes of the shown episodes" },
      Object.entries(counts).sort().map(([o, n]) =>
        el("i", { style: "width:" + (100 * n / shown.length) + "%;background:" + outcomeColor(o), title: o + ": " + n })));
    const stat = (value, label, cls) => el("div", { class: "stat " + (cls || "") }, el("b", {}, value), el("small", {}, label));
    $("topbar").replaceChildren(
      el("div", { class: "brand" }, "ludic ", el("span", {}, "rollouts")),
      el("div", { class: "source", title: DATA.source || "" }, (DATA.title || "") + (DATA.source ? "  ·  " + DATA.source : "")),
      stat(shown.length + " / " + EPS.length, "episodes"),
      stat(num(mean(shown), 3), "mean reward"),
      stat(DATA.tokenizer || "—", "tokens shown as", "minor"),
      dist);
  }

  // ---- filters (built once; refresh() updates their state) ------------------------------------
  const rewards = EPS.map((e) => e.reward ?? 0);
  const RLO = rewards.length ? Math.min(...rewards) : 0, RHI = rewards.length ? Math.max(...rewards) : 0;
  const outcomeNames = [...new Set(EPS.map((e) => e.outcome))].sort();
  let histBars = [], chipEls = {}, countEl, inputs = {};

  function buildFilters() {
    const search = el("input", { type: "search", placeholder: "Search id, group, env, seed…  (press /)", value: state.q,
      oninput: (ev) => { state.q = ev.target.value; refresh(); } });
    inputs.q = search;
    const mk = (key, ph) => (inputs[key] = el("input", { type: "number", step: "any", placeholder: ph, value: state[key],
      oninput: (ev) => { state[key] = ev.target.value; refresh(); } }));
    const span = RHI - RLO || 1;
    const bins = new Array(HIST_BINS).fill(0);
    for (const r of rewards) bins[Math.min(HIST_BINS - 1, Math.floor(((r - RLO) / span) * HIST_BINS))]++;
    const top = Math.max(1, ...bins);
    histBars = bins.map((n, i) => {
      const lo = RLO + (span * i) / HIST_BINS, hi = RLO + (span * (i + 1)) / HIST_BINS;
      return el("div", { style: "height:" + Math.max(6, (100 * n) / top) + "%", title: n + " episodes with reward in [" + lo.toFixed(2) + ", " + hi.toFixed(2) + "]",
        "data-lo": lo, "data-hi": hi,
        onclick: () => { state.rmin = String(+lo.toFixed(6)); state.rmax = String(+hi.toFixed(6)); inputs.rmin.value = state.rmin; inputs.rmax.value = state.rmax; refresh(); } });
    });
    chipEls = {};
    const chips = outcomeNames.map((o) => (chipEls[o] = el("button", { class: "chip-toggle", "data-outcome": o,
      onclick: () => { state.outcomes.has(o) ? state.outcomes.delete(o) : state.outcomes.add(o); refresh(); } },
      el("span", { class: "dot", style: "background:" + outcomeColor(o) }), o,
      el("small", {}, String(EPS.filter((e) => e.outcome === o).length)))));
    const select = (key, options) => (inputs[key] = el("select", { onchange: (ev) => { state[key] = ev.target.value; refresh(); } },
      options.map(([v, label]) => el("option", { value: v, selected: state[key] === v }, label))));
    countEl = el("span");
    $("filters").replaceChildren(
      search,
      el("label", { class: "title" }, "Reward"),
      el("div", {}, el("div", { class: "hist" }, histBars),
        el("div", { class: "hist-axis" }, el("span", {}, RLO.toFixed(2)), el("span", {}, RHI.toFixed(2)))),
      el("div", { class: "range-row" }, mk("rmin", "min"), el("span", {}, "to"), mk("rmax", "max")),
      el("label", { class: "title" }, "Outcome"),
      el("div", { class: "chips" }, chips),
      el("div", { class: "range-row" },
        select("flag", [["", "All episodes"], ["truncated", "Truncated"], ["parse", "With parse errors"], ["failed", "Failed (error)"]]),
        el("span", {}, ""),
        select("sort", [["index", "Original order"], ["reward-desc", "Reward, high first"], ["reward-asc", "Reward, low first"], ["turns-desc", "Most turns first"]])),
      el("div", { class: "filter-foot" }, countEl,
        el("span", {}, el("kbd", {}, "j"), " ", el("kbd", {}, "k"), " move  ",
          el("button", { class: "linkish", onclick: resetFilters }, "Reset"))));
  }
  function resetFilters() {
    Object.assign(state, { outcomes: new Set(), rmin: "", rmax: "", q: "", flag: "", sort: "index" });
    for (const k of ["q", "rmin", "rmax", "flag", "sort"]) inputs[k].value = state[k];
    refresh();
  }

  // ---- episode list ---------------------------------------------------------------------------
  function renderList(shown) {
    const list = $("episode-list");
    list.replaceChildren(...shown.map((e) => el("li", {
        class: "ep-item" + (e.id === state.ep ? " selected" : ""), "data-id": e.id, "data-outcome": e.outcome,
        "data-reward": e.reward ?? 0, onclick: () => select(e.id) },
      el("span", { class: "num" }, "#" + e.index),
      el("span", { class: "main" }, outcomeBadge(e.outcome),
        e.truncated ? el("span", { class: "flag", title: "truncated: " + (e.truncation_reason || "") }, "✂") : null,
        e.parse_errors ? el("span", { class: "flag", title: e.parse_errors + " parse errors" }, "⚠" + e.parse_errors) : null,
        el("span", { class: "flag" }, e.num_turns + (e.num_turns === 1 ? " turn" : " turns"))),
      el("span", { class: "reward " + sign(e.reward) }, num(e.reward)),
      el("span", { class: "sub" }, [e.group && "group " + e.group, e.seed !== null && e.seed !== undefined && "seed " + e.seed, e.env]
        .filter(Boolean).join(" · ") || e.id))));
    if (!shown.length) list.append(el("li", { class: "empty" }, "No episode matches these filters."));
    const sel = list.querySelector(".selected");
    if (sel && sel.scrollIntoView) sel.scrollIntoView({ block: "nearest" });
  }
  function select(id) { state.ep = id; refresh(); $("detail").scrollTop = 0; }

  function refresh() {
    const shown = visible();
    if (!shown.some((e) => e.id === state.ep)) state.ep = shown.length ? shown[0].id : null;
    for (const [o, chip] of Object.entries(chipEls)) chip.classList.toggle("on", state.outcomes.has(o));
    const lo = state.rmin === "" ? -Infinity : Number(state.rmin), hi = state.rmax === "" ? Infinity : Number(state.rmax);
    for (const b of histBars) b.classList.toggle("on", Number(b.dataset.hi) >= lo && Number(b.dataset.lo) <= hi);
    countEl.textContent = shown.length + " of " + EPS.length + " shown";
    renderTopbar(shown);
    renderList(shown);
    renderEpisode(EPS.find((e) => e.id === state.ep) || null);
    writeHash();
  }

  // ---- one episode ----------------------------------------------------------------------------
  function renderEpisode(e) {
    const d = $("detail");
    if (!e) { d.replaceChildren(el("div", { class: "empty" }, EPS.length ? "No episode matches the filters." : "This file has no episodes.")); return; }
    const fact = (label, value) => (value === null || value === undefined || value === "" ? null : el("span", {}, label + " ", el("b", {}, String(value))));
    const head = el("section", { class: "ep-head", "data-episode": e.id },
      el("div", {}, el("h1", {}, "Episode #" + e.index,
        e.outcome !== "truncated" ? outcomeBadge(e.outcome) : null,
        e.truncated ? badge("truncated · " + (e.truncation_reason || "?"), "violet") : null,
        e.parse_errors ? badge(e.parse_errors + " parse error" + (e.parse_errors > 1 ? "s" : ""), "bad") : null,
        el("code", {}, e.id))),
      el("div", { class: "big " + sign(e.reward) }, num(e.reward, 3), el("small", {}, "total reward")),
      el("div", { class: "facts" }, fact("group", e.group), fact("request", e.request), fact("env", e.env),
        fact("seed", e.seed), fact("agent", e.agent), fact("turns", e.num_turns), fact("completion tokens", e.completion_tokens)),
      e.failed ? el("div", { class: "alert bad" }, "Episode failed" + (e.error_phase ? " in " + e.error_phase : "") +
        (e.error_type ? " (" + e.error_type + ")" : "") + ": " + (e.error || "")) : null,
      Object.keys(e.meta).length ? el("details", { class: "meta" }, el("summary", {}, "rollout meta"), el("pre", {}, JSON.stringify(e.meta, null, 2))) : null);
    const anyTokens = e.turns.some((t) => t.samples.length) || e.samples.length;
    const legend = anyTokens ? el("div", { class: "legend" }, "Tokens:",
      el("span", { class: "tok prm" }, " prompt (mask 0) "),
      el("span", { class: "tok act" }, " action (mask 1) "),
      e.derived_samples ? "— weights unknown (no samples given)" : [el("span", { class: "tok act wpos" }, " weight > 0 "), el("span", { class: "tok act wneg" }, " weight < 0 ")],
      " · hover a token for its id and logprob") : null;
    const ctx = { prev: null };  // ids of the previous turn's last sample, to fold the shared prefix
    d.replaceChildren(...[head, legend, ...e.turns.map((t) => renderTurn(t, e, ctx)),
      e.samples.length ? el("section", { class: "turn" }, el("header", {}, el("h2", {}, "Episode sample")),
        el("div", { class: "body" }, renderSamples(e.samples, e.derived_samples, { prev: null }))) : null].filter(Boolean));
  }

  function renderTurn(t, e, ctx) {
    const env = t.env;
    return el("section", { class: "turn", "data-turn": t.id },
      el("header", {}, el("h2", {}, "Turn " + (t.index + 1)),
        el("span", { class: "rw " + sign(t.reward) }, num(t.reward)),
        env && env.parse_error ? badge("parse error", "bad") : null,
        env && env.terminated ? badge("terminated", "info") : null,
        env && env.truncated ? badge("truncated · " + (env.reason || "?"), "violet") : null,
        t.calls.length > 1 ? badge(t.calls.length + " model calls", "ghost") : null,
        el("span", { class: "spacer" }), el("code", { class: "flag" }, t.id)),
      el("div", { class: "body" }, t.calls.map(renderCall), env ? renderEnv(env, "env") : null,
        t.observed.map((s) => renderEnv(s, "observed")), renderSamples(t.samples, e.derived_samples, ctx)));
  }

  function renderCall(c) {
    const finishCls = { stop: "ghost", length: "warn", tool_calls: "info" }[c.finish] || "ghost";
    const out = [];
    if (c.rewritten) out.push(el("div", { class: "note rewrite" }, "✂ context rewritten before this call — the whole prompt is shown"));
    for (const m of c.messages) out.push(renderMessage(m));
    out.push(el("div", { class: "msg assistant" },
      el("div", { class: "role" }, "assistant",
        c.target !== "env" ? badge(c.target + " call", "info", "action_target: " + c.target) : null,
        c.finish ? badge(c.finish === "length" ? "cut off · length" : "finish · " + c.finish, finishCls) : null,
        c.incomplete ? badge("incomplete completion", "warn") : null,
        c.version !== null && c.version !== undefined ? badge("policy v" + c.version, "ghost") : null,
        c.completion_tokens !== null ? badge(c.completion_tokens + " tokens", "ghost") : null),
      el("div", { class: "content" }, c.completion === "" ? "(empty completion)" : c.completion),
      c.tool_calls.map((tc) => el("div", { class: "toolcall" }, "▸ ", el("b", {}, tc.name), "(" + tc.arguments + ")"))));
    for (const r of c.tool_results) {
      out.push(el("div", { class: "msg tool" + (r.is_error ? " error" : "") },
        el("div", { class: "role" }, "tool result · " + r.name, r.is_error ? badge("error", "bad") : null),
        el("div", { class: "content" }, r.content)));
    }
    const p = c.parse;
    if (p && !p.ok) {
      out.push(el("div", { class: "note parse-bad" }, el("b", {}, "⚠ parse error"), p.obs ? "— " + p.obs : "",
        p.reward ? badge("reward " + num(p.reward), "bad") : null));
    } else if (p && c.target === "env") {
      out.push(el("div", { class: "note parse-ok" }, "✓ action", el("code", {}, p.action),
        p.reward ? badge("format reward " + num(p.reward), "good") : null));
    }
    return out;
  }

  function renderMessage(m) {
    return el("div", { class: "msg " + (["user", "system", "tool", "assistant"].includes(m.role) ? m.role : "user") },
      el("div", { class: "role" }, m.role + (m.name ? " · " + m.name : "")),
      el("div", { class: "content" }, m.content));
  }

  function renderEnv(s, kind) {
    const info = Object.entries(s.info || {}).filter(([, v]) => v === null || typeof v !== "object").slice(0, 8);
    return el("div", { class: "envstep" },
      el("span", { class: "arrow" }, kind === "env" ? "→ env" : "◦ observed"),
      s.parse_error ? el("span", {}, "not stepped (parse error)") : s.action !== null ? ["action", el("code", {}, s.action)] : null,
      el("span", {}, "reward ", el("b", { class: sign(s.reward) }, num(s.reward))),
      s.terminated ? badge("terminated", "info") : null,
      s.truncated ? badge("truncated · " + (s.reason || "?"), "violet") : null,
      info.map(([k, v]) => badge(k + ": " + v, "ghost")),
      s.obs ? el("details", {}, el("summary", {}, "next observation"), el("pre", {}, s.obs)) : null);
  }

  // ---- training samples and their tokens ------------------------------------------------------
  function renderSamples(samples, derived, ctx) {
    if (!samples.length) return null;
    const nAct = samples.reduce((n, s) => n + [...s.m].filter((c) => c === "1").length, 0);
    const nTok = samples.reduce((n, s) => n + s.ids.length, 0);
    const box = el("details", { class: "samples", open: true },
      el("summary", {}, "Training tokens · " + nAct + " action of " + nTok + (samples.length > 1 ? " · " + samples.length + " segments" : "")));
    samples.forEach((s, i) => {
      if (i > 0) box.append(el("div", { class: "snapcut" }, "snapshot boundary · context rewritten, a new sequence starts"));
      const act = [...s.m].filter((c) => c === "1").length;
      box.append(el("div", { class: "sample", "data-segment": s.segment, "data-snapshot": String(s.snapshot) },
        el("div", { class: "sample-head" },
          badge("sample " + (s.segment + 1) + "/" + s.segments, "ghost"),
          s.snapshot ? badge("snapshot", "violet") : null,
          derived ? badge("weight n/a", "ghost", "no samples were given: masks rebuilt from the traces") :
            badge("weight " + num(s.weight, 3), s.weight > 0 ? "good" : s.weight < 0 ? "bad" : "ghost", "advantage / credit (" + (s.source || "") + ")"),
          !derived && s.reward !== null ? badge("reward " + num(s.reward), "ghost") : null,
          s.finish ? badge("finish · " + s.finish, s.finish === "length" ? "warn" : "ghost") : null,
          s.truncated ? badge("truncated · " + (s.reason || "?"), "violet") : null,
          el("span", {}, act + " action / " + s.ids.length + " tokens")),
        renderTokens(s, derived, sharedPrefix(ctx.prev, s), i === 0 ? "the previous turn" : "the previous segment")));
      ctx.prev = s;
    });
    return box;
  }

  function sharedPrefix(prev, s) {
    // Prompt tokens this sample shares with the previous turn's sample (up to its first action).
    if (!prev) return 0;
    const firstAct = s.m.indexOf("1"), end = Math.min(prev.ids.length, firstAct < 0 ? s.ids.length : firstAct);
    let n = 0;
    while (n < end && prev.ids[n] === s.ids[n]) n++;
    if (n <= KEEP_SHARED + 8) return 0;
    for (let k = n - 1; k >= Math.max(1, n - 64); k--) if (s.t[k - 1].includes("\n")) return k;  // from a line start
    return n - KEEP_SHARED;
  }

  function collapsedButton(label, a, b, render) {
    const btn = el("button", { class: "collapsed", title: "show the hidden tokens", "data-hidden": b - a }, label);
    btn.addEventListener("click", () => { const f = document.createDocumentFragment(); render(a, b, f); btn.replaceWith(f); });
    return btn;
  }

  function renderTokens(s, derived, shared, sharedWith) {
    const n = s.ids.length;
    const wcls = derived ? "" : s.weight > 0 ? " wpos" : s.weight < 0 ? " wneg" : "";
    const box = el("div", { class: "tokens", "data-total": n, "data-action": [...s.m].filter((c) => c === "1").length });
    const frag = document.createDocumentFragment();
    const tok = (k) => {
      const act = s.m[k] === "1";
      const t = s.t[k];
      const special = /^<\|.*\|>$/.test(t) || /^\[\d+\]$/.test(t);
      const title = "#" + k + " · id " + s.ids[k] + (act ? " · action" + (s.lp ? " · logprob " + s.lp[k] : "") : " · prompt");
      return el("span", { class: "tok " + (act ? "act" + wcls : "prm") + (k % 2 ? " o" : "") + (special ? " special" : ""), title },
        t === "" ? "∅" : t.replace(/\n/g, "↵\n"));
    };
    const range = (a, b, into) => { for (let k = a; k < b; k++) into.append(tok(k)); };
    if (shared) frag.append(collapsedButton("⋯ " + shared + " tokens as in " + sharedWith + " ⋯", 0, shared, range));
    for (let i = shared; i < n;) {
      let j = i;
      while (j < n && s.m[j] === s.m[i]) j++;
      if (s.m[i] === "0" && j - i > COLLAPSE_MIN) {
        const hidden = [i + KEEP_HEAD, j - KEEP_TAIL];
        range(i, hidden[0], frag);
        frag.append(collapsedButton("⋯ " + (hidden[1] - hidden[0]) + " prompt tokens ⋯", hidden[0], hidden[1], range));
        range(hidden[1], j, frag);
      } else range(i, j, frag);
      i = j;
    }
    box.append(frag);
    return box;
  }

  // ---- keyboard -------------------------------------------------------------------------------
  document.addEventListener("keydown", (ev) => {
    const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement && document.activeElement.tagName);
    if (ev.key === "/" && !typing) { ev.preventDefault(); inputs.q.focus(); return; }
    if (typing || ev.metaKey || ev.ctrlKey || ev.altKey) return;
    const step = { j: 1, ArrowDown: 1, k: -1, ArrowUp: -1 }[ev.key];
    if (!step) return;
    ev.preventDefault();
    const shown = visible(), i = shown.findIndex((e) => e.id === state.ep);
    const next = shown[Math.max(0, Math.min(shown.length - 1, i + step))];
    if (next) select(next.id);
  });

  readHash();
  buildFilters();
  refresh();
  document.body.setAttribute("data-ready", "1");
})();
"""
