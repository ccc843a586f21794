// A benchmark worker for the Node.js job queues, with bench/worker.py's contract:
//
//   node worker.mjs ROLE SYSTEM --dsn DSN --concurrency N [--task NAME] [--hot-task NAME]
//
// ROLE "drain" works until the queue is empty, "idle" until SIGTERM. SYSTEM is
// "graphile", "graphile-batched" or "pgboss". The process sets up (connects, builds
// the worker without starting it), prints READY, waits for a line GO on stdin, works,
// then prints one JSON line: maxrss_mb, cpu_s (after GO), done, keys (the payload "n"
// of every job it ran) and starts ([n, CLOCK_MONOTONIC seconds] of each job's start,
// the clock of Python's time.monotonic()). last_done is when the work ended: the pool
// had written its last completion (drain) or was stopped (idle). --hot-task: a second
// task (graphile-worker) or queue (pg-boss) the worker also runs.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const SYSTEMS = ["graphile", "graphile-batched", "pgboss"];
//: Batched completions of graphile-batched, in ms (the docs: even 0 helps).
const BATCH_DELAY_MS = 2;

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    dsn: { type: "string" },
    concurrency: { type: "string", default: "10" },
    task: { type: "string", default: "noop" },
    "hot-task": { type: "string" },
  },
});
const [role, system] = positionals;
if (!["drain", "idle"].includes(role) || !SYSTEMS.includes(system) || !opts.dsn) {
  console.error(
    `usage: worker.mjs drain|idle ${SYSTEMS.join("|")} --dsn DSN --concurrency N [--task NAME]`,
  );
  process.exit(2);
}
const concurrency = Number(opts.concurrency);
const keys = [];
const starts = [];
let cpuBase = null;

function now() {
  return Number(process.hrtime.bigint()) / 1e9;
}

function record(payload) {
  const n = payload.n;
  keys.push(n);
  starts.push([n, now()]);
}

// VmHWM, as bench/worker.py reads it: getrusage()'s peak survives exec on Linux, so it
// would report the parent's peak at the fork whenever that was larger.
function peakRssMb() {
  const status = readFileSync("/proc/self/status", "utf8");
  const kb = /^VmHWM:\s+(\d+) kB/m.exec(status);
  return kb ? Number(kb[1]) / 1024 : process.resourceUsage().maxRSS / 1024;
}

// Writes to a pipe are asynchronous: the caller must wait before process.exit().
function report(lastDone) {
  const cpu = process.cpuUsage(cpuBase ?? undefined);
  const line = {
    maxrss_mb: peakRssMb(),
    cpu_s: cpuBase === null ? 0 : (cpu.user + cpu.system) / 1e6,
    done: keys.length,
    keys,
    starts,
    last_done: lastDone,
  };
  return new Promise((resolve) => process.stdout.write(`${JSON.stringify(line)}\n`, resolve));
}

function waitForGo() {
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: process.stdin });
    lines.on("line", (line) => {
      if (line.trim() === "GO") {
        resolve();
        lines.close();
      }
    });
    lines.on("close", () => reject(new Error("stdin closed before GO")));
  });
}

// -- graphile-worker ---------------------------------------------------------------------

async function graphile(batched) {
  const { Logger, run, runMigrations, runOnce } = await import("graphile-worker");
  const pg = (await import("pg")).default;
  // graphile-worker's default maxPoolSize. Its docs advise max(10, concurrency + 2), but
  // at concurrency 100 a few processes would pass a default server's max_connections.
  const poolSize = 10;
  const pgPool = new pg.Pool({ connectionString: opts.dsn, max: poolSize });
  pgPool.on("error", (error) => console.error(`[pool] ${error}`));
  pgPool.on("connect", (client) => client.on("error", (e) => console.error(`[client] ${e}`)));
  // Its default logger writes a line per job; production set-ups keep warnings only.
  const logger = new Logger(() => (level, message) => {
    if (level === "error" || level === "warning") console.error(`[${level}] ${message}`);
  });
  const taskList = { [opts.task]: async (payload) => record(payload) };
  if (opts["hot-task"]) taskList[opts["hot-task"]] = taskList[opts.task];
  const worker = batched
    ? {
        localQueue: { size: concurrency },
        completeJobBatchDelay: BATCH_DELAY_MS,
        failJobBatchDelay: BATCH_DELAY_MS,
      }
    : {};
  const options = {
    pgPool,
    taskList,
    concurrency,
    logger,
    noHandleSignals: true,
    preset: { worker },
  };
  // Checks the schema; then every pool connection is opened before the barrier.
  await runMigrations(options);
  const clients = await Promise.all(Array.from({ length: poolSize }, () => pgPool.connect()));
  for (const client of clients) client.release();
  console.log("READY");
  await waitForGo();
  cpuBase = process.cpuUsage();
  if (role === "drain") {
    process.once("SIGTERM", async () => {
      await report(now());
      process.exit(0);
    });
    await runOnce(options);
    await report(now());
  } else {
    const runner = await run(options);
    await new Promise((resolve) => process.once("SIGTERM", resolve));
    await runner.stop();
    await report(now());
  }
  await pgPool.end();
  process.exit(0);
}

// -- pg-boss ------------------------------------------------------------------------------

//: pg-boss's shortest poll (its default is 2 s): waits only follow a short fetch.
const PGBOSS_POLL_S = 0.5;

async function pgboss() {
  const { PgBoss } = await import("pg-boss");
  const pg = (await import("pg")).default;
  // Housekeeping (supervise, cron, instance registry) is periodic: kept out of a short run.
  const boss = new PgBoss({
    connectionString: opts.dsn,
    supervise: false,
    schedule: false,
    registerInstance: false,
  });
  boss.on("error", (error) => console.error(`[pg-boss] ${error}`));
  await boss.start();
  // Ends the drain role: is any job of the queue not completed yet?
  const probe = new pg.Client({ connectionString: opts.dsn });
  await probe.connect();
  // One fetch of `concurrency` jobs per round trip, fetching again at once while fetches
  // come back full (burstWhenBatchFull); pg-boss completes the batch in one statement.
  const options = {
    batchSize: concurrency,
    burstWhenBatchFull: true,
    pollingIntervalSeconds: PGBOSS_POLL_S,
  };
  const handler = async (jobs) => {
    for (const job of jobs) record(job.data);
  };
  console.log("READY");
  await waitForGo();
  cpuBase = process.cpuUsage();
  await boss.work(opts.task, options, handler);
  if (opts["hot-task"]) await boss.work(opts["hot-task"], options, handler);
  const stop = async () => {
    const last = now();
    await boss.stop({ graceful: true, timeout: 5000 });
    await report(last);
    process.exit(0);
  };
  process.once("SIGTERM", stop);
  if (role === "drain") {
    for (;;) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      const { rows } = await probe.query(
        "SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = $1 AND state < 'completed') AS busy",
        [opts.task],
      );
      if (!rows[0].busy) break;
    }
    await stop();
  }
}

// -- main ---------------------------------------------------------------------------------

try {
  if (system === "pgboss") {
    await pgboss();
  } else {
    await graphile(system === "graphile-batched");
  }
} catch (error) {
  console.error(error);
  process.exit(1);
}
