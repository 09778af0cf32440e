// The msgpack subset redisbuf records use (docs/wire-format.md): maps, strings, binary,
// numbers, booleans, nil, arrays, and ext values (type 1 numpy / 2 torch arrays).
// Encoding writes what Python's redisbuf writes for the same item, byte for byte.

export class Ext {
  constructor(type, data) {
    this.type = type;
    this.data = data;
  }
}

// Numbers written at a fixed width whatever their value (redisbuf's per-item scalars).
export class Fixed {
  constructor(kind, value) {
    this.kind = kind; // 'float64' | 'int64' | 'uint64' | 'bool'
    this.value = value;
  }
}

function strHeader(length) {
  if (length < 32) return Buffer.from([0xa0 | length]);
  if (length < 0x100) return Buffer.from([0xd9, length]);
  if (length < 0x10000) return Buffer.from([0xda, length >> 8, length & 0xff]);
  const b = Buffer.alloc(5);
  b[0] = 0xdb;
  b.writeUInt32BE(length, 1);
  return b;
}

function extHeader(type, length) {
  if (length <= 0xff) return Buffer.from([0xc7, length, type]);
  if (length <= 0xffff) return Buffer.from([0xc8, length >> 8, length & 0xff, type]);
  const b = Buffer.alloc(6);
  b[0] = 0xc9;
  b.writeUInt32BE(length, 1);
  b[5] = type;
  return b;
}

function encodeInto(value, parts) {
  if (value === null || value === undefined) {
    parts.push(Buffer.from([0xc0]));
  } else if (value === true || value === false) {
    parts.push(Buffer.from([value ? 0xc3 : 0xc2]));
  } else if (value instanceof Fixed) {
    if (value.kind === 'bool') {
      parts.push(Buffer.from([value.value ? 0xc3 : 0xc2]));
      return;
    }
    const b = Buffer.alloc(9);
    if (value.kind === 'float64') {
      b[0] = 0xcb;
      b.writeDoubleBE(Number(value.value), 1);
    } else if (value.kind === 'int64') {
      b[0] = 0xd3;
      b.writeBigInt64BE(BigInt(value.value), 1);
    } else if (value.kind === 'uint64') {
      b[0] = 0xcf;
      b.writeBigUInt64BE(BigInt(value.value), 1);
    } else {
      throw new TypeError(`unknown fixed-width kind ${value.kind}`);
    }
    parts.push(b);
  } else if (typeof value === 'number') {
    // plain numbers as float64 (the only width redisbuf's scalars use for floats)
    encodeInto(new Fixed(Number.isInteger(value) ? 'int64' : 'float64', value), parts);
  } else if (typeof value === 'bigint') {
    encodeInto(new Fixed(value < 0n ? 'int64' : 'uint64', value), parts);
  } else if (typeof value === 'string') {
    const s = Buffer.from(value, 'utf8');
    parts.push(strHeader(s.length), s);
  } else if (value instanceof Ext) {
    parts.push(extHeader(value.type, value.data.length), value.data);
  } else if (Buffer.isBuffer(value) || value instanceof Uint8Array) {
    const n = value.length;
    if (n < 0x100) parts.push(Buffer.from([0xc4, n]));
    else if (n < 0x10000) parts.push(Buffer.from([0xc5, n >> 8, n & 0xff]));
    else {
      const b = Buffer.alloc(5);
      b[0] = 0xc6;
      b.writeUInt32BE(n, 1);
      parts.push(b);
    }
    parts.push(Buffer.from(value.buffer, value.byteOffset, value.byteLength));
  } else if (Array.isArray(value)) {
    if (value.length < 16) parts.push(Buffer.from([0x90 | value.length]));
    else parts.push(Buffer.from([0xdc, value.length >> 8, value.length & 0xff]));
    for (const item of value) encodeInto(item, parts);
  } else if (value instanceof Map || typeof value === 'object') {
    const entries = value instanceof Map ? [...value.entries()] : Object.entries(value);
    if (entries.length < 16) parts.push(Buffer.from([0x80 | entries.length]));
    else parts.push(Buffer.from([0xde, entries.length >> 8, entries.length & 0xff]));
    for (const [k, v] of entries) {
      encodeInto(k, parts);
      encodeInto(v, parts);
    }
  } else {
    throw new TypeError(`cannot encode ${typeof value}`);
  }
}

