// A Node.js client of redisbuf buffers over the `redisbuf` Redis Functions library
// (FCALL; install it with `redisbuf functions install` or any Python ReplayBuffer open).
// Records are bit-exact with Python's (docs/wire-format.md). This client draws uniformly,
// sets PER priorities (one append to the buffer's mass log), reads any item's priority and
// draws by PER on the server (rb_sample_per), without a replica of its own.
import { randomBytes, randomUUID } from 'node:crypto';
import { endianness } from 'node:os';
import { encode, decode, Ext, Fixed } from './msgpack.js';

export { encode, decode, Ext, Fixed };

if (endianness() !== 'LE') throw new Error('redisbuf records are little-endian; this host is not');

// dtype name -> [code, bytes per element, TypedArray or null]
export const DTYPES = {
  bool: [1, 1, Uint8Array],
  int8: [2, 1, Int8Array],
  int16: [3, 2, Int16Array],
  int32: [4, 4, Int32Array],
  int64: [5, 8, BigInt64Array],
  uint8: [6, 1, Uint8Array],
  float16: [7, 2, null],
  bfloat16: [8, 2, null],
  float32: [9, 4, Float32Array],
  float64: [10, 8, Float64Array],
  uint16: [11, 2, Uint16Array],
  uint32: [12, 4, Uint32Array],
  uint64: [13, 8, BigUint64Array],
};
const DTYPE_OF_CODE = Object.fromEntries(Object.entries(DTYPES).map(([name, [code]]) => [code, name]));
const EXT_NUMPY = 1;
const EXT_TORCH = 2;

/** An array field of one item: dtype name, shape (this item's), data (a TypedArray or the
 * raw little-endian bytes as a Buffer), lib ('numpy' or 'torch': what Python returns). */
export function array(dtype, shape, data, lib = 'numpy') {
  return { dtype, shape, data, lib };
}

/** A scalar field of one item (one number per item, e.g. log_rewards). */
export function scalar(dtype, value, lib = 'numpy') {
  return { dtype, shape: [], value, lib };
}

