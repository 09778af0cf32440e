// Node add throughput: BATCHES batches of BATCH transitions (obs / next_obs float32 of
// OBS_DIM, action, reward, done, log_rewards) into buffer NAME at REDISBUF_URL.
// Times the adds only (encoding included). Prints one JSON line {items, seconds, items_per_s}. Used by benchmarks/bench_node.py.
import { createClient } from 'redis';
import { ReplayBuffer, array, scalar } from '../index.js';

const [name, batches, batchSize, obsDim] = process.argv.slice(2);
const client = createClient({ url: process.env.REDISBUF_URL });
await client.connect();
const buffer = new ReplayBuffer(client, name);
const batch = (b) => {
  const records = [];
  for (let k = 0; k < Number(batchSize); k++) {
    const obs = new Float32Array(Number(obsDim)).map(() => Math.random());
    const next = new Float32Array(Number(obsDim)).map(() => Math.random());
    records.push({
      obs: array('float32', [Number(obsDim)], obs),
      next_obs: array('float32', [Number(obsDim)], next),
      action: scalar('int64', k % 4),
      reward: scalar('float32', Math.fround(Math.random())),
      done: scalar('bool', k % 50 === 49),
      log_rewards: scalar('float64', b),
    });
  }
  return records;
};
await buffer.add(batch(0)); // warm-up: schema, connection
// the data is made before the clock starts (as in bench_node.py's Python loop): only add
const data = [];
for (let b = 0; b < Number(batches); b++) data.push(batch(b));
const start = process.hrtime.bigint();
for (const records of data) await buffer.add(records);
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
const items = Number(batches) * Number(batchSize);
console.log(JSON.stringify({ items, seconds, items_per_s: items / seconds }));
await client.quit();
