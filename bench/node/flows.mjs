// pg-boss 12's flows for bench/workflows.py (see bench/workflow_peers.py):
//
//   node flows.mjs install DSN                  schema; queues wf-leaf, wf-join, wf-step
//   node flows.mjs write DSN CHILDREN           time flow() of a chord and insert() of plain jobs
//   node flows.mjs chord DSN CHILDREN           write one chord (CHILDREN leaves, one join)
//   node flows.mjs plain DSN CHILDREN           insert CHILDREN independent leaves
//   node flows.mjs fanin DSN CHORDS SIZE        chords one after the other, each awaited
//   node flows.mjs chain DSN STEPS              one chain, awaited
//   node flows.mjs worker DSN CONCURRENCY       a worker: READY, GO, work until SIGTERM
//
// Each command but the worker prints one JSON line. Times are epoch seconds; a join or step
// handler returns {t: its start}, which pg-boss keeps as the job's output. pg-boss releases
// a flow's dependents out of band, in its resolver (the "Navigator") that runs every
// flowIntervalSeconds (1, its least) in an instance with supervise on: the workers here.
import { createInterface } from "node:readline";
import { PgBoss } from "pg-boss";

const LEAF = "wf-leaf";
const JOIN = "wf-join";
const STEP = "wf-step";
const QUEUES = [LEAF, JOIN, STEP];
//: pg-boss's least flow interval and polling interval, in seconds.
const FLOW_S = 1;
const POLL_S = 0.5;

function epoch() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function boss(dsn, extra = {}) {
  const b = new PgBoss({
    connectionString: dsn,
    supervise: false,
    schedule: false,
    registerInstance: false,
    max: 4,
    ...extra,
  });
  b.on("error", (error) => console.error(`[pg-boss] ${error}`));
  return b;
}

async function withBoss(dsn, fn) {
  const b = boss(dsn);
  await b.start();
  try {
    return await fn(b);
  } finally {
    await b.stop({ graceful: false });
  }
}

function chordJobs(children, tag) {
  const jobs = Array.from({ length: children }, (_, i) => ({
    ref: `c${i}`,
    name: LEAF,
    data: { n: i, tag },
  }));
  jobs.push({
    ref: "join",
    name: JOIN,
    data: { tag },
    dependsOn: jobs.map((j) => j.ref),
  });
  return jobs;
}

function chainJobs(steps) {
  return Array.from({ length: steps }, (_, i) => ({
    ref: `s${i}`,
    name: STEP,
    data: { n: i },
    ...(i ? { dependsOn: [`s${i - 1}`] } : {}),
  }));
}

async function waitDone(b, name, id, timeoutS) {
  const deadline = Date.now() + timeoutS * 1000;
  for (;;) {
    const job = await b.getJobById(name, id);
    if (job && job.state === "completed") return job;
    if (job && job.state === "failed") throw new Error(`${name} ${id} failed`);
    if (Date.now() > deadline) throw new Error(`${name} ${id} not done in ${timeoutS}s`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

async function maxCompleted(b, ids) {
  const { rows } = await b
    .getDb()
    .executeSql(
      "SELECT extract(epoch FROM max(completed_on))::float8 AS t FROM pgboss.job WHERE id = ANY($1::uuid[])",
      [ids],
    );
  return Number(rows[0].t);
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

async function worker(dsn, concurrency) {
  // supervise on: this instance runs the flow resolver (no other maintenance is due in
  // a short run); LISTEN/NOTIFY on, so new roots wake the workers at once.
  const b = boss(dsn, {
    supervise: true,
    flowIntervalSeconds: FLOW_S,
    useListenNotify: true,
    max: 10,
  });
  await b.start();
  console.log("READY");
  await waitForGo();
  const cpuBase = process.cpuUsage();
  let done = 0;
  const polling = { pollingIntervalSeconds: POLL_S, notifyPollingIntervalSeconds: POLL_S };
  await b.work(
    LEAF,
    { ...polling, batchSize: concurrency, burstWhenBatchFull: true },
    async (jobs) => {
      done += jobs.length;
    },
  );
  const stamp = async () => {
    const t = epoch();
    done += 1;
    return { t };
  };
  await b.work(JOIN, { ...polling, batchSize: 1 }, stamp);
  await b.work(STEP, { ...polling, batchSize: 1 }, stamp);
  await new Promise((resolve) => process.once("SIGTERM", resolve));
  await b.stop({ graceful: true, timeout: 5000 });
  const cpu = process.cpuUsage(cpuBase);
  const line = JSON.stringify({ done, cpu_s: (cpu.user + cpu.system) / 1e6, maxrss_mb: 0 });
  await new Promise((resolve) => process.stdout.write(`${line}\n`, resolve));
  process.exit(0);
}

const [command, dsn, ...rest] = process.argv.slice(2);
const out = (value) => console.log(JSON.stringify(value));
try {
  if (command === "install") {
    await withBoss(dsn, async (b) => {
      for (const name of QUEUES) await b.createQueue(name, { notify: true });
    });
  } else if (command === "write") {
    const children = Number(rest[0]);
    await withBoss(dsn, async (b) => {
      const jobs = chordJobs(children, "w");
      const t0 = epoch();
      await b.flow(jobs);
      const flowS = epoch() - t0;
      const plain = Array.from({ length: children + 1 }, (_, i) => ({ data: { n: i } }));
      const t1 = epoch();
      await b.insert(LEAF, plain);
      out({ flow_s: flowS, insert_s: epoch() - t1 });
    });
  } else if (command === "chord") {
    await withBoss(dsn, async (b) => out(await b.flow(chordJobs(Number(rest[0]), "d"))));
  } else if (command === "plain") {
    const plain = Array.from({ length: Number(rest[0]) }, (_, i) => ({ data: { n: i } }));
    await withBoss(dsn, async (b) => out(await b.insert(LEAF, plain)));
  } else if (command === "fanin") {
    const [chords, size] = [Number(rest[0]), Number(rest[1])];
    await withBoss(dsn, async (b) => {
      const found = [];
      for (let i = -1; i < chords; i++) {
        const ids = await b.flow(chordJobs(size, `f${i}`));
        const join = await waitDone(b, JOIN, ids.join, 60);
        const children = Object.entries(ids)
          .filter(([ref]) => ref !== "join")
          .map(([, id]) => id);
        if (i >= 0) found.push([join.output.t, await maxCompleted(b, children)]);
      }
      out({ chords: found });
    });
  } else if (command === "chain") {
    const steps = Number(rest[0]);
    await withBoss(dsn, async (b) => {
      const ids = await b.flow(chainJobs(steps));
      await waitDone(b, STEP, ids[`s${steps - 1}`], 60 + steps * 5);
      const order = Array.from({ length: steps }, (_, i) => ids[`s${i}`]);
      const { rows } = await b
        .getDb()
        .executeSql(
          "SELECT id::text, (output->>'t')::float8 AS t, extract(epoch FROM completed_on)::float8 AS c FROM pgboss.job WHERE id = ANY($1::uuid[])",
          [order],
        );
      const byId = new Map(rows.map((r) => [r.id, r]));
      out({
        starts: order.map((id) => Number(byId.get(id).t)),
        commits: order.map((id) => Number(byId.get(id).c)),
      });
    });
  } else if (command === "worker") {
    await worker(dsn, Number(rest[0]));
  } else {
    console.error("usage: flows.mjs install|write|chord|plain|fanin|chain|worker DSN ...");
    process.exit(2);
  }
} catch (error) {
  console.error(error);
  process.exit(1);
}
