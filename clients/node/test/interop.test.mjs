// Interoperability with Python, driven by tests/test_node_client.py: REDISBUF_INTEROP names
// a folder where Python left py.json (the records it added to buffer "py2node") and where
// this test writes node.json (what it added to "node2py", which Python samples and
// re-prioritizes meanwhile, then reads back and compares byte for byte).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createClient } from 'redis';
import { ReplayBuffer, array, scalar } from '../index.js';

const dir = process.env.REDISBUF_INTEROP;
const url = process.env.REDISBUF_URL;
const skip = dir && url ? false : 'REDISBUF_INTEROP / REDISBUF_URL not set (run by tests/test_node_client.py)';

// float32 values that catch any conversion: signed zero, subnormals, extremes, infinities
const SPECIAL = [0, -0, 1.401298464324817e-45, -1.1754942106924411e-38, 3.4028234663852886e38,
  -Infinity, Infinity, Math.fround(Math.PI), Math.fround(1 / 3)];

function transition(i) {
  const obs = new Float32Array(4);
  const next = new Float32Array(4);
  for (let j = 0; j < 4; j++) {
    obs[j] = SPECIAL[(i + j) % SPECIAL.length];
    next[j] = Math.fround((i * 4 + j) / 7);
  }
  return {
    obs: array('float32', [4], obs),
    next_obs: array('float32', [4], next),
    action: scalar('int64', i % 5),
    reward: scalar('float32', Math.fround(i / 3)),
    done: scalar('bool', i % 4 === 3),
    log_rewards: scalar('float64', -i / 10),
  };
}

test('Node reads what Python added, bit-exact', { skip }, async () => {
  const expected = JSON.parse(readFileSync(join(dir, 'py.json'), 'utf8'));
  const client = createClient({ url });
  await client.connect();
  try {
    const buffer = new ReplayBuffer(client, expected.buffer);
    const n = await buffer.len();
    assert.equal(n, expected.items.length);
    const draw = await buffer.sampleUniform(n);
    assert.deepEqual([...draw.ids].sort((a, b) => a - b), expected.items.map((item) => item.id));
    const byId = Object.fromEntries(expected.items.map((item) => [item.id, item]));
    draw.ids.forEach((id, j) => {
      assert.equal(draw.blobs[j].toString('base64'), byId[id].blob, `blob of item ${id}`);
      assert.equal(draw.records[j].obs.bytes.toString('base64'), byId[id].obs, `obs of item ${id}`);
      assert.equal(draw.records[j].log_rewards, byId[id].log_reward);
    });
  } finally {
    await client.quit();
  }
});

test('Node adds transitions while Python samples and updates priorities', { skip }, async () => {
  const client = createClient({ url });
  await client.connect();
  const out = [];
  try {
    const buffer = new ReplayBuffer(client, 'node2py');
    for (let batch = 0; batch < 20; batch++) {
      const records = [];
      for (let k = 0; k < 16; k++) records.push(transition(batch * 16 + k));
      const added = await buffer.add(records);
      assert.equal(added.ids.length, 16);
      added.ids.forEach((id, k) => out.push({ id, index: batch * 16 + k }));
    }
    // and updates priorities of its own items (PER) like a learner would: one append, not
    // counted; the server's read sees it at once (unless Python's learner changed them)
    assert.equal(await buffer.updatePriority([out[0].id, out[1].id], [0.5, 2]), null);
    const read = await buffer.priority([out[0].id, out[1].id, 10 ** 9]);
    assert.equal(read.length, 3);
    assert.ok(read[0] !== null && read[1] !== null && read[2] === null);
    // and draws by PER on the server: only its own items (a snapshot exists: Python's
    // learner published one)
    const drawn = await buffer.samplePer(32);
    assert.ok(drawn.ids.length > 0 && drawn.ids.length <= 32);
    const mine = new Set(out.map((row) => row.id));
    assert.ok(drawn.ids.every((id) => mine.has(id)));
    assert.equal(drawn.records.length, drawn.ids.length);
  } finally {
    await client.quit();
  }
  const records = out.map(({ id, index }) => {
    const t = transition(index);
    return {
      id,
      obs: Buffer.from(t.obs.data.buffer).toString('base64'),
      next_obs: Buffer.from(t.next_obs.data.buffer).toString('base64'),
      action: t.action.value,
      reward: t.reward.value,
      done: t.done.value,
      log_reward: t.log_rewards.value,
    };
  });
  writeFileSync(join(dir, 'node.json'), JSON.stringify(records));
});
