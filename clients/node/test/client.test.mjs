// Self-contained tests: the record format (golden bytes from docs/wire-format.md) and,
// with REDISBUF_URL set (a server with the redisbuf library), add / sample / update.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient } from 'redis';
import {
  ReplayBuffer, RedisBufError, array, scalar, encodeRecord, decodeRecord, schemaOf, bufferKeys,
} from '../index.js';

test('records are the bytes Python writes (docs/wire-format.md examples)', () => {
  assert.equal(encodeRecord({ x: scalar('float64', 1.5) }).toString('hex'), '81a178cb3ff8000000000000');
  const blob = encodeRecord({ obs: array('float32', [2], new Float32Array([1, 2])) });
  assert.equal(blob.toString('hex'), '81a36f6273c71201090102000000000000000000803f00000040');
  const back = decodeRecord(blob);
  assert.deepEqual(back.obs.shape, [2]);
  assert.deepEqual([...back.obs.values], [1, 2]);
  assert.equal(schemaOf({ obs: array('float32', [3], new Float32Array(3)), log_rewards: scalar('float64', 0) }),
    '{"fields":{"log_rewards":{"dtype":"float64","lib":"numpy","shape":[]},"obs":{"dtype":"float32","lib":"numpy","shape":[3]}},"kind":"dict"}');
});

const url = process.env.REDISBUF_URL;

test('add, sample back, len, stats, refusals', { skip: url ? false : 'REDISBUF_URL not set' }, async () => {
  const client = createClient({ url });
  await client.connect();
  try {
    const name = `node-${process.pid}-${Date.now()}`;
    const keys = bufferKeys(name);
    await client.sendCommand(['FCALL', 'rb_init', '2', keys[0], `rb:{${name}}:shards`, '3', 'fifo', '1', '0', '600']);
    const buffer = new ReplayBuffer(client, name);
    const records = [0, 1, 2, 3].map((i) => ({
      obs: array('float32', [2], new Float32Array([i, -i / 3])),
      log_rewards: scalar('float64', -i),
    }));
    const added = await buffer.add(records);
    assert.deepEqual(added.ids, [1, 2, 3, 4]);
    assert.equal(added.evicted, 1); // capacity 3, FIFO
    assert.equal(await buffer.len(), 3);
    const draw = await buffer.sampleUniform(3);
    assert.deepEqual([...draw.ids].sort(), [2, 3, 4]);
    for (let j = 0; j < 3; j++) assert.deepEqual(draw.blobs[j], encodeRecord(records[draw.ids[j] - 1]));
    const stats = await buffer.stats();
    assert.equal(stats.length, '3');
    assert.equal(stats.sampled, '3');
    // a retried add (same batch id) stores nothing twice
    const again = await buffer.add(records.slice(0, 1), { batchId: 'fixed-id' });
    assert.deepEqual(await buffer.add(records.slice(0, 1), { batchId: 'fixed-id' }), again);
    // another schema, a NaN log-reward, PER priorities without PER: refused, nothing stored
    const before = await buffer.stats();
    await assert.rejects(buffer.add([{ other: scalar('int64', 1) }], { schema: schemaOf({ other: scalar('int64', 1) }) }),
      (e) => e instanceof RedisBufError && e.code === 'RB_SCHEMA');
    await assert.rejects(buffer.add(records.slice(0, 1), { logRewards: [NaN] }), (e) => e.code === 'RB_INVALID');
    await assert.rejects(buffer.add(records.slice(0, 1), { priorities: [1] }), (e) => e.code === 'RB_CONFIG');
    await assert.rejects(buffer.updatePriority([2], [1]), (e) => e.code === 'RB_CONFIG');
    assert.deepEqual(await buffer.stats(), before);
    await client.del(keys);
  } finally {
    await client.quit();
  }
});