function bytesOf(data) {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

const nameHeaders = new Map(); // field name -> its msgpack str bytes

function nameBytes(name) {
  let bytes = nameHeaders.get(name);
  if (bytes === undefined) {
    bytes = encode(name);
    nameHeaders.set(name, bytes);
  }
  return bytes;
}

const frames = new Map(); // dtype|shape|lib -> ext header + dtype code + ndim + shape

function frameOf(field) {
  const id = `${field.dtype}|${field.shape.join(',')}|${field.lib}`;
  let frame = frames.get(id);
  if (frame === undefined) {
    const spec = DTYPES[field.dtype];
    if (!spec) throw new TypeError(`unsupported dtype ${field.dtype}`);
    const count = field.shape.reduce((a, b) => a * b, 1);
    const payload = 2 + 8 * field.shape.length + count * spec[1];
    const header = payload <= 0xff ? Buffer.from([0xc7, payload])
      : payload <= 0xffff ? Buffer.from([0xc8, payload >> 8, payload & 0xff])
        : Buffer.from([0xc9, payload >>> 24, (payload >> 16) & 0xff, (payload >> 8) & 0xff, payload & 0xff]);
    const shape = Buffer.alloc(2 + 8 * field.shape.length);
    shape[0] = spec[0];
    shape[1] = field.shape.length;
    field.shape.forEach((dim, i) => shape.writeBigUInt64LE(BigInt(dim), 2 + 8 * i));
    frame = { bytes: Buffer.concat([header, Buffer.from([field.lib === 'torch' ? EXT_TORCH : EXT_NUMPY]), shape]), data: count * spec[1] };
    frames.set(id, frame);
  }
  return frame;
}

const SCALAR_KIND = {}; // dtype -> 'float64' | 'int64' | 'uint64' | 'bool'
for (const name of Object.keys(DTYPES)) {
  SCALAR_KIND[name] = name === 'bool' ? 'bool' : name.includes('float') ? 'float64'
    : name.startsWith('uint') ? 'uint64' : 'int64';
}

/** One item (an object of fields made with array() / scalar()) as a redisbuf record:
 * the bytes Python writes for the same dict item (fields in sorted order), written into
 * one buffer (the hot path of add). */
export function encodeRecord(record) {
  const names = Object.keys(record).sort();
  let size = names.length < 16 ? 1 : 3;
  const plan = new Array(names.length);
  for (let i = 0; i < names.length; i++) {
    const field = record[names[i]];
    const key = nameBytes(names[i]);
    if (field.value !== undefined) {
      const kind = SCALAR_KIND[field.dtype];
      if (kind === undefined) throw new TypeError(`unsupported dtype ${field.dtype}`);
      plan[i] = [key, kind, field.value];
      size += key.length + (kind === 'bool' ? 1 : 9);
    } else {
      const frame = frameOf(field);
      const raw = bytesOf(field.data);
      if (raw.length !== frame.data) {
        throw new RangeError(`shape ${JSON.stringify(field.shape)} of ${field.dtype} needs ${frame.data} bytes, got ${raw.length}`);
      }
      plan[i] = [key, frame.bytes, raw];
      size += key.length + frame.bytes.length + raw.length;
    }
  }
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  if (names.length < 16) out[at++] = 0x80 | names.length;
  else { out[at++] = 0xde; out.writeUInt16BE(names.length, at); at += 2; }
  for (const [key, how, value] of plan) {
    at += key.copy(out, at);
    if (typeof how !== 'string') {
      at += how.copy(out, at);
      at += value.copy(out, at);
    } else if (how === 'float64') {
      out[at] = 0xcb; out.writeDoubleBE(Number(value), at + 1); at += 9;
    } else if (how === 'int64') {
      out[at] = 0xd3; out.writeBigInt64BE(BigInt(value), at + 1); at += 9;
    } else if (how === 'uint64') {
      out[at] = 0xcf; out.writeBigUInt64BE(BigInt(value), at + 1); at += 9;
    } else {
      out[at++] = value ? 0xc3 : 0xc2;
    }
  }
  return out;
}

/** A record's fields: arrays as {dtype, shape, lib, bytes (Buffer, little-endian), values
 * (a TypedArray copy, null for float16 / bfloat16)}, scalars as numbers (or booleans). */
export function decodeRecord(blob) {
  const map = decode(blob);
  const out = {};
  for (const [name, value] of Object.entries(map)) {
    if (!(value instanceof Ext)) {
      out[name] = value;
      continue;
    }
    if (value.type !== EXT_NUMPY && value.type !== EXT_TORCH) throw new RangeError(`unknown ext type ${value.type}`);
    const d = value.data;
    const dtype = DTYPE_OF_CODE[d[0]];
    if (!dtype) throw new RangeError(`unknown dtype code ${d[0]}`);
    const shape = [];
    for (let i = 0; i < d[1]; i++) shape.push(Number(d.readBigUInt64LE(2 + 8 * i)));
    const bytes = d.subarray(2 + 8 * d[1]);
    const [, size, Typed] = DTYPES[dtype];
    if (bytes.length !== shape.reduce((a, b) => a * b, 1) * size) throw new RangeError(`field ${name}: payload size does not match its shape`);
    const copy = Buffer.from(bytes); // aligned, owned
    out[name] = {
      dtype, shape, lib: value.type === EXT_TORCH ? 'torch' : 'numpy', bytes,
      values: Typed ? new Typed(copy.buffer, copy.byteOffset, copy.length / size) : null,
    };
  }
  return out;
}

/** JSON with sorted keys and no spaces: Python's json.dumps(sort_keys=True,
 * separators=(',', ':')) for the ASCII names and integers a schema holds. */
export function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/** The schema of a dict item (what Python's first add of such items would store). */
export function schemaOf(record) {
  const fields = {};
  for (const [name, field] of Object.entries(record)) {
    fields[name] = { dtype: field.dtype, lib: field.lib ?? 'numpy', shape: field.value !== undefined ? [] : field.shape };
  }
  return canonicalJson({ fields, kind: 'dict' });
}

/** The 13 keys every item function takes, in order (docs/wire-format.md). */
export function bufferKeys(name) {
  const k = (suffix) => `rb:{${name}}:${suffix}`;
  return ['meta', 'items', 'prio', 'order', 'perheap', 'per', 'uses', 'versions', 'times', 'vecs',
    'batches', 'batches:old', 'masslog'].map(k);
}

/** The keys of the large add being stored a slice at a time (rb_add_apply's after the 13). */
export function applyingKeys(name) {
  return ['applying', 'applying:blobs', 'applying:texts'].map((suffix) => `rb:{${name}}:${suffix}`);
}

/** The buffer's snapshot of its PER priorities (rb:{name}:snap), which rb_priority and
 * rb_sample_per read besides the 13 keys. */
export function snapKey(name) {
  return `rb:{${name}}:snap`;
}

export class RedisBufError extends Error {
  constructor(message, code) {
    super(message);
    this.name = 'RedisBufError';
    this.code = code;
  }
}

function translate(error) {
  const match = /\b(RB_[A-Z]+) ?([\s\S]*)/.exec(String(error?.message ?? error));
  if (!match) return error;
  return new RedisBufError(match[2].replace(/\s*script: \w+, on @user_\w+:\d+\.?$/, ''), match[1]);
}

function text(x) {
  if (x === Infinity) return 'inf';
  if (x === -Infinity) return '-inf';
  if (Number.isNaN(x)) return 'nan';
  return String(x); // the shortest text that reads back as the same double, as Python's repr
}

/** One buffer, through a connected node-redis client (createClient from 'redis'). */
export class ReplayBuffer {
  constructor(client, name) {
    this.client = client;
    this.name = name;
    this.keys = bufferKeys(name);
    this.schema = null;
  }

  async #call(fn, keys, args, readOnly = false) {
    for (;;) {
      try {
        return await this.client.sendCommand(
          [readOnly ? 'FCALL_RO' : 'FCALL', fn, String(keys.length), ...keys, ...args],
          { returnBuffers: true },
        );
      } catch (error) {
        const translated = translate(error);
        if (translated?.code !== 'RB_APPLYING') throw translated;
        await this.finishApplying(); // then call again: the function refused before any write
      }
    }
  }

  /** Store what is left of a large add being stored in this buffer (a Python client's add
   * above one add's bound, stored a slice at a time): rb_add_apply until it is done. Every
   * function on the buffer refuses with RB_APPLYING until then; #call runs this and calls
   * again. */
  async finishApplying() {
    const keys = [...this.keys, ...applyingKeys(this.name)];
    for (;;) {
      let reply;
      try {
        reply = await this.client.sendCommand(['FCALL', 'rb_add_apply', String(keys.length), ...keys]);
      } catch (error) {
        throw translate(error);
      }
      if (Number(reply[0]) === 1) return;
    }
  }

  /** The stored schema (canonical JSON text), or null before the first add. */
  async storedSchema() {
    if (this.schema === null) {
      const raw = await this.client.sendCommand(['HGET', this.keys[0], 'schema']);
      this.schema = raw ?? null;
    }
    return this.schema;
  }

  /** Add items (objects of array() / scalar() fields) in one atomic step, evicting beyond
   * capacity. logRewards: one number per item (default: each item's log_rewards field,
   * else 0; it must be 0 when the schema has no log_rewards field). priorities: PER priorities (a buffer with PER). batchId: a retried call with
   * the same id stores nothing twice (default: a fresh id). Returns {ids, evicted,
   * rejected}. */
  async add(records, { logRewards, priorities, batchId, modelVersion, sessionId, schema } = {}) {
    if (records.length === 0) throw new RangeError('no records');
    const blobs = records.map((r) => (Buffer.isBuffer(r) ? r : encodeRecord(r)));
    const rewards = logRewards ?? records.map((r) => Number(r.log_rewards?.value ?? 0));
    if (rewards.length !== records.length) throw new RangeError(`${rewards.length} log-rewards for ${records.length} records`);
    schema = schema ?? (await this.storedSchema()) ?? schemaOf(records[0]);
    const options = {};
    if (priorities) options.per_priorities = priorities.map(text);
    if (modelVersion !== undefined) options.model_version = modelVersion;
    if (sessionId !== undefined) options.session_id = sessionId;
    const args = [schema, String(records.length), Object.keys(options).length ? JSON.stringify(options) : ''];
    blobs.forEach((blob, i) => args.push(blob, text(rewards[i])));
    args.push(batchId ?? randomUUID().replaceAll('-', '').slice(0, 16));
    const reply = await this.#call('rb_add', this.keys, args);
    if (this.schema === null) this.schema = schema;
    const [first, count, evicted, rejected] = reply;
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(first + i);
    return { ids, evicted, rejected: rejected ? rejected.toString() : null };
  }

  /** Draw n items uniformly (without replacement unless replacement or n > length).
   * Returns {ids, blobs, records}. readOnly: FCALL_RO of rb_sample_uniform_ro (counts
   * nothing; for read-only users and replicas). */
  async sampleUniform(n, { replacement = false, readOnly = false, uniforms } = {}) {
    const packed = uniforms ?? randomBytes(6 * n);
    const fn = readOnly ? 'rb_sample_uniform_ro' : 'rb_sample_uniform';
    const reply = await this.#call(fn, this.keys, [String(n), replacement ? '1' : '0', '1', packed], readOnly);
    const ids = reply.slice(2, 2 + n).map((id) => Number(id.toString()));
    const blobs = reply.slice(2 + n);
    return { length: reply[0], ids, blobs, records: blobs.map(decodeRecord) };
  }

  /** Set PER priorities (finite, >= 0) of items: one append to the buffer's mass log
   * (rb_update_priority), which every sampler applies in order, skipping ids no longer
   * stored at that point; the last of a repeated id wins. The server looks no id up, so
   * nothing is counted: returns null (Python counts with its replica). At most 2048 ids
   * a call. */
  async updatePriority(ids, priorities) {
    if (ids.length !== priorities.length) throw new RangeError(`${priorities.length} priorities for ${ids.length} ids`);
    const packed = Buffer.alloc(8 * priorities.length);
    priorities.forEach((p, i) => packed.writeDoubleBE(p === 0 ? 0 : p, 8 * i)); // -0 as 0
    // the ids as big-endian 64-bit integers (binary: the server checks none)
    const packedIds = Buffer.alloc(8 * ids.length);
    ids.forEach((id, i) => packedIds.writeBigInt64BE(BigInt(id), 8 * i));
    // the largest's position (1-based): the server then checks one byte of each priority
    let largest = 0;
    priorities.forEach((p, i) => { if (!(p <= priorities[largest])) largest = i; });
    await this.#call('rb_update_priority', this.keys, [packedIds, packed, '', '', '', String(largest + 1)]);
    return null;
  }

  /** The current PER priority of each of ids (at most 16), null for an item not stored
   * (rb_priority, read-only: from the mass log and the snapshot behind it). */
  async priority(ids) {
    const keys = [this.keys[0], this.keys[3], this.keys[12], snapKey(this.name), this.keys[4], this.keys[5]];
    const reply = await this.#call('rb_priority', keys, ids.map(String), true);
    return reply.map((v) => (v === null ? null : Number(v.toString())));
  }

  /** Draw n items by PER on the server (rb_sample_per; at most 256, with replacement):
   * item i with probability (p_i + eps)^alpha / sum_j (p_j + eps)^alpha at this call.
   * uniforms: 6 random bytes per uniform, 16 per draw by default; a call whose uniforms
   * run out returns fewer draws. Needs a snapshot of the buffer (any Python process
   * sampling it writes one). Returns {length, ids, priorities (each draw's now), blobs,
   * records}; no probabilities (the server keeps no sum of the masses). */
  async samplePer(n, { uniforms } = {}) {
    const packed = uniforms ?? randomBytes(6 * 16 * n);
    const reply = await this.#call('rb_sample_per', [...this.keys, snapKey(this.name)], [String(n), packed, '1']);
    const count = Number(reply[0]);
    const ids = count ? reply[2].toString().split(',').map(Number) : [];
    const priorities = count ? reply[3].toString().split(',').map(Number) : [];
    const blobs = reply.slice(4);
    return { length: Number(reply[1]), ids, priorities, blobs, records: blobs.map(decodeRecord) };
  }

  async len() {
    return this.#call('rb_len', [this.keys[0], this.keys[3]], [], true);
  }

  /** The meta fields (text) and length. */
  async stats() {
    const reply = await this.#call('rb_stats', [this.keys[0], this.keys[3]], [], true);
    const out = {};
    for (let i = 0; i < reply.length; i += 2) out[reply[i].toString()] = reply[i + 1].toString();
    return out;
  }
}
