// tests/bench/pgboss_burst.mjs: the pg-boss peer of tests/bench/fire. Not run by hand:
// tests/bench/fire copies it into the temporary folder where it installed pg-boss (so that
// `import 'pg-boss'` resolves there) and runs it with node.
//
//   node pgboss_burst.mjs load URL SCHEMA QUEUE COUNT PAYLOAD_BYTES
//       starts pg-boss (installing its schema), recreates QUEUE, inserts COUNT jobs whose
//       data is {"p": <PAYLOAD_BYTES characters>} with insert() in chunks of 1,000, stops;
//       prints one line: "loaded {json}".
//   node pgboss_burst.mjs work URL SCHEMA QUEUE IDS_FILE BATCH
//       one worker: one PgBoss instance (one connection pool), no supervision, no
//       scheduling, no migration. Prints "ready", waits for "go" on stdin, then the burst
//       loop: fetch(QUEUE, {batchSize: BATCH}), complete(QUEUE, the batch's ids), and fetch
//       again at once; the first empty fetch ends it (every job was inserted before "go").
//       Writes the ids it completed to IDS_FILE (one a line) and prints one line:
//       "done {json}" with the wall-clock (epoch ms) of its first fetch and of its last
//       complete, the jobs it completed and the batches it fetched.

import { writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const mod = await import('pg-boss');
const PgBoss = mod.PgBoss ?? mod.default;

const [mode, url, schema, queue, a4, a5] = process.argv.slice(2);

function randomText(n) {
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  let s = '';
  for (let i = 0; i < n; i++) s += abc[Math.floor(Math.random() * 64)];
  return s;
}

async function load() {
  const count = Number(a4);
  const payload = Number(a5);
  const boss = new PgBoss({ connectionString: url, schema, supervise: false, schedule: false });
  boss.on('error', (e) => console.error('pg-boss error:', e));
  await boss.start();
  if (await boss.getQueue(queue)) await boss.deleteQueue(queue);
  await boss.createQueue(queue);
  const t0 = Date.now();
  for (let done = 0; done < count;) {
    const jobs = [];
    for (let i = done; i < Math.min(count, done + 1000); i++) jobs.push({ data: { p: randomText(payload) } });
    await boss.insert(queue, jobs);
    done += jobs.length;
  }
  const ms = Date.now() - t0;
  await boss.stop({ graceful: false, wait: true });
  console.log('loaded ' + JSON.stringify({ count, ms }));
}

async function work() {
  const idsFile = a4;
  const batch = Number(a5);
  const boss = new PgBoss({ connectionString: url, schema, supervise: false, schedule: false, migrate: false });
  boss.on('error', (e) => console.error('pg-boss error:', e));
  await boss.start();
  console.log('ready');
  const rl = createInterface({ input: process.stdin });
  const it = rl[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done || first.value.trim() !== 'go') {
    await boss.stop({ graceful: false, wait: true });
    return;
  }
  const ids = [];
  let batches = 0;
  let full = 0;
  const firstFetch = Date.now();
  let lastComplete = firstFetch;
  for (;;) {
    const jobs = await boss.fetch(queue, { batchSize: batch });
    if (!jobs || jobs.length === 0) break;
    batches++;
    if (jobs.length === batch) full++;
    const batchIds = jobs.map((j) => j.id);
    const res = await boss.complete(queue, batchIds);
    if (res && typeof res.affected === 'number' && res.affected !== batchIds.length) {
      console.error(`complete affected ${res.affected} of ${batchIds.length} jobs`);
    }
    lastComplete = Date.now();
    for (const id of batchIds) ids.push(id);
  }
  writeFileSync(idsFile, ids.join('\n') + (ids.length ? '\n' : ''));
  rl.close();
  await boss.stop({ graceful: false, wait: true });
  console.log('done ' + JSON.stringify({ firstFetch, lastComplete, completed: ids.length, batches, full }));
}

if (mode === 'load') await load();
else if (mode === 'work') await work();
else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
