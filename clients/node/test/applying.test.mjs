// A large add being stored a slice at a time, driven by tests/test_node_client.py:
// REDISBUF_APPLYING is {"buffer": name, "length": n}, a buffer whose large add a Python
// writer committed and died before storing (every function on it refuses with RB_APPLYING).
// The client stores the rest itself, then answers as if the add had been whole all along.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient } from 'redis';
import { ReplayBuffer } from '../index.js';

const spec = process.env.REDISBUF_APPLYING && JSON.parse(process.env.REDISBUF_APPLYING);
const url = process.env.REDISBUF_URL;
const skip = spec && url ? false : 'REDISBUF_APPLYING / REDISBUF_URL not set (run by tests/test_node_client.py)';

test('a call meeting a large add stores the rest of it, then answers', { skip }, async () => {
  const client = createClient({ url });
  await client.connect();
  try {
    const buffer = new ReplayBuffer(client, spec.buffer);
    const applying = await client.sendCommand(['HEXISTS', buffer.keys[0], 'applying']);
    assert.equal(Number(applying), 1, 'the add is still being stored before the first call');
    assert.equal(Number(await buffer.len()), spec.length);
    assert.equal(Number(await client.sendCommand(['HEXISTS', buffer.keys[0], 'applying'])), 0);
    const draw = await buffer.sampleUniform(8);
    assert.equal(draw.ids.length, 8);
    assert.ok(draw.ids.every((id) => id >= 1 && id <= spec.length));
  } finally {
    await client.quit();
  }
});
