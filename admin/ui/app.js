// Ferry status page: reads /status and /connections every 2 s and renders
// them. Plain DOM; every value is set as text (never parsed as HTML).
"use strict";

const REFRESH_MS = 2000;
// Lag below both of these is "small" on the mirror grid.
const SMALL_LAG_RECORDS = 1000;
const SMALL_LAG_SECONDS = 10;
// The admin token, once typed in, is kept for this tab only: with a token
// configured, the connections' remote addresses need it.
const TOKEN_KEY = "ferry-admin-token";

// el builds an element: attrs are set as properties (className, title, …),
// children are nodes or strings (added as text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "dataset") {
      Object.assign(e.dataset, v);
    } else {
      e[k] = v;
    }
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return e;
}

function $(id) { return document.getElementById(id); }

// fillRows replaces a table's body with rows, or one row saying empty.
function fillRows(tableId, rows, empty) {
  const body = $(tableId).tBodies[0];
  const cols = $(tableId).tHead.rows[0].cells.length;
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colSpan: cols, className: "empty" }, empty))]));
}

function td(text, cls) { return el("td", cls ? { className: cls } : {}, text === undefined || text === null ? "" : String(text)); }

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
}

function time(s) {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}

function duration(sec) {
  sec = Math.round(sec);
  const d = Math.floor(sec / 86400), h = Math.floor(sec % 86400 / 3600), m = Math.floor(sec % 3600 / 60), s = sec % 60;
  return d ? d + "d " + h + "h" : h ? h + "h " + m + "m" : m ? m + "m " + s + "s" : s + "s";
}

function renderHeader(st) {
  $("cluster-id").textContent = st.node.cluster_id ? "· " + st.node.cluster_id : "";
  $("member").textContent = "member " + st.node.id + " · " + st.node.advertised + " · version " + st.version +
    " · up " + duration(st.uptime_seconds);
  document.title = "Ferry " + (st.node.cluster_id || "") + " · " + st.routing.active;
}

function renderRouting(st) {
  const r = st.routing;
  const box = $("routing");
  box.classList.toggle("not-serving", r.phase !== "serving");
  const item = (label, value, cls, id) => el("div", {}, el("span", { className: "label" }, label),
    el("span", Object.assign({ className: "value" + (cls ? " " + cls : "") }, id ? { id: id } : {}), value));
  box.replaceChildren(
    item("Active cluster", r.active, "", "active-cluster"),
    item("Phase", r.phase, r.phase === "serving" ? "ok" : "warn", "phase"),
    item("Generation", String(r.generation)),
    item("Ready", st.ready ? "ready" : "not ready: " + (st.not_ready || ""), st.ready ? "ok" : "bad"),
  );
  const f = st.failover;
  if (f) {
    // Automatic failover: paused, blocked, switching, or the count
    // towards it; the reason is the deciding member's.
    let text = "automatic, after " + f.after, cls = "ok";
    if (r.failover_paused) {
      text = "paused" + (r.failover_paused.reason ? ": " + r.failover_paused.reason : "");
      cls = "warn";
    }
    const v = f.verdict;
    if (v && (v.blocked || v.act)) {
      text += " · " + v.reason;
      cls = "bad";
    } else if (f.view && f.view.down_ms > 0) {
      text += " · active unreachable for " + duration(f.view.down_ms / 1000);
      cls = "warn";
    }
    box.appendChild(item("Failover", text, cls, "failover"));
  }
}

function renderClusters(st) {
  fillRows("clusters", st.clusters.map(c => el("tr", {},
    td(c.name), td((c.bootstrap || []).join(", ")), td(c.active ? "active" : ""),
    td(c.reachable ? "reachable" : "unreachable", c.reachable ? "ok" : "bad"), td(c.error))), "no clusters");
}

// renderSwitches lists the last switch and the history before it, newest
// first; both come from the routing state every member shares.
function renderSwitches(st) {
  const last = st.routing.last_switch;
  const switches = (last ? [last] : []).concat(st.routing.history || []);
  fillRows("switches", switches.map(s => {
    const outcome = s.outcome || "in progress";
    const steps = (s.steps || []).map(x => x.step + " " + x.took).join(", ");
    // The history counts lost ranges; the last switch lists them.
    const lost = s.lost_ranges ? s.lost_ranges + " ranges" :
      (s.lost || []).map(l => l.topic + "[" + l.partition + "] " + l.from + "–" + l.to).join(", ");
    return el("tr", {}, td(time(s.started)), td(s.mode), td(s.from + " → " + s.to),
      td(outcome, outcome === "switched" ? "ok" : (s.outcome ? "bad" : "warn")), td(s.duration), td(steps),
      td(lost, lost ? "bad" : ""));
  }), "no switch yet");
}

function renderMembers(st) {
  let rows;
  if (st.members && st.members.length) {
    rows = st.members.map(m => el("tr", {},
      td(m.node_id + (m.self ? " (this member)" : "")),
      td(m.state, m.state === "alive" ? "ok" : "bad"),
      td(m.host + ":" + (m.ports || []).join(",")), td(m.gossip), td(m.admin), td(m.version),
      td(m.generation + (m.gossip_generation !== m.generation ? " (gossip " + m.gossip_generation + ")" : ""), "num"),
      td(m.connections < 0 ? "?" : m.connections, "num"), td(m.mirror_partitions < 0 ? "?" : m.mirror_partitions, "num")));
  } else {
    // Not in a fleet: the brokers clients are given.
    rows = st.fleet.map(b => el("tr", {},
      td(b.node_id + (b.node_id === st.node.id ? " (this member)" : "")), td(""),
      td(b.host + ":" + b.port), td(""), td(""), td(""), td(st.routing.generation, "num"), td(""), td("")));
  }
  fillRows("members", rows, "no members");
}

