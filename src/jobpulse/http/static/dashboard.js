// jobpulse dashboard: a row per job, followed by EventSource, polled with Backoff when SSE fails.
// Static, no build step. Every URL is relative, so the app can be mounted under any prefix.
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const LIST_EVERY_MS = 1000 * Number(params.get("refresh") || 2);
  const TRANSPORT = params.get("transport") === "poll" ? "poll" : "sse";
  const SSE_FAILURES = 2; // consecutive EventSource errors before switching to polling
  const TERMINAL = new Set(["COMPLETED", "FAILED", "CANCELLED", "LOST"]);
  const KINDS = ["start", "stage", "beat", "checkpoint", "cancel", "end", "stale", "snapshot"];
  const base = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
  const tbody = document.querySelector("#jobs tbody");
  const jobs = new Map();

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
    for (const name of ["stage", "rate num", "eta num", "memory num", "heartbeat num"]) cell(name);
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
    tr.querySelector(".label").textContent = pct === null ? count : pct.toFixed(pct === 100 ? 0 : 1) + " % (" + count + ")";
    tr.querySelector(".stage").textContent = s.stage || "–";
    tr.querySelector(".rate").textContent = fmtRate(s.rate);
    tr.querySelector(".eta").textContent = TERMINAL.has(s.state) ? "–" : fmtDuration(s.eta);
    tr.querySelector(".memory").textContent = fmtBytes(s.rss_bytes);
    renderAge(job);
    summary();
  }

  function renderAge(job) {
    if (!job.tr) return;
    const td = job.tr.querySelector(".heartbeat");
    if (job.ageBase === null || TERMINAL.has(job.status.state)) { td.textContent = "–"; return; }
    td.textContent = fmtDuration(job.ageBase + (performance.now() - job.ageAt) / 1000) + " ago";
  }

  function summary() {
    const counts = {};
    for (const job of jobs.values()) counts[job.status.state] = (counts[job.status.state] || 0) + 1;
    const parts = Object.entries(counts).map(([k, v]) => v + " " + k.toLowerCase());
    document.getElementById("summary").textContent = parts.length ? parts.join(", ") : "no jobs";
    document.getElementById("empty").hidden = jobs.size > 0;
  }

  // A full status (GET /jobs or GET /jobs/{id}) replaces what we know, unless it is older.
  function applyStatus(job, s) {
    const cur = job.status;
    if (cur && cur.seq !== undefined && s.fence === cur.fence && s.seq < cur.seq) return;
    job.status = Object.assign({}, cur || {}, s);
    if (s.heartbeat_age !== null && s.heartbeat_age !== undefined) {
      job.ageBase = s.heartbeat_age;
      job.ageAt = performance.now();
    }
    render(job);
  }

  // An event carries status, stage, done, total, seq, fence, ts.
  function applyEvent(job, kind, ev) {
    if (kind === "snapshot") { applyStatus(job, ev); return; }
    const s = job.status;
    if (!ev.synthetic && ev.seq !== null && s.seq !== null && s.seq !== undefined && ev.fence === s.fence && ev.seq < s.seq) return;
    for (const key of ["stage", "done", "total", "seq", "fence"]) if (ev[key] !== null && ev[key] !== undefined) s[key] = ev[key];
    if (ev.status) s.state = ev.status;
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
    job.following = true;
    if (TRANSPORT === "poll" || typeof EventSource === "undefined") poll(job);
    else stream(job);
  }

  function stream(job) {
    job.transport = "sse";
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

  function forget(job) {
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
        if (!job) {
          job = { id: s.job_id, status: null, ageBase: null, ageAt: 0, transport: TRANSPORT, following: false, es: null, etag: null };
          jobs.set(job.id, job);
        }
        applyStatus(job, s);
        follow(job);
      }
      setError("");
    } catch (err) {
      setError("job list unavailable, retrying");
    }
    summary();
    setTimeout(refreshList, LIST_EVERY_MS);
  }

  setInterval(() => { for (const job of jobs.values()) renderAge(job); }, 1000);
  refreshList();
})();
