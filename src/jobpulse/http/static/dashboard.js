// jobpulse dashboard: a row per job, followed by EventSource, polled with Backoff when SSE fails.
// Static, no build step. Every URL is relative, so the app can be mounted under any prefix.
// A browser opens at most 6 connections per host (HTTP/1.1), so only MAX_FOLLOWED jobs (and the
// one opened in the detail view) are followed live; the others refresh with the job list.
// The operator token (jobpulse serve --token) comes from the URL fragment (#token=..., which
// browsers never send to the server nor log) or the detail view's form; it is kept in this tab's
// sessionStorage, removed from the address bar, sent only on cancel requests, never logged.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const LIST_EVERY_MS = 1000 * Number(params.get("refresh") || 2);
  const TRANSPORT = params.get("transport") === "poll" ? "poll" : "sse";
  const SSE_FAILURES = 2; // consecutive EventSource errors before switching to polling
  const MAX_FOLLOWED = 4; // jobs followed live at once (EventSource or polling), beside the detail
  const MAX_TIMELINE = 500; // events kept in the detail view
  const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED", "LOST"]);
  const KINDS = ["start", "stage", "beat", "checkpoint", "cancel", "end", "stale", "snapshot"];
  const base = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
  const tbody = document.querySelector("#jobs tbody");
  const jobs = new Map();
  const kinds = new Set();
  const filter = { kind: params.get("kind") || "*", state: params.get("state") || "*" };
  const $ = (id) => document.getElementById(id);
  let detail = null; // { id, es, events: [] } of the job shown in the detail view
  let listsApplied = 0; // job list responses applied (body[data-lists]: tests wait on it)
  const TOKEN_KEY = "jobpulse-token:" + base;
  const ENDED_KEY = "jobpulse-ended:" + base;
  const MAX_ENDED = 200; // ended jobs remembered by this tab, shown again after a reload

  function store(key, value) {
    try { if (value === null) sessionStorage.removeItem(key); else sessionStorage.setItem(key, value); } catch (_) { /* storage off */ }
  }
  function stored(key) {
    try { return sessionStorage.getItem(key); } catch (_) { return null; }
  }
  (function takeTokenFromFragment() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (!m) return;
    store(TOKEN_KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search); // out of the address bar and history
  })();
  const authHeaders = () => { const t = stored(TOKEN_KEY); return t ? { Authorization: "Bearer " + t } : {}; };

  // The documented polling schedule (jobpulse.Backoff): 0.5 s growing x1.5 up to 5 s, +-10 % jitter.
  class Backoff {
    constructor(start = 0.5, cap = 5.0, factor = 1.5, jitter = 0.1) {
      Object.assign(this, { start, cap, factor, jitter });
      this.base = start;
    }
    next() {
      const base = this.base;
      this.base = Math.min(base * this.factor, this.cap);
      const spread = 1 + this.jitter * (2 * Math.random() - 1);
      return Math.min(base * spread, this.cap);
    }
    reset() { this.base = this.start; }
  }

  const url = (id, suffix = "") => base + "jobs/" + encodeURIComponent(id) + suffix;

  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.max(0, s);
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 60) return Math.round(s) + " s";
    const m = Math.floor(s / 60), r = Math.round(s % 60);
    if (m < 60) return m + "m " + String(r).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }
  const fmtRate = (r) => (r === null || r === undefined ? "–" : (r >= 100 ? r.toFixed(0) : r.toFixed(1)) + "/s");
  const fmtBytes = (b) => (b === null || b === undefined ? "–" : (b / 1048576).toFixed(1) + " MiB");

  function row(job) {
    if (job.tr) return job.tr;
    const tr = document.createElement("tr");
    tr.dataset.job = job.id;
    const cell = (cls) => { const td = document.createElement("td"); td.className = cls; tr.appendChild(td); return td; };
    cell("job").textContent = job.id;
    cell("kind");
    const state = document.createElement("span");
    state.className = "state";
    cell("state-cell").appendChild(state);
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.setAttribute("role", "progressbar");
    bar.setAttribute("aria-valuemin", "0");
    bar.setAttribute("aria-valuemax", "100");
    const fill = document.createElement("div");
    fill.className = "fill";
    const label = document.createElement("span");
    label.className = "label";
    bar.append(fill, label);
    cell("progress").appendChild(bar);
    for (const name of ["stage", "rate num", "eta num", "memory num", "heartbeat num", "still num"]) cell(name);
    tbody.appendChild(tr);
    job.tr = tr;
    return tr;
  }

  function render(job) {
    const tr = row(job);
    const s = job.status;
    tr.dataset.state = s.state;
    tr.dataset.transport = job.transport;
    tr.classList.toggle("stale", s.state === "STALE");
    tr.classList.toggle("ended", TERMINAL.has(s.state));
    const state = tr.querySelector(".state");
    state.textContent = s.state;
    state.className = "state state-" + s.state;
    let pct = null;
    if (s.total > 0 && s.done !== null && s.done !== undefined) pct = Math.min(100, (100 * s.done) / s.total);
    else if (s.state === "COMPLETED") pct = 100;
    const bar = tr.querySelector(".bar");
    bar.setAttribute("aria-valuenow", pct === null ? "" : pct.toFixed(1));
    tr.querySelector(".fill").style.width = (pct === null ? 0 : pct) + "%";
    const count = s.done === null || s.done === undefined ? "" : s.done + (s.total ? " / " + s.total : "");
    const label = tr.querySelector(".label");
    if (pct === null) label.textContent = count;
    else {
      const main = document.createElement("span");
      main.textContent = pct.toFixed(pct === 100 ? 0 : 1) + " %";
      const extra = document.createElement("span");
      extra.className = "count"; // hidden on a narrow screen
      extra.textContent = " (" + count + ")";
      label.replaceChildren(main, extra);
    }
    tr.querySelector(".stage").textContent = s.stage || "–";
    const moving = s.state === "RUNNING"; // a STALE job's rate and ETA were its dead worker's
    tr.querySelector(".rate").textContent = moving ? fmtRate(s.rate) : "–";
    tr.querySelector(".eta").textContent = moving ? fmtDuration(s.eta) : "–";
    tr.querySelector(".memory").textContent = fmtBytes(s.rss_bytes);
    tr.querySelector(".kind").textContent = s.kind || "–";
    if (s.kind !== undefined && !kinds.has(s.kind)) addKind(s.kind);
    tr.hidden = !shown(job);
    if (TERMINAL.has(s.state)) remember(job.id);
    renderAge(job);
    summary();
    if (detail && detail.id === job.id) renderDetail(job);
  }

  // -- filters --

  function shown(job) {
    const s = job.status;
    if (filter.kind !== "*" && (s.kind || "") !== filter.kind) return false;
    if (filter.state === "*") return true;
    if (filter.state === "ended") return TERMINAL.has(s.state);
    return s.state === filter.state;
  }

  function addKind(kind) {
    kinds.add(kind);
    const select = $("kind-filter");
    const option = document.createElement("option");
    option.value = kind;
    option.textContent = kind || "(no kind)";
    const after = [...select.options].slice(1).find((o) => o.value > kind);
    select.insertBefore(option, after || null);
    if (filter.kind === kind) select.value = kind;
  }

  function applyFilters() {
    for (const job of jobs.values()) if (job.tr) job.tr.hidden = !shown(job);
    summary();
  }

  $("kind-filter").addEventListener("change", (e) => { filter.kind = e.target.value; applyFilters(); });
  $("state-filter").addEventListener("change", (e) => { filter.state = e.target.value; applyFilters(); });
  $("state-filter").value = filter.state;

  function renderAge(job) {
    if (!job.tr) return;
    const td = job.tr.querySelector(".heartbeat");
    const elapsed = (at) => (performance.now() - at) / 1000;
    // "Alive but not advancing": how long done has stood still, while RUNNING only (a STALE
    // job's worker is gone; an ended job has nothing left to advance).
    const still = job.tr.querySelector(".still");
    if (job.stillBase === null || job.status.state !== "RUNNING") still.textContent = "–";
    else still.textContent = fmtDuration(job.stillBase + elapsed(job.stillAt));
    if (job.ageBase === null || TERMINAL.has(job.status.state)) { td.textContent = "–"; return; }
    td.textContent = fmtDuration(job.ageBase + elapsed(job.ageAt)) + " ago";
  }

  function summary() {
    const counts = {};
    for (const job of jobs.values()) counts[job.status.state] = (counts[job.status.state] || 0) + 1;
    const parts = Object.entries(counts).map(([k, v]) => v + " " + k.toLowerCase());
    let visible = 0;
    for (const job of jobs.values()) if (job.tr && !job.tr.hidden) visible += 1;
    const showing = visible < jobs.size ? " · showing " + visible : "";
    document.getElementById("summary").textContent = (parts.length ? parts.join(", ") : "no jobs") + showing;
    document.getElementById("empty").hidden = jobs.size > 0;
  }

  // Is status s older than cur? Versions are (fence, seq); a dead worker's seq stands still, so
  // two reads of one version (RUNNING, then STALE once its liveness key expired) are ordered by
  // the server's clock at the read (server_ms; a synthetic stale event's ts).
  function older(s, cur) {
    if (!cur || cur.seq === undefined || cur.seq === null || s.fence !== cur.fence) return false;
    if (s.seq !== cur.seq) return s.seq < cur.seq;
    return typeof s.server_ms === "number" && typeof cur.server_ms === "number" && s.server_ms < cur.server_ms;
  }

  // A full status (GET /jobs or GET /jobs/{id}) replaces what we know, unless it is older.
  function applyStatus(job, s) {
    const cur = job.status;
    if (older(s, cur)) return;
    job.status = Object.assign({}, cur || {}, s);
    if (s.heartbeat_age !== null && s.heartbeat_age !== undefined) {
      job.ageBase = s.heartbeat_age;
      job.ageAt = performance.now();
    }
    if (s.progress_age !== null && s.progress_age !== undefined) {
      job.stillBase = s.progress_age;
      job.stillAt = performance.now();
    }
    render(job);
  }

  // An event carries status, stage, done, total, seq, fence, ts.
  function applyEvent(job, kind, ev) {
    if (kind === "snapshot") { applyStatus(job, ev); return; }
    const s = job.status;
    if (!ev.synthetic && ev.seq !== null && s.seq !== null && s.seq !== undefined && ev.fence === s.fence && ev.seq < s.seq) return;
    const moved = ev.done !== null && ev.done !== undefined && ev.done !== s.done;
    if (moved && !ev.synthetic && ev.ts) { // done moved at the event's time
      job.stillBase = Math.max(0, Date.now() / 1000 - ev.ts);
      job.stillAt = performance.now();
    }
    for (const key of ["stage", "done", "total", "seq", "fence"]) if (ev[key] !== null && ev[key] !== undefined) s[key] = ev[key];
    if (ev.status) s.state = ev.status;
    if (ev.synthetic && ev.ts) s.server_ms = Math.max(s.server_ms || 0, Math.round(ev.ts * 1000)); // the verdict's time
    if (!ev.synthetic && ev.ts) {
      job.ageBase = Math.max(0, Date.now() / 1000 - ev.ts);
      job.ageAt = performance.now();
    }
    render(job);
  }

  // Only a RUNNING job is followed: a STALE one is re-followed when the list shows it RUNNING
  // again (a new attempt), a finished one never.
  function follow(job) {
    if (job.following || job.status.state !== "RUNNING") return;
    let followed = 0;
    for (const other of jobs.values()) if (other.following) followed += 1;
    if (followed >= MAX_FOLLOWED) {
      if (job.tr) job.tr.dataset.transport = job.transport = "list";
      return;
    }
    job.following = true;
    if (TRANSPORT === "poll" || typeof EventSource === "undefined") poll(job);
    else stream(job);
  }

  function stream(job) {
    job.transport = "sse";
    if (job.tr) job.tr.dataset.transport = "sse";
    const es = new EventSource(url(job.id, "/events"));
    job.es = es;
    let failures = 0;
    const onEvent = (e) => {
      failures = 0;
      let data;
      try { data = JSON.parse(e.data); } catch (_) { return; }
      applyEvent(job, e.type, data);
      if (e.type === "end" || e.type === "stale") {
        es.close();
        job.es = null;
        job.following = false;
        refreshOne(job); // the final snapshot: rate, memory, error
      }
    };
    for (const kind of KINDS) es.addEventListener(kind, onEvent);
    es.addEventListener("fault", () => { failures = SSE_FAILURES; fallback(); });
    es.onerror = () => {
      failures += 1;
      if (es.readyState === EventSource.CLOSED || failures >= SSE_FAILURES) fallback();
    };
    function fallback() {
      if (job.es !== es) return;
      es.close();
      job.es = null;
      poll(job);
    }
  }

  async function refreshOne(job) {
    try {
      const r = await fetch(url(job.id), { cache: "no-store" });
      if (r.ok) applyStatus(job, await r.json());
      else if (r.status === 404) forget(job); // expired after its retention
    } catch (_) { /* the list refresh will try again */ }
  }

  // Polling with the documented Backoff: reset whenever the job advanced, grow while it did not.
  function poll(job) {
    job.transport = "poll";
    render(job);
    const backoff = new Backoff();
    const tick = async () => {
      let changed = false;
      try {
        const headers = job.etag ? { "If-None-Match": job.etag } : {};
        const r = await fetch(url(job.id), { headers, cache: "no-store" });
        if (r.status === 200) {
          job.etag = r.headers.get("ETag");
          const s = await r.json();
          changed = s.done !== job.status.done || s.state !== job.status.state;
          applyStatus(job, s);
        } else if (r.status === 404) {
          forget(job);
          return;
        }
        setError("");
      } catch (err) {
        setError("status unavailable, retrying");
      }
      if (TERMINAL.has(job.status.state)) { job.following = false; return; }
      if (changed) backoff.reset();
      job.timer = setTimeout(tick, 1000 * backoff.next());
    };
    tick();
  }

  // Ended jobs leave the running-jobs index (GET /jobs): this tab remembers their ids, so a
  // reload shows them again while the server keeps them (then GET /jobs/{id} answers 404).
  function remember(id) {
    const ids = (stored(ENDED_KEY) || "").split("\n").filter((x) => x && x !== id);
    ids.push(id);
    store(ENDED_KEY, ids.slice(-MAX_ENDED).join("\n"));
  }

  async function restoreEnded() {
    for (const id of (stored(ENDED_KEY) || "").split("\n")) {
      if (!id || jobs.has(id)) continue;
      try {
        const r = await fetch(url(id), { cache: "no-store" });
        if (r.status === 404) { store(ENDED_KEY, (stored(ENDED_KEY) || "").split("\n").filter((x) => x !== id).join("\n")); continue; }
        if (!r.ok) continue;
        const s = await r.json();
        if (jobs.has(id)) continue; // the list got it first
        const job = newJob(id);
        applyStatus(job, s);
        follow(job);
      } catch (_) { /* shown again at the next reload */ }
    }
  }

  function newJob(id) {
    const job = { id, status: null, ageBase: null, ageAt: 0, stillBase: null, stillAt: 0, transport: "list", following: false, es: null, etag: null };
    jobs.set(id, job);
    return job;
  }

  function forget(job) {
    const ids = (stored(ENDED_KEY) || "").split("\n").filter((x) => x && x !== job.id);
    store(ENDED_KEY, ids.join("\n"));
    if (detail && detail.id === job.id) closeDetail();
    if (job.es) job.es.close();
    clearTimeout(job.timer);
    if (job.tr) job.tr.remove();
    jobs.delete(job.id);
    summary();
  }

  function setError(text) { document.getElementById("error").textContent = text; }

  async function refreshList() {
    try {
      const r = await fetch(base + "jobs", { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const body = await r.json();
      const listed = new Set(body.jobs.map((s) => s.job_id));
      for (const job of jobs.values()) {
        // left the index (ended, or claimed by a sweeper) while nobody followed it: read it once
        if (!listed.has(job.id) && !job.following && !TERMINAL.has(job.status.state)) refreshOne(job);
      }
      for (const s of body.jobs) {
        let job = jobs.get(s.job_id);
        if (!job) job = newJob(s.job_id);
        applyStatus(job, s);
        follow(job);
      }
      setError("");
    } catch (err) {
      setError("job list unavailable, retrying");
    }
    summary();
    document.body.dataset.lists = String(++listsApplied);
    setTimeout(refreshList, LIST_EVERY_MS);
  }

  // -- the detail view: fields, event timeline, rate sparkline, cancel --

  tbody.addEventListener("click", (e) => {
    const tr = e.target.closest("tr[data-job]");
    if (tr && jobs.has(tr.dataset.job)) openDetail(jobs.get(tr.dataset.job));
  });
  $("detail-close").addEventListener("click", () => closeDetail());
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDetail(); });

  const FIELDS = [
    ["state", "state"], ["kind", "kind"], ["stage", "stage"], ["done", "done"], ["total", "total"],
    ["rate", "rate"], ["eta", "ETA"], ["attempt", "attempt"], ["fence", "fence"], ["worker", "worker"],
    ["rss_bytes", "memory"], ["cpu_seconds", "CPU"], ["loop_lag", "loop lag"],
    ["heartbeat_age", "heartbeat age"], ["progress_age", "progress age"], ["error", "error"], ["meta", "meta"],
  ];

  const HELP = {
    fence: "A number that grows with each new attempt of this job id (it orders attempts; writes of an older attempt are refused). Not a count.",
    attempt: "1 for the first run; a sweeper's claim and a retry start the next.",
    heartbeat_age: "Time since the worker's last heartbeat.",
    progress_age: "Time since 'done' last moved.",
  };

  function fieldText(name, v) {
    if (v === null || v === undefined || v === "") return "–";
    if (name === "rate") return fmtRate(v);
    if (name === "eta" || name === "heartbeat_age" || name === "progress_age" || name === "cpu_seconds") return fmtDuration(v);
    if (name === "loop_lag") return (1000 * v).toFixed(1) + " ms";
    if (name === "rss_bytes") return fmtBytes(v);
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function renderDetail(job) {
    const s = job.status;
    const dl = $("detail-fields");
    dl.replaceChildren();
    for (const [name, label] of FIELDS) {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.dataset.field = name;
      const moving = s.state === "RUNNING";
      dd.textContent = !moving && (name === "rate" || name === "eta") ? "–" : fieldText(name, s[name]);
      if (HELP[name]) {
        dt.title = HELP[name];
        dt.classList.add("help");
        const note = document.createElement("small");
        note.textContent = name === "fence" ? " orders attempts" : "";
        if (note.textContent) dd.appendChild(note);
      }
      dl.append(dt, dd);
    }
    const moving = s.state === "RUNNING";
    $("rate-now").textContent = !moving || s.rate === null || s.rate === undefined ? "" : "(now " + fmtRate(s.rate) + ")";
    $("detail").dataset.state = s.state;
    // Only a RUNNING job can be cancelled: a STALE one has no worker left to stop.
    if (!moving) { $("cancel").hidden = true; $("token-form").hidden = true; }
    $("stale-note").hidden = s.state !== "STALE";
  }

  function openDetail(job) {
    closeDetail();
    detail = { id: job.id, es: null, events: [] };
    if (job.tr) job.tr.classList.add("selected");
    $("detail-title").textContent = job.id;
    $("timeline").replaceChildren();
    $("cancel").hidden = true;
    $("cancel").disabled = false;
    $("cancel-result").textContent = "";
    $("detail").hidden = false;
    $("detail").dataset.job = job.id;
    renderDetail(job);
    mayCancel(detail);
    const es = new EventSource(url(job.id, "/events"));
    detail.es = es;
    const mine = detail;
    const onEvent = (e) => {
      if (detail !== mine) return;
      let data;
      try { data = JSON.parse(e.data); } catch (_) { return; }
      if (e.type !== "snapshot") addEvent(e.type, data);
      if (e.type === "end" || e.type === "stale") { es.close(); refreshOne(job); }
    };
    for (const kind of KINDS) es.addEventListener(kind, onEvent);
    es.addEventListener("fault", () => es.close());
  }

  function closeDetail() {
    if (!detail) return;
    if (detail.es) detail.es.close();
    const job = jobs.get(detail.id);
    if (job && job.tr) job.tr.classList.remove("selected");
    detail = null;
    $("detail").hidden = true;
  }

  const running = (id) => (jobs.get(id) || { status: {} }).status.state === "RUNNING";

  // The button shows when the server would accept the cancel (a dry run); a 401 asks for the
  // operator token instead.
  async function mayCancel(d) {
    if (!running(d.id)) return;
    try {
      const r = await fetch(url(d.id, "/cancel") + "?dry_run=1", { method: "POST", cache: "no-store", headers: authHeaders() });
      if (detail !== d) return;
      $("token-form").hidden = r.status !== 401;
      if (r.status === 401) $("token-hint").textContent = stored(TOKEN_KEY) ? "That token was refused." : "";
      $("cancel").hidden = !(r.ok && running(d.id));
    } catch (_) { /* no button */ }
  }

  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const input = $("token-input");
    store(TOKEN_KEY, input.value.trim() || null);
    input.value = "";
    if (detail) mayCancel(detail);
  });

  $("cancel").addEventListener("click", async () => {
    if (!detail) return;
    const d = detail;
    $("cancel").disabled = true;
    let text;
    try {
      const r = await fetch(url(d.id, "/cancel"), { method: "POST", cache: "no-store", headers: authHeaders() });
      text = r.ok ? "cancel requested" : r.status === 409 ? "not running any more"
        : r.status === 401 ? "refused: the operator token is missing or wrong" : "refused (HTTP " + r.status + ")";
      if (r.status === 401 && detail === d) { $("cancel").hidden = true; $("token-form").hidden = false; }
    } catch (_) {
      text = "cancel failed: server unavailable";
      $("cancel").disabled = false;
    }
    if (detail === d) $("cancel-result").textContent = text;
  });

  function addEvent(kind, ev) {
    detail.events.push(ev);
    if (detail.events.length > MAX_TIMELINE) detail.events.shift();
    const li = document.createElement("li");
    li.className = "ev ev-" + kind;
    const t = ev.ts ? new Date(ev.ts * 1000).toLocaleTimeString() : "";
    const count = ev.done === null || ev.done === undefined ? "" : ev.done + (ev.total ? " / " + ev.total : "") + " done";
    const parts = [];
    if (kind === "start") parts.push("attempt " + (ev.attempt || 1) + " started" + (ev.total ? " (" + ev.total + " items)" : ""));
    else if (kind === "stale" && ev.synthetic) parts.push("STALE: no heartbeat within the lease, the worker is gone or stuck");
    else if (kind === "stale") parts.push(ev.status === "LOST" ? "LOST: a sweeper claimed the job of a dead worker" : ev.status || "");
    else if (kind === "cancel") parts.push("cancel requested");
    else if (kind === "end") parts.push(ev.status || "ended");
    if (ev.stage) parts.push("stage " + ev.stage);
    if (count && kind !== "start" && !(kind === "stale" && ev.synthetic)) parts.push(count);
    if (ev.details) parts.push(JSON.stringify(ev.details));
    const text = parts.filter(Boolean).join(" · ");
    for (const [cls, value] of [["ev-time", t], ["ev-kind", kind], ["ev-text", text]]) {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = value;
      li.appendChild(span);
    }
    const list = $("timeline");
    list.appendChild(li);
    while (list.children.length > MAX_TIMELINE) list.firstChild.remove();
    sparkline(detail.events);
  }

  // Items per second between consecutive progress entries of one attempt (done and ts of each),
  // drawn against time from 0 (bottom) to 1.15 x the highest rate; a single rate is a level line.
  function sparkline(events) {
    const pts = [];
    let prev = null;
    for (const b of events) {
      if (b.done === null || b.done === undefined || !b.ts) continue;
      if (prev && b.fence === prev.fence && b.ts > prev.ts) pts.push([b.ts, Math.max(0, (b.done - prev.done) / (b.ts - prev.ts))]);
      prev = b;
    }
    const line = document.querySelector("#sparkline polyline");
    $("sparkline").dataset.points = String(pts.length);
    $("spark-note").textContent = pts.length ? "" : "A rate needs two progress entries (one every few beats).";
    if (pts.length === 0) { line.setAttribute("points", ""); $("rate-max").textContent = ""; return; }
    if (pts.length === 1) pts.unshift([pts[0][0] - 1, pts[0][1]]);
    const max = Math.max(...pts.map((p) => p[1]));
    const top = max > 0 ? max * 1.15 : 1;
    const t0 = pts[0][0], span = pts[pts.length - 1][0] - t0 || 1;
    line.setAttribute("points", pts.map(([t, r]) => ((400 * (t - t0)) / span).toFixed(1) + "," + (58 - (54 * r) / top).toFixed(1)).join(" "));
    $("rate-max").textContent = "peak " + fmtRate(max);
  }

  setInterval(() => { for (const job of jobs.values()) renderAge(job); }, 1000);
  refreshList();
  restoreEnded();
})();