// lagClass is a partition's color on the grid.
function lagClass(p) {
  switch (p.state) {
    case "halted": return "halted";
    case "stopped": return "stopped";
    case "starting": return "starting";
  }
  if (p.lag_records <= 0 && p.lag_seconds <= 0) return "lag-zero";
  if (p.lag_records < SMALL_LAG_RECORDS && p.lag_seconds < SMALL_LAG_SECONDS) return "lag-small";
  return "lag-large";
}

function renderMirror(st) {
  const m = st.mirror;
  const s = m.summary;
  const summary = $("mirror-summary");
  if (!m.enabled) {
    summary.replaceChildren(el("span", { className: "empty" }, "mirror disabled"));
  } else {
    summary.replaceChildren(
      el("span", { className: m.running ? "ok" : "warn" }, m.running ? "running " + m.source + " → " + m.target : "not running"),
      " · " + s.partitions + " partitions: " + s.caught_up + " caught up, " + s.mirroring + " mirroring, " +
      s.starting + " starting, " + s.stopped + " stopped, ",
      el("span", { className: s.halted ? "bad" : "" }, s.halted + " halted"),
      " · max lag " + s.max_lag_records + " records, " + s.max_lag_seconds.toFixed(1) + " s");
  }
  const topics = new Map();
  for (const p of m.partitions) {
    if (!topics.has(p.topic)) topics.set(p.topic, []);
    topics.get(p.topic).push(p);
  }
  $("mirror-grid").replaceChildren(...[...topics].map(([topic, parts]) => el("div", { className: "topic" },
    el("div", { className: "topic-name" }, topic + " (" + parts.length + ")"),
    el("div", { className: "cells" }, ...parts.map(p => el("span", {
      className: "cell " + lagClass(p),
      title: topic + "[" + p.partition + "] " + p.state + " · lag " + p.lag_records + " records, " +
        p.lag_seconds.toFixed(1) + " s · owner " + p.owner + (p.halt_reason ? " · " + p.halt_reason : ""),
      dataset: { topic: topic, partition: String(p.partition), state: p.state },
    }, String(p.partition)))))));
  fillRows("halted", m.partitions.filter(p => p.state === "halted").map(p => el("tr", { className: "halted-row" },
    td(p.topic + "[" + p.partition + "]"), td(p.owner, "num"), td(p.halt_reason, "bad"), td(p.error),
    td(p.mirrored_offset, "num"), td(p.source_end, "num"))), "no halted partition");
}

function renderConnections(cz) {
  if (!cz) {
    $("connections-summary").textContent = "this member does not report its connections";
    fillRows("connections", [], "not reported");
    return;
  }
  if (cz.error) {
    $("connections-summary").textContent = cz.error;
    fillRows("connections", [], "the admin token was refused");
    return;
  }
  $("connections-summary").textContent = cz.open + " open" +
    (cz.connections.length ? "; the " + cz.connections.length + " sending the most bytes:" : "") +
    (cz.redacted ? " (remote addresses hidden: enter the admin token above)" : "");
  fillRows("connections", cz.connections.map(c => el("tr", {},
    td(c.client_id), td([c.software_name, c.software_version].filter(Boolean).join(" ")), td(c.remote),
    td(c.lane, "num"), td(c.cluster), td(bytes(c.bytes_in), "num"), td(bytes(c.bytes_out), "num"),
    td(c.requests_total, "num"), td(c.errors_total, c.errors_total ? "num bad" : "num"),
    td(c.latency_samples ? c.latency_p99_ms.toFixed(1) + " ms" : "", "num"))), "no client connected");
}

// getJSON reads path, with the token when one was typed in and
// withToken: /status is read without it (the page shows nothing of it
// that needs the token), so a refused token never blanks the page.
async function getJSON(path, withToken = true) {
  const token = withToken ? sessionStorage.getItem(TOKEN_KEY) : null;
  const r = await fetch(path, { cache: "no-store", headers: token ? { Authorization: "Bearer " + token } : {} });
  if (!r.ok) {
    let msg = "";
    try { msg = (await r.json()).message || ""; } catch (e) { /* not JSON */ }
    const err = new Error(path + ": " + r.status + (msg ? " " + msg : ""));
    err.status = r.status;
    throw err;
  }
  return r.json();
}

$("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
$("token").addEventListener("change", e => {
  const v = e.target.value.trim();
  if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
});

async function refresh() {
  try {
    const [st, cz] = await Promise.all([
      getJSON("status", false),
      getJSON("connections?sort=bytes_out&limit=10").catch(e => {
        if (e.status === 404) return null;
        if (e.status === 401 && sessionStorage.getItem(TOKEN_KEY)) {
          // Refused: stop sending it (each try counts against this address).
          sessionStorage.removeItem(TOKEN_KEY);
          $("token").value = "";
        }
        if (e.status === 401 || e.status === 429) return { error: e.message }; // the rest still shows
        throw e;
      }),
    ]);
    renderHeader(st);
    renderRouting(st);
    renderClusters(st);
    renderSwitches(st);
    renderMembers(st);
    renderMirror(st);
    renderConnections(cz);
    $("refresh").textContent = "updated " + new Date().toLocaleTimeString() + " · every " + REFRESH_MS / 1000 + " s";
    $("refresh").className = "muted";
  } catch (e) {
    $("refresh").textContent = "refresh failed: " + e.message;
    $("refresh").className = "bad";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
