// agentrl view: the page's only script (served from this origin; no library, nothing fetched from elsewhere).
// Every string from the run (trajectory text is model output) reaches the DOM through textContent or an SVG text
// node, never parsed as HTML, so it cannot become markup, and through shown(), which marks bidi control characters
// (a "safe\u202eexe.txt" would read as "safetxt.exe") as visible ⟨U+202E⟩. Routes live in the URL hash:
//   #/?<filters>&page=N    the curves and the trajectory list
//   #/t/<row>              one trajectory          #/diff/<a>/<b>   two trajectories of a group side by side
"use strict";

const PAGE = 100;
const $ = (id) => document.getElementById(id);
const state = { run: null, view: null, diff: null, mode: "version", charts: [] };

const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function shown(text) {
  return String(text).replace(BIDI, (c) => `⟨U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = shown(text);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

async function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const resp = await fetch(url, { cache: "no-store", credentials: "same-origin" });
  let body;
  try { body = await resp.json(); } catch (e) { throw new Error(`${path}: HTTP ${resp.status}`); }
  if (!resp.ok) throw new Error(body && body.error ? body.error : `HTTP ${resp.status}`);
  return body;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  return x.toFixed(digits);
}

function setStatus(text, isError) {
  const s = $("status");
  s.textContent = shown(text || "");
  s.className = isError ? "error" : "";
}

// ------------------------------------------------------------------------------------------- run and problems
function showProblems(run) {
  const box = $("problems");
  box.replaceChildren();
  let any = false;
  for (const note of run.notes || []) {
    box.appendChild(el("div", "note", note));
    any = true;
  }
  for (const [name, p] of Object.entries(run.problems || {})) {
    if (!p) continue;
    if (p.error) { box.appendChild(el("div", null, `${name}: ${p.error}`)); any = true; }
    if (p.count > 0) {
      const d = el("div");
      d.appendChild(el("span", "file", name));
      const lines = p.lines.map((x) => x.line);
      d.appendChild(document.createTextNode(
        `: ${p.count} malformed line${p.count > 1 ? "s" : ""} skipped (line${lines.length > 1 ? "s" : ""} ` +
        `${lines.slice(0, 30).join(", ")}${p.count > 30 ? ", …" : ""})`));
      d.dataset.count = String(p.count);
      d.classList.add("bad-lines");
      const ul = el("ul");
      for (const x of p.lines.slice(0, 10)) ul.appendChild(el("li", null, `line ${x.line}: ${x.reason}`));
      d.appendChild(ul);
      box.appendChild(d);
      any = true;
    }
    if (p.pending_tail) {
      box.appendChild(el("div", "pending", `${name}: the last line is incomplete (being written, or cut by a crash)`));
      any = true;
    }
  }
  box.hidden = !any;
}

async function loadRun() {
  const run = await api("/api/run");
  state.run = run;
  $("run-name").textContent = shown(run.name);
  const parts = [`${run.rows} trajectories`];
  if (run.tokenizer) parts.push(`tokenizer ${run.tokenizer}`);
  const s = run.summary;
  if (s && s.eval_before && s.eval_after) parts.push(`held-out reward ${fmt(s.eval_before.reward)} → ${fmt(s.eval_after.reward)}`);
  $("run-info").textContent = shown(`${run.root} · ${parts.join(" · ")}`);
  showProblems(run);
  const envSel = document.querySelector("#filters select[name=env]");
  const termSel = document.querySelector("#filters select[name=termination]");
  fillOptions(envSel, run.envs);
  fillOptions(termSel, run.terminations);
  fillOptions($("metric-add"), run.metric_keys.filter((k) => k !== "step"));
  return run;
}

function fillOptions(select, values) {
  const keep = select.value;
  while (select.options.length > 1) select.remove(1);
  for (const v of values) {
    const o = el("option", null, v);
    o.value = v;
    select.appendChild(o);
  }
  select.value = keep;
}

// ------------------------------------------------------------------------------------------------------ curves
async function loadCurves() {
  const run = state.run;
  if (!run.files.metrics) {
    $("curves-note").textContent = "(no metrics.jsonl)";
    $("charts").replaceChildren();
    return;
  }
  if (!state.charts.length) state.charts = run.default_metrics.slice();
  const data = await api("/api/metrics", { keys: state.charts.join(",") });
  const box = $("charts");
  box.replaceChildren();
  for (const key of state.charts) {
    if (data.columns[key]) box.appendChild(chart(key, data.columns.step, data.columns[key]));
  }
  $("curves-note").textContent = `${data.columns.step.length} steps from metrics.jsonl`;
}

function chart(title, xs, ys) {
  const W = 340, H = 170, L = 52, R = 8, T = 8, B = 22;
  const pts = [];
  for (let i = 0; i < xs.length; i++) if (ys[i] !== null && ys[i] !== undefined) pts.push([xs[i], ys[i]]);
  const box = el("div", "chart");
  box.dataset.metric = title;
  const head = el("div", "title");
  head.appendChild(el("span", null, title));
  const readout = el("span", "readout", pts.length ? `last ${fmt(pts[pts.length - 1][1])}` : "no data");
  head.appendChild(readout);
  const close = el("button", "close", "×");
  close.type = "button";
  close.title = "remove this curve";
  close.addEventListener("click", () => { state.charts = state.charts.filter((k) => k !== title); loadCurves(); });
  head.appendChild(close);
  box.appendChild(head);
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  const t = svg("title");
  t.textContent = shown(title);
  s.appendChild(t);
  box.appendChild(s);
  if (!pts.length) return box;
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    s.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) }));
    const lab = svg("text", { x: L - 4, y: py(y) + 3, "text-anchor": "end" });
    lab.textContent = fmt(y, 2);
    s.appendChild(lab);
  }
  s.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  for (const x of [x0, x1]) {
    const lab = svg("text", { x: px(x), y: H - 6, "text-anchor": x === x0 ? "start" : "end" });
    lab.textContent = `step ${fmt(x, 0)}`;
    s.appendChild(lab);
  }
  const d = pts.map((p, i) => `${i ? "L" : "M"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join("");
  s.appendChild(svg("path", { class: "series", d }));
  if (pts.length <= 60) for (const p of pts) s.appendChild(svg("circle", { class: "dot", cx: px(p[0]), cy: py(p[1]), r: 1.8 }));
  const cursor = svg("line", { class: "cursor", y1: T, y2: H - B, x1: -10, x2: -10 });
  s.appendChild(cursor);
  s.addEventListener("mousemove", (ev) => {
    const r = s.getBoundingClientRect();
    const x = x0 + ((ev.clientX - r.left - L) / (W - L - R)) * (x1 - x0);
    let best = pts[0];
    for (const p of pts) if (Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
    cursor.setAttribute("x1", px(best[0]));
    cursor.setAttribute("x2", px(best[0]));
    readout.textContent = `step ${fmt(best[0], 0)}: ${fmt(best[1])}`;
  });
  return box;
}

// -------------------------------------------------------------------------------------------------------- list
function filtersFromHash() {
  const q = new URLSearchParams(location.hash.replace(/^#\/?\??/, ""));
  return q;
}

function applyFiltersToForm(q) {
  const form = $("filters");
  for (const input of form.elements) {
    if (!input.name) continue;
    if (input.type === "checkbox") input.checked = q.get(input.name) === "1";
    else input.value = q.get(input.name) || "";
  }
}

function formQuery() {
  const q = new URLSearchParams();
  for (const input of $("filters").elements) {
    if (!input.name) continue;
    if (input.type === "checkbox") { if (input.checked) q.set(input.name, "1"); }
    else if (input.value !== "") q.set(input.name, input.value);
  }
  return q;
}

async function loadList(q) {
  const page = Math.max(0, parseInt(q.get("page") || "0", 10) || 0);
  const params = Object.fromEntries(q.entries());
  delete params.page;
  params.offset = page * PAGE;
  params.limit = PAGE;
  const data = await api("/api/list", params);
  const body = document.querySelector("#list tbody");
  const frag = document.createDocumentFragment();
  for (const r of data.rows) {
    const tr = el("tr");
    tr.tabIndex = 0;
    tr.dataset.row = String(r.row);
    const cells = [r.line, r.step, r.env, r.id, r.group_id, fmt(r.reward), r.termination + (r.error && r.termination !== "error" ? " (error)" : ""),
      `${r.tokens} (${r.generated})`, r.turns, r.staleness];
    cells.forEach((c, i) => {
      const td = el("td", i === 3 || i === 4 ? "id" : null, c === null || c === undefined ? "–" : c);
      if (i === 3) td.title = shown(r.id);
      if (i === 6) td.classList.add(`term-${r.termination}`);
      tr.appendChild(td);
    });
    frag.appendChild(tr);
  }
  body.replaceChildren(frag);
  const pages = Math.max(1, Math.ceil(data.total / PAGE));
  $("page-info").textContent = `page ${page + 1} of ${pages}`;
  $("list-count").textContent = `${data.total} of ${data.indexed} shown by the filter`;
  $("prev").disabled = page === 0;
  $("next").disabled = page + 1 >= pages;
  $("prev").onclick = () => { q.set("page", String(page - 1)); location.hash = "#/?" + q.toString(); };
  $("next").onclick = () => { q.set("page", String(page + 1)); location.hash = "#/?" + q.toString(); };
  document.body.dataset.listReady = String(data.rows.length);
}

// -------------------------------------------------------------------------------------------- one trajectory
function tokenClass(v, i, mode, same) {
  const T = v.tokens;
  let c = "t";
  const m = T.mask[i];
  if (same) c += same[i] ? " same" : " chg";
  else if (mode === "mask") c += m ? " m1" : " m0";
  else if (!m) c += " m0";
  else if (mode === "version") c += ` v${((T.version[i] % 8) + 8) % 8}`;
  else if (mode === "staleness") {
    const tv = v.meta.trainer_version;
    c += tv === null || tv === undefined ? " m1" : ` s${Math.max(0, Math.min(4, tv - T.version[i]))}`;
  } else if (mode === "logprob") {
    const p = T.lp[i] === null ? null : Math.exp(T.lp[i]);
    c += p === null ? " dna" : p >= 0.9 ? " p0" : p >= 0.5 ? " p1" : p >= 0.1 ? " p2" : p >= 0.01 ? " p3" : " p4";
  } else if (mode === "delta") {
    const a = T.tlp ? T.tlp[i] : null, b = T.lp[i];
    if (a === null || b === null) c += " dna";
    else {
      const d = Math.abs(a - b);
      c += d < 0.01 ? " d0" : d < 0.05 ? " d1" : d < 0.2 ? " d2" : d < 1 ? " d3" : " d4";
    }
  }
  return c;
}

function blockHead(v, b) {
  const h = el("div", "bhead");
  h.appendChild(el("span", "role", b.roles.join(" + ")));
  if (b.names && b.names.length) h.appendChild(el("span", null, b.names.join(", ")));
  if (b.note) h.appendChild(el("span", "chip", b.note));
  if (b.kind === "assistant") {
    h.appendChild(el("span", null, `turn ${b.turn + 1}`));
    if (b.reward !== null && b.reward !== undefined) {
      h.appendChild(el("span", "chip reward " + (b.reward > 0 ? "reward-pos" : b.reward < 0 ? "reward-neg" : ""),
        `step reward ${fmt(b.reward)}`));
    }
    for (const name of b.tool_calls || []) h.appendChild(el("span", "chip toolcall", `tool call: ${name}`));
  }
  if (b.end > b.start) {
    const T = v.tokens;
    const vs = new Set();
    for (let i = b.start; i < b.end; i++) if (T.mask[i]) vs.add(T.version[i]);
    h.appendChild(el("span", null, `tokens ${b.start}–${b.end - 1}` + (vs.size ? ` · version ${[...vs].sort((x, y) => x - y).join(", ")}` : "")));
  }
  return h;
}

const FIRST_SCREEN_TOKENS = 6000;  // drawn before the view counts as open; the rest follows in ~40 ms slices
const SLICE_TOKENS = 2000;

// Draws the blocks of view v into container: every block's frame at once, its tokens (one span each) first for
// the top of the conversation, then in background slices so the page answers while a long trajectory fills in.
// Returns a promise that resolves true once every token is drawn (false if a newer render replaced this one).
function renderChat(v, mode, same, container) {
  const T = v.tokens;
  const special = new Uint8Array(T.n);
  for (const i of T.special || []) special[i] = 1;
  const tool = new Uint8Array(T.n);
  for (const [s, e] of T.tool || []) for (let i = s; i < e && i < T.n; i++) tool[i] = 1;
  const frag = document.createDocumentFragment();
  const jobs = [];
  for (const b of v.blocks) {
    const box = el("div", `block kind-${b.kind}`);
    box.appendChild(blockHead(v, b));
    if (b.end > b.start) {
      const pre = el("div", "tokens");
      for (let s = b.start; s < b.end; s += SLICE_TOKENS) jobs.push([pre, s, Math.min(b.end, s + SLICE_TOKENS)]);
      box.appendChild(pre);
    }
    if (b.text !== null && b.text !== undefined) box.appendChild(el("pre", "msgtext", b.text));
    frag.appendChild(box);
  }
  const fill = ([pre, s, e]) => {
    const part = document.createDocumentFragment();
    for (let i = s; i < e; i++) {
      const sp = document.createElement("span");
      let c = tokenClass(v, i, mode, same);
      if (special[i]) c += " sp";
      if (tool[i]) c += " tc";
      sp.className = c;
      sp.textContent = T.text ? shown(T.text[i]) : `⟨${T.ids[i]}⟩`;
      sp._i = i;
      part.appendChild(sp);
    }
    pre.appendChild(part);
  };
  let j = 0, drawn = 0;
  while (j < jobs.length && drawn < FIRST_SCREEN_TOKENS) { drawn += jobs[j][2] - jobs[j][1]; fill(jobs[j++]); }
  container._view = v;
  container.appendChild(frag);
  const ticket = {};
  container._ticket = ticket;
  return new Promise((resolve) => {
    const slice = () => {
      if (container._ticket !== ticket) return resolve(false);
      const t0 = performance.now();
      while (j < jobs.length && performance.now() - t0 < 40) fill(jobs[j++]);
      if (j < jobs.length) setTimeout(slice, 0);
      else resolve(true);
    };
    if (j < jobs.length) setTimeout(slice, 0);
    else resolve(true);
  });
}

function tipText(v, i) {
  const T = v.tokens;
  const lines = [];
  const text = T.text ? JSON.stringify(T.text[i]) : "";
  lines.push(`token ${i}  id ${T.ids[i]}  ${text}`);
  lines.push(T.mask[i] ? `generated (loss mask 1) by policy version ${T.version[i]}` : "not generated (loss mask 0)");
  const tv = v.meta.trainer_version;
  if (T.mask[i] && tv !== null && tv !== undefined) lines.push(`staleness ${tv - T.version[i]} (trainer at version ${tv})`);
  const b = T.lp[i], a = T.tlp ? T.tlp[i] : null;
  if (b !== null) lines.push(`behaviour log-prob ${fmt(b, 4)}  (p ${fmt(Math.exp(b), 4)})`);
  if (a !== null && a !== undefined) lines.push(`trainer log-prob   ${fmt(a, 4)}  (p ${fmt(Math.exp(a), 4)})`);
  if (a !== null && a !== undefined && b !== null) lines.push(`difference trainer − behaviour ${fmt(a - b, 4)}`);
  else if (!T.tlp && T.mask[i]) lines.push("trainer log-prob: not recorded for this trajectory");
  const blk = v.blocks.find((x) => i >= x.start && i < x.end);
  if (blk && blk.kind === "assistant" && blk.reward !== null && blk.reward !== undefined) lines.push(`turn ${blk.turn + 1} step reward ${fmt(blk.reward)}`);
  return lines.join("\n");
}

function installTip(container) {
  const tip = $("tip");
  container.addEventListener("mouseover", (ev) => {
    const sp = ev.target;
    if (!(sp instanceof HTMLSpanElement) || sp._i === undefined) return;
    const col = sp.closest("[data-col]") || container;
    tip.textContent = shown(tipText(col._view, sp._i));
    tip.hidden = false;
  });
  container.addEventListener("mousemove", (ev) => {
    if (tip.hidden) return;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = ev.clientY + 18 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 10 : ev.clientY + 18;
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${Math.max(0, y)}px`;
  });
  container.addEventListener("mouseleave", () => { tip.hidden = true; });
}

function legend(mode, v) {
  const box = $("legend");
  box.replaceChildren();
  const add = (cls, label) => { const s = el("span", "t " + cls, label); box.appendChild(s); };
  box.appendChild(el("span", null, "legend:"));
  add("m0", "not generated (mask 0)");
  if (mode === "version" && v) {
    const vs = [...new Set(v.tokens.version.filter((x, i) => v.tokens.mask[i]))].sort((a, b) => a - b);
    for (const x of vs.slice(0, 16)) add(`v${((x % 8) + 8) % 8}`, `version ${x}`);
  } else if (mode === "staleness") {
    for (let s = 0; s <= 4; s++) add(`s${s}`, s < 4 ? `${s} behind` : "4+ behind");
  } else if (mode === "mask") add("m1", "generated (mask 1)");
  else if (mode === "logprob") [["p0", "p ≥ 0.9"], ["p1", "≥ 0.5"], ["p2", "≥ 0.1"], ["p3", "≥ 0.01"], ["p4", "< 0.01"]].forEach(([c, l]) => add(c, l));
  else if (mode === "delta") {
    [["d0", "|Δ| < 0.01"], ["d1", "< 0.05"], ["d2", "< 0.2"], ["d3", "< 1"], ["d4", "≥ 1"], ["dna", "not recorded"]].forEach(([c, l]) => add(c, l));
  } else if (mode === "diff") { add("same", "in both"); add("chg", "differs"); }
  add("tc", "tool call");
}

function headRow(dl, label, value) {
  if (value === null || value === undefined || value === "") return;
  const d = el("div");
  d.appendChild(el("dt", null, label));
  const dd = el("dd", null, value);
  dd.title = shown(value);
  d.appendChild(dd);
  dl.appendChild(d);
}

function renderHead(v) {
  const m = v.meta, T = v.tokens;
  const box = $("traj-head");
  box.replaceChildren();
  const dl = el("dl");
  headRow(dl, "id", m.id);
  headRow(dl, "group", m.group_id);
  headRow(dl, "env", m.env_id);
  headRow(dl, "seed", m.seed);
  headRow(dl, "instance", m.instance_id);
  headRow(dl, "step", m.step);
  headRow(dl, "trainer version", m.trainer_version);
  headRow(dl, "reward", fmt(m.reward));
  headRow(dl, "step rewards", m.rewards.map((r) => fmt(r)).join(", "));
  headRow(dl, "success", m.success === null || m.success === undefined ? null : String(m.success));
  headRow(dl, "termination", m.termination);
  headRow(dl, "turns", m.num_turns);
  const gen = T.mask.reduce((a, b) => a + b, 0);
  headRow(dl, "tokens", `${T.n} (${gen} generated, prompt ${m.prompt_len ?? "–"})`);
  headRow(dl, "staleness", m.staleness);
  headRow(dl, "trainer log-probs", T.tlp ? "recorded" : "not recorded");
  for (const [k, x] of Object.entries(m.timings || {})) headRow(dl, k, fmt(x));
  headRow(dl, "line", m.line);
  box.appendChild(dl);
  for (const [label, text] of [["error", m.error], ["info", m.info], ["task", m.task]]) {
    if (!text) continue;
    const det = el("details");
    if (label === "error") det.open = true;
    det.appendChild(el("summary", null, label));
    det.appendChild(el("pre", null, text));
    box.appendChild(det);
  }
}

async function showTrajectory(row) {
  const t0 = performance.now();
  delete document.body.dataset.trajReady;
  delete document.body.dataset.trajComplete;
  const v = await api("/api/trajectory", { row });
  state.view = v;
  state.diff = null;
  renderHead(v);
  const w = $("warnings");
  w.replaceChildren(...v.warnings.map((x) => el("div", null, x)));
  const chat = $("chat");
  chat.className = "";
  chat.replaceChildren();
  chat.dataset.col = "a";
  const complete = renderChat(v, state.mode, null, chat);
  legend(state.mode, v);
  $("diff-with").value = "";
  document.body.dataset.trajReady = String(row);
  document.body.dataset.openMs = String(Math.round(performance.now() - t0));
  await fillGroup(row);
  if (await complete) document.body.dataset.trajComplete = String(row);
}

async function fillGroup(row) {
  const sel = $("diff-with");
  while (sel.options.length > 1) sel.remove(1);
  const g = await api("/api/group", { row });
  for (const r of g.rows) {
    if (r.row === row) continue;
    const o = el("option", null, `${r.id} · reward ${fmt(r.reward)} · ${r.tokens} tokens`);
    o.value = String(r.row);
    sel.appendChild(o);
  }
  sel.disabled = sel.options.length < 2;
}

async function showDiff(a, b) {
  const d = await api("/api/diff", { a, b });
  state.diff = d;
  state.view = d.a;
  renderHead(d.a);
  $("warnings").replaceChildren(...[...d.a.warnings, ...d.b.warnings].map((x) => el("div", null, x)));
  const chat = $("chat");
  chat.className = "diff";
  chat.replaceChildren();
  delete chat.dataset.col;
  const done = [];
  const note = d.first_diff === null ? "identical token streams" : `first different token: position ${d.first_diff}`;
  for (const [v, same, label] of [[d.a, d.same_a, "A"], [d.b, d.same_b, "B"]]) {
    const col = el("div", "col");
    col.dataset.col = label;
    const head = el("div", "col-head", `${label}: ${v.meta.id} · reward ${fmt(v.meta.reward)} · ${note}`);
    head.title = shown(v.meta.id);
    col.appendChild(head);
    done.push(renderChat(v, "diff", same, col));
    chat.appendChild(col);
  }
  legend("diff", d.a);
  await fillGroup(a);
  $("diff-with").value = String(b);
  await Promise.all(done);
  document.body.dataset.diffReady = `${a},${b}`;
}

// ------------------------------------------------------------------------------------------------------ router
async function route() {
  const h = location.hash || "#/";
  const tm = h.match(/^#\/t\/(\d+)$/);
  const dm = h.match(/^#\/diff\/(\d+)\/(\d+)$/);
  $("tip").hidden = true;
  try {
    setStatus("loading…");
    if (!state.run) await loadRun();
    if (tm || dm) {
      $("list-view").hidden = true;
      $("traj-view").hidden = false;
      if (tm) await showTrajectory(parseInt(tm[1], 10));
      else await showDiff(parseInt(dm[1], 10), parseInt(dm[2], 10));
    } else {
      $("traj-view").hidden = true;
      $("list-view").hidden = false;
      const q = filtersFromHash();
      applyFiltersToForm(q);
      await Promise.all([loadCurves(), state.run.files.trajectories ? loadList(q) : Promise.resolve()]);
    }
    setStatus("");
  } catch (e) {
    setStatus(`error: ${e.message}`, true);
  }
}

function init() {
  $("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = "#/?" + formQuery().toString();
  });
  $("clear-filters").addEventListener("click", () => { location.hash = "#/"; });
  $("list").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-row]");
    if (tr) location.hash = `#/t/${tr.dataset.row}`;
  });
  $("list").addEventListener("keydown", (ev) => {
    const tr = ev.target.closest("tr[data-row]");
    if (tr && ev.key === "Enter") location.hash = `#/t/${tr.dataset.row}`;
  });
  $("metric-add").addEventListener("change", (ev) => {
    const k = ev.target.value;
    if (k && !state.charts.includes(k)) { state.charts.push(k); loadCurves(); }
    ev.target.value = "";
  });
  $("color-mode").addEventListener("change", (ev) => {
    state.mode = ev.target.value;
    if (state.diff) return;
    const chat = $("chat");
    chat.replaceChildren();
    if (state.view) {
      delete document.body.dataset.modeReady;
      renderChat(state.view, state.mode, null, chat).then((ok) => { if (ok) document.body.dataset.modeReady = state.mode; });
      legend(state.mode, state.view);
    }
  });
  $("diff-with").addEventListener("change", (ev) => {
    const a = state.diff ? state.diff.a.meta.row : state.view.meta.row;
    location.hash = ev.target.value ? `#/diff/${a}/${ev.target.value}` : `#/t/${a}`;
  });
  $("reload").addEventListener("click", async () => { state.run = null; await route(); });
  installTip($("chat"));
  window.addEventListener("hashchange", route);
  route();
}

document.addEventListener("DOMContentLoaded", init);
