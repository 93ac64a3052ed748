// replay-sim dashboard: polls the admin API and draws tiers over time, per-tool stats, misses and calibration.
"use strict";

const TIERS = ["exact", "canonical", "semantic", "nearest", "live", "sandbox", "synthetic", "miss", "refused"];
const COLORS = {
  exact: "#2e7d32", canonical: "#558b2f", semantic: "#1565c0", nearest: "#ef6c00",
  live: "#6a1b9a", sandbox: "#00838f", synthetic: "#ad1457", miss: "#c62828", refused: "#616161",
};

// The admin token, when the server needs one: given once as /#token=..., kept for this tab only.
const TOKEN = (() => {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (given) {
    sessionStorage.setItem("replay-sim-token", given);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("replay-sim-token");
})();

async function api(path) {
  const response = await fetch(path, TOKEN ? { headers: { Authorization: `Bearer ${TOKEN}` } } : {});
  if (response.status === 401) throw new Error("the admin API needs a token: open this page as /#token=<token>");
  return response.json();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
  children.forEach((c) => node.append(c instanceof Node ? c : document.createTextNode(String(c))));
  return node;
}

function tierBadge(tier) {
  const badge = el("span", { class: "tier", "data-tier": tier }, tier);
  badge.style.background = COLORS[tier] || "#444";
  return badge;
}

function drawTimeline(timeline) {
  const svg = document.getElementById("timeline");
  svg.replaceChildren();
  const legend = document.getElementById("legend");
  legend.replaceChildren(...TIERS.map((t) => tierBadge(t)));
  if (!timeline.length) return;
  const width = 720, height = 160, slots = Math.max(timeline.length, 30);
  const barWidth = width / slots;
  const totals = timeline.map((b) => Object.values(b.tiers).reduce((a, n) => a + n, 0));
  const max = Math.max(1, ...totals);
  timeline.forEach((bucket, i) => {
    let y = height;
    TIERS.forEach((tier) => {
      const n = bucket.tiers[tier] || 0;
      if (!n) return;
      const h = (n / max) * (height - 4);
      y -= h;
      const rect = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      rect.setAttribute("x", (slots - timeline.length + i) * barWidth);
      rect.setAttribute("y", y);
      rect.setAttribute("width", Math.max(1, barWidth - 1));
      rect.setAttribute("height", h);
      rect.setAttribute("fill", COLORS[tier] || "#444");
      rect.setAttribute("data-tier", tier);
      const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
      title.textContent = `${new Date(bucket.t * 1000).toLocaleTimeString()} ${tier}: ${n}`;
      rect.append(title);
      svg.append(rect);
    });
  });
}

function drawTools(calls) {
  const rows = calls.map((r) => el("tr", { "data-tool": r.tool, "data-tier": r.tier },
    el("td", {}, r.server), el("td", {}, r.method), el("td", {}, r.tool), el("td", {}, tierBadge(r.tier)),
    el("td", { class: "num" }, r.count), el("td", { class: "num" }, r.p50_ms),
    el("td", { class: "num" }, r.p90_ms), el("td", { class: "num" }, r.p99_ms)));
  document.querySelector("#tools tbody").replaceChildren(...rows);
}

const EFFECT_COLORS = { none: "#2e7d32", changes: "#ef6c00", unknown: "#616161" };

function effectRow(server, tool, kind, v) {
  const badge = el("span", { class: "tier" }, v.effect);
  badge.style.background = EFFECT_COLORS[v.effect] || "#444";
  const witnesses = (v.witnesses || []).map((p) => p.join("/")).join(", ");
  const evidence = witnesses ? `${v.reason} — witnesses ${witnesses}` : v.reason;
  const attrs = { "data-tool": tool, "data-effect": v.effect };
  if (kind) attrs["data-kind"] = kind;
  return el("tr", attrs, el("td", {}, server), el("td", {}, kind ? `${tool} [${kind}]` : tool),
    el("td", {}, badge), el("td", { class: "muted" }, evidence));
}

function drawEffects(effects) {
  const rows = [];
  Object.entries(effects || {}).forEach(([server, tools]) => Object.entries(tools).forEach(([tool, v]) => {
    rows.push(effectRow(server, tool, null, v));
    // A tool learned per kind of call (SQL statement kinds): each kind's own effect and witnesses.
    Object.entries(v.kinds || {}).forEach(([kind, k]) => rows.push(effectRow(server, tool, kind, k)));
  }));
  document.querySelector("#effects tbody").replaceChildren(...rows);
}

function drawMisses(misses) {
  const items = misses.map((m) => {
    const li = el("li", { class: "miss", "data-tool": m.name },
      tierBadge(m.status), " ", el("strong", {}, `${m.server} · ${m.name}`), " ",
      el("code", {}, JSON.stringify(m.arguments)), " ",
      el("span", { class: "muted" }, new Date(m.at * 1000).toLocaleTimeString()),
      el("div", { class: "muted" }, m.reason || ""));
    if (!m.candidates.length) li.append(el("div", { class: "candidate" }, "no near miss"));
    m.candidates.forEach((c) => {
      const diffs = c.differences.map((d) =>
        `${d.field}: recorded ${JSON.stringify(d.recorded)}, requested ${JSON.stringify(d.requested)}`);
      li.append(el("div", { class: "candidate" },
        `#${c.recording} (score ${c.score.toFixed(3)})${diffs.length ? " — " + diffs.join("; ") : ""}`));
    });
    return li;
  });
  document.getElementById("misses").replaceChildren(...(items.length ? items : [el("li", {}, "no misses")]));
}

function drawCoverage(view) {
  const rows = view.tools.map((t) => el("tr", { "data-tool": t.tool },
    el("td", {}, t.server), el("td", {}, t.tool), el("td", { class: "num" }, t.recorded),
    el("td", { class: "num" }, t.replayed),
    el("td", { class: "num" }, t.hit_rate === null ? "–" : `${(100 * t.hit_rate).toFixed(1)} %`),
    el("td", {}, ...Object.entries(t.tiers).flatMap(([tier, n]) => [tierBadge(tier), ` ${n} `])),
    el("td", { class: "num" }, t.kept_misses)));
  document.querySelector("#coverage tbody").replaceChildren(...rows);
  const items = view.misses.map((m) => {
    const how = m.backfill.can ? (m.backfill.needs ? `backfill: needs ${m.backfill.needs}` : "backfill: can take it")
      : `backfill: cannot (${m.backfill.needs})`;
    const li = el("li", { class: "miss", "data-tool": m.name, "data-backfill": m.backfill.can ? "yes" : "no" },
      el("strong", {}, `${m.count}× ${m.server} · ${m.name}`), " ", el("code", {}, JSON.stringify(m.params)),
      el("div", { class: "muted" }, how), el("div", { class: "muted" }, m.reason || ""));
    m.candidates.forEach((c) => li.append(el("div", { class: "candidate" },
      `nearest #${c.recording} (score ${Number(c.score).toFixed(3)})`)));
    return li;
  });
  document.getElementById("missed").replaceChildren(...(items.length ? items : [el("li", {}, "no kept misses")]));
}

function svgNode(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  return node;
}

// The reliability diagram: per confidence bin, a bar as high as the share of candidates that were
// right, a dot at (mean confidence, accuracy) sized by the bin's examples; the diagonal is perfect.
function drawCalibration(view) {
  const r = view.reliability;
  const point = view.min_confidence === null ? "strict tiers (no --min-confidence)" : `--min-confidence ${view.min_confidence}`;
  const tools = Object.entries(view.per_tool).map(([t, p]) => `${t} ${p}`).join(", ");
  document.getElementById("calibration-summary").textContent =
    `model ${view.model} from ${view.examples} ` +
    (view.model === "population" ? "answers of real servers (no index build yet)" : "leave-one-out examples") +
    ` (${view.positives} right)` +
    (view.update ? ` — updated at ${view.update.where}: ${view.update.kept} kept, ${view.update.formed} recordings formed` : "") +
    " · " +
    `operating point ${point}` + (tools ? ` · per tool ${tools}` : "") +
    (r ? ` · ECE ${r.ece.toFixed(3)} over ${r.examples} examples, validated ${r.validated} (${r.folds} folds)`
       : " · no reliability measured (the prior, or a model learned before it was kept: run replay-sim index build)") +
    (view.population ? ` · fitted toward ${view.population.examples} answers of ${view.population.folds} real servers` +
       ` (ECE ${view.population.ece.toFixed(3)}, validated ${view.population.validated})` : "");
  const svg = document.getElementById("reliability");
  const size = 240, pad = 24, span = size - 2 * pad;
  const x = (c) => pad + c * span, y = (a) => size - pad - a * span;
  svg.replaceChildren(
    svgNode("rect", { x: pad, y: pad, width: span, height: span, fill: "none", stroke: "#c5cad6" }),
    svgNode("line", { x1: x(0), y1: y(0), x2: x(1), y2: y(1), stroke: "#9aa1b1", "stroke-dasharray": "4 3" }));
  const bins = r ? r.bins : [];
  const most = Math.max(1, ...bins.map((b) => b[2]));
  bins.forEach(([low, high, n, mean, accuracy]) => {
    const bar = svgNode("rect", { x: x(low) + 1, y: y(accuracy), width: span / 10 - 2, height: y(0) - y(accuracy),
      fill: "#1565c0", "fill-opacity": 0.25, "data-bin": low.toFixed(1) });
    const dot = svgNode("circle", { cx: x(mean), cy: y(accuracy), r: 2 + 5 * Math.sqrt(n / most), fill: "#1565c0" });
    const title = svgNode("title", {});
    title.textContent = `${low.toFixed(1)}-${high.toFixed(1)}: ${n} examples, mean confidence ${mean.toFixed(3)}, accuracy ${accuracy.toFixed(3)}`;
    dot.append(title);
    svg.append(bar, dot);
  });
  [["0", x(0), size - 8], ["1", x(1), size - 8], ["confidence", size / 2, size - 8]].forEach(([t, cx, cy]) => {
    const label = svgNode("text", { x: cx, y: cy, "font-size": 10, "text-anchor": "middle", fill: "#6b7385" });
    label.textContent = t;
    svg.append(label);
  });
  const axis = svgNode("text", { x: 10, y: size / 2, "font-size": 10, "text-anchor": "middle", fill: "#6b7385",
    transform: `rotate(-90 10 ${size / 2})` });
  axis.textContent = "accuracy";
  svg.append(axis);
  const rows = bins.map(([low, high, n, mean, accuracy]) => el("tr", { "data-bin": low.toFixed(1) },
    el("td", {}, `${low.toFixed(1)}–${high.toFixed(1)}`), el("td", { class: "num" }, n),
    el("td", { class: "num" }, mean.toFixed(3)), el("td", { class: "num" }, accuracy.toFixed(3))));
  document.querySelector("#reliability-bins tbody").replaceChildren(...rows);
}

async function refresh() {
  try {
    const [stats, misses, coverage, calibration] = await Promise.all([
      api("/api/stats"),
      api("/api/misses?limit=30"),
      api("/api/coverage?limit=20"),
      api("/api/calibration"),
    ]);
    const total = stats.calls.reduce((a, r) => a + r.count, 0);
    document.getElementById("summary").textContent =
      `${total} calls · miss policy ${stats.miss_policy}` + (stats.snapshot ? ` · snapshot ${stats.snapshot}` : "");
    const pool = stats.sandbox ? Object.values(stats.sandbox.pool || {}) : [];
    const unconfined = pool.some((server) => server.confined === false);
    document.getElementById("unconfined").hidden = !unconfined;
    drawTimeline(stats.timeline);
    drawTools(stats.calls);
    drawEffects(stats.effects);
    drawMisses(misses);
    drawCoverage(coverage);
    drawCalibration(calibration);
    document.body.dataset.ready = "1";
  } catch (err) {
    document.getElementById("summary").textContent = `admin API unreachable: ${err}`;
  }
}

refresh();
setInterval(refresh, 2000);
