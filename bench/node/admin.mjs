// Set-up steps of the Node peers that only their own client does (bench/node_peers.py):
//
//   node admin.mjs pgboss-install DSN QUEUE HOT_QUEUE
//       pg-boss's schema, QUEUE (standard policy) and HOT_QUEUE (singleton: one active job)
//   node admin.mjs pgboss-enqueue DSN QUEUE COUNT FIRST
//       COUNT jobs {"n": FIRST + i} into QUEUE with pg-boss's bulk insert()
import { PgBoss } from "pg-boss";

const CHUNK = 10_000;

async function withBoss(dsn, fn) {
  // Nothing but the schema: no maintenance, no cron, no instance registration.
  const boss = new PgBoss({
    connectionString: dsn,
    supervise: false,
    schedule: false,
    registerInstance: false,
    max: 2,
  });
  boss.on("error", (error) => console.error(`[pg-boss] ${error}`));
  await boss.start();
  try {
    await fn(boss);
  } finally {
    await boss.stop({ graceful: false });
  }
}

const [command, dsn, ...rest] = process.argv.slice(2);
try {
  if (command === "pgboss-install") {
    const [queue, hot] = rest;
    await withBoss(dsn, async (boss) => {
      await boss.createQueue(queue);
      await boss.createQueue(hot, { policy: "singleton" });
    });
  } else if (command === "pgboss-enqueue") {
    const [queue, count, first] = [rest[0], Number(rest[1]), Number(rest[2])];
    await withBoss(dsn, async (boss) => {
      for (let start = 0; start < count; start += CHUNK) {
        const size = Math.min(CHUNK, count - start);
        const jobs = Array.from({ length: size }, (_, i) => ({ data: { n: first + start + i } }));
        await boss.insert(queue, jobs);
      }
    });
  } else {
    console.error("usage: admin.mjs pgboss-install|pgboss-enqueue DSN ...");
    process.exit(2);
  }
} catch (error) {
  console.error(error);
  process.exit(1);
}
