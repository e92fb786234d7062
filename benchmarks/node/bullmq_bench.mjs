// BullMQ's per-update calls, driven by benchmarks/bullmq.py over stdin/stdout.
//
// node bullmq_bench.mjs PORT JOBS
//   Adds JOBS jobs to queue "bench", takes each with a lock token (Worker.getNextJob, the
//   documented manual-processing path), prints "ready", then obeys one line at a time:
//     progress COUNT PACE_MS  -> COUNT x job.updateProgress(i)
//     lock COUNT PACE_MS      -> COUNT x job.extendLock(token, 30000)
//     both COUNT PACE_MS      -> COUNT x (updateProgress + extendLock)
//     load [PACE_MS [KIND]]   -> rounds until "stop": every job's updateProgress (concurrent),
//                                then ONE extendLocks call renewing every job's lock, as the
//                                Worker's lock manager batches them; PACE_MS between round
//                                starts (0 or absent: flat out); KIND both (default), progress
//                                or lock: only that half. One round = JOBS updates.
//     count                   -> {"updates": N}: updates (progress + its lock renewal) so far
//     stop                    -> ends the load, answers its total
//     quit
//   and answers each with one JSON line. The harness reads the server's counters between
//   commands, so only these calls are counted.
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";
import readline from "node:readline";

const [portArg, jobsArg] = process.argv.slice(2);
const redisOptions = { host: "127.0.0.1", port: Number(portArg), maxRetriesPerRequest: null };
// BullMQ 6 takes a constructed client in native ESM; the worker blocks, so it gets its own
const connection = new IORedis(redisOptions);
const workerConnection = new IORedis(redisOptions);
const n = Number(jobsArg);
const LOCK_MS = 30000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const queue = new Queue("bench", { connection });
const worker = new Worker("bench", null, { connection: workerConnection, autorun: false, lockDuration: LOCK_MS });
await queue.addBulk(Array.from({ length: n }, (_, i) => ({ name: "work", data: { i } })));
const held = [];
for (let i = 0; i < n; i++) {
  const token = `bench-token-${i}`;
  const job = await worker.getNextJob(token, { block: false });
  if (!job) throw new Error(`no job for token ${i}`);
  held.push({ job, token });
}
// warm both scripts (SCRIPT LOAD / first EVALSHA) outside the measured windows
await held[0].job.updateProgress(0);
await held[0].job.extendLock(held[0].token, LOCK_MS);

let stopping = false;
let loadTask = null;
let loadCount = 0;

async function run(kind, count, pace) {
  for (let i = 0; i < count; i++) {
    const { job, token } = held[i % n];
    if (kind !== "lock") await job.updateProgress(i);
    if (kind !== "progress") await job.extendLock(token, LOCK_MS);
    if (pace > 0) await sleep(pace);
  }
  return count;
}

const ids = held.map(({ job }) => job.id);
const tokens = held.map(({ token }) => token);

async function load(pace, kind) {
  let i = 0;
  let next = Date.now();
  while (!stopping) {
    i++;
    if (kind !== "lock") await Promise.all(held.map(({ job }) => job.updateProgress(i)));
    if (kind !== "progress") {
      const failed = await worker.extendJobLocks(ids, tokens, LOCK_MS);
      if (failed.length) throw new Error(`lock renewal failed for ${failed.length} job(s)`);
    }
    loadCount += n;
    if (pace > 0) {
      next += pace;
      await sleep(Math.max(0, next - Date.now()));
    }
  }
}

console.log(JSON.stringify({ ready: true }));
const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  const [cmd, a, b] = line.trim().split(/\s+/);
  if (cmd === "quit") break;
  if (cmd === "load") {
    stopping = false;
    loadCount = 0;
    loadTask = load(Number(a || 0), b || "both");
    console.log(JSON.stringify({ started: true }));
  } else if (cmd === "count") {
    console.log(JSON.stringify({ updates: loadCount }));
  } else if (cmd === "stop") {
    stopping = true;
    await loadTask;
    console.log(JSON.stringify({ updates: loadCount }));
  } else {
    const updates = await run(cmd, Number(a), Number(b || 0));
    console.log(JSON.stringify({ updates }));
  }
}
await worker.close();
await queue.close();
connection.disconnect();
workerConnection.disconnect();
process.exit(0);
