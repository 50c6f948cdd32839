// The client's JavaScript shapes of protobuf's well-known types, both ways, so a caller never
// meets the wire's {seconds, nanos} pairs: a google.protobuf.Timestamp is a Date, a Duration a
// number of seconds (as every `timeout` option is), a FieldMask's paths are camelCase like the
// fields they name. Field names are camelCase throughout (the loaders' default); the wire is
// unchanged (protobuf encodes field numbers, and a FieldMask's paths go out in the .proto's
// snake_case, which the server reads).
import fs from 'node:fs';
import path from 'node:path';
import protobuf from 'protobufjs';

const TIMESTAMP = '.google.protobuf.Timestamp';
const DURATION = '.google.protobuf.Duration';
const FIELD_MASK = '.google.protobuf.FieldMask';
const KIND = { [TIMESTAMP]: 'timestamp', [DURATION]: 'duration', [FIELD_MASK]: 'mask' };

const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const eachSegment = (paths, fn) => (paths ?? []).map((p) => p.split('.').map(fn).join('.'));

/** The .proto files of sandboxd.v1 under `dir` as one resolved protobufjs Root (camelCase). */
export function loadRoot(dir) {
  const root = new protobuf.Root();
  // google/protobuf/*.proto are protobufjs' own copies; everything else is under dir.
  root.resolvePath = (_origin, target) =>
    target.startsWith('google/protobuf/') ? target : path.join(dir, target);
  const files = fs
    .readdirSync(path.join(dir, 'sandboxd/v1'))
    .filter((f) => f.endsWith('.proto'))
    .sort();
  root.loadSync(
    files.map((f) => `sandboxd/v1/${f}`),
    { keepCase: false },
  );
  root.resolveAll();
  return root;
}

const plans = new WeakMap();

/**
 * The fields of `type` that hold, at any depth, a well-known type reshaped here: only those are
 * walked, so a message without one (most) passes through untouched.
 */
function plan(type) {
  let steps = plans.get(type);
  if (steps) return steps;
  steps = [];
  plans.set(type, steps); // a recursive type sees its own (filling) plan
  for (const f of type.fieldsArray) {
    const t = f.resolvedType;
    if (!(t instanceof protobuf.Type)) continue;
    const kind = KIND[t.fullName] ?? 'message';
    if (kind === 'message' && !plan(t).length && t !== type) continue;
    steps.push({ name: f.name, kind, type: t, map: Boolean(f.map), repeated: f.repeated });
  }
  return steps;
}

function walk(obj, type, leaf) {
  const steps = plan(type);
  if (!steps.length || obj == null || typeof obj !== 'object') return obj;
  const one = (v, s) => (v == null ? v : s.kind === 'message' ? walk(v, s.type, leaf) : leaf[s.kind](v));
  let copy = null;
  for (const s of steps) {
    const v = obj[s.name];
    if (v == null) continue;
    let next;
    if (s.map) next = Object.fromEntries(Object.entries(v).map(([k, x]) => [k, one(x, s)]));
    else if (s.repeated) next = Array.isArray(v) ? v.map((x) => one(x, s)) : v;
    else next = one(v, s);
    if (next !== v) {
      copy ??= { ...obj }; // the caller's request is never changed
      copy[s.name] = next;
    }
  }
  return copy ?? obj;
}

const OUT = {
  timestamp(v) {
    if (!(v instanceof Date) && typeof v !== 'number') return v;
    const ms = v instanceof Date ? v.getTime() : v;
    const seconds = Math.floor(ms / 1000);
    return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
  },
  duration(v) {
    if (typeof v !== 'number') return v;
    let seconds = Math.trunc(v);
    let nanos = Math.round((v - seconds) * 1e9);
    if (Math.abs(nanos) >= 1e9) {
      seconds += Math.sign(nanos);
      nanos = 0;
    }
    return { seconds, nanos };
  },
  mask(v) {
    return { ...v, paths: eachSegment(v.paths, snake) };
  },
};

const IN = {
  timestamp: (v) => new Date(Number(v.seconds) * 1000 + Math.floor(Number(v.nanos) / 1e6)),
  duration: (v) => Number(v.seconds) + Number(v.nanos) / 1e9,
  mask: (v) => ({ paths: eachSegment(v.paths, camel) }),
};

/** A request as the caller wrote it (Dates, seconds) -> what protobufjs encodes. */
export function toWire(obj, type) {
  return walk(obj, type, OUT);
}

/** A decoded reply -> the client's shape: Dates, seconds, camelCase mask paths. */
export function fromWire(obj, type) {
  return walk(obj, type, IN);
}