export function encode(value) {
  const parts = [];
  encodeInto(value, parts);
  return Buffer.concat(parts);
}

// Decode one msgpack value; ext values come back as Ext (data: a Buffer view, no copy).
export function decode(buf) {
  let pos = 0;
  const need = (n) => {
    if (pos + n > buf.length) throw new RangeError('msgpack value truncated');
  };
  const read = () => {
    need(1);
    const t = buf[pos++];
    if (t < 0x80) return t;
    if (t >= 0xe0) return t - 0x100;
    if ((t & 0xf0) === 0x80) return map(t & 0x0f);
    if ((t & 0xf0) === 0x90) return array(t & 0x0f);
    if ((t & 0xe0) === 0xa0) return str(t & 0x1f);
    const u = (n) => {
      need(n);
      const v = n === 1 ? buf[pos] : n === 2 ? buf.readUInt16BE(pos) : buf.readUInt32BE(pos);
      pos += n;
      return v;
    };
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return bin(u(1));
      case 0xc5: return bin(u(2));
      case 0xc6: return bin(u(4));
      case 0xc7: { const n = u(1); return ext(u(1) << 24 >> 24, n); }
      case 0xc8: { const n = u(2); return ext(u(1) << 24 >> 24, n); }
      case 0xc9: { const n = u(4); return ext(u(1) << 24 >> 24, n); }
      case 0xca: need(4); pos += 4; return buf.readFloatBE(pos - 4);
      case 0xcb: need(8); pos += 8; return buf.readDoubleBE(pos - 8);
      case 0xcc: return u(1);
      case 0xcd: return u(2);
      case 0xce: return u(4);
      case 0xcf: need(8); pos += 8; return num(buf.readBigUInt64BE(pos - 8));
      case 0xd0: need(1); pos += 1; return buf.readInt8(pos - 1);
      case 0xd1: need(2); pos += 2; return buf.readInt16BE(pos - 2);
      case 0xd2: need(4); pos += 4; return buf.readInt32BE(pos - 4);
      case 0xd3: need(8); pos += 8; return num(buf.readBigInt64BE(pos - 8));
      case 0xd4: return ext(u(1) << 24 >> 24, 1);
      case 0xd5: return ext(u(1) << 24 >> 24, 2);
      case 0xd6: return ext(u(1) << 24 >> 24, 4);
      case 0xd7: return ext(u(1) << 24 >> 24, 8);
      case 0xd8: return ext(u(1) << 24 >> 24, 16);
      case 0xd9: return str(u(1));
      case 0xda: return str(u(2));
      case 0xdb: return str(u(4));
      case 0xdc: return array(u(2));
      case 0xdd: return array(u(4));
      case 0xde: return map(u(2));
      case 0xdf: return map(u(4));
      default: throw new RangeError(`unsupported msgpack type 0x${t.toString(16)}`);
    }
  };
  // 64-bit integers as numbers when exact, else as BigInt
  const num = (big) => (big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big);
  const str = (n) => { need(n); pos += n; return buf.toString('utf8', pos - n, pos); };
  const bin = (n) => { need(n); pos += n; return buf.subarray(pos - n, pos); };
  const ext = (type, n) => { need(n); pos += n; return new Ext(type, buf.subarray(pos - n, pos)); };
  const array = (n) => { const out = []; for (let i = 0; i < n; i++) out.push(read()); return out; };
  const map = (n) => { const out = {}; for (let i = 0; i < n; i++) { const k = read(); out[k] = read(); } return out; };
  const value = read();
  if (pos !== buf.length) throw new RangeError(`${buf.length - pos} bytes after the msgpack value`);
  return value;
}
