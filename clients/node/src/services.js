// The .proto files the client is built from and what it derives from them: where they are
// (PROTO_DIR), the services as proto-loader definitions with the client's field shapes
// (loadServices), and gRPC's own retry of the idempotent calls (serviceConfig). The limits
// every call shares (MAX_MESSAGE, REPLY_FIELD, RETRY) are named here too.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';

import * as protoLoader from '@grpc/proto-loader';

import { fromWire, loadRoot, toWire } from './convert.js';
import { IDEMPOTENT, methodName, serviceProperty } from './naming.js';

const here = path.dirname(fileURLToPath(import.meta.url));

export const MAX_MESSAGE = 64 * 1024 * 1024;
/**
 * The request field by which a caller tells the server the largest reply it accepts: without
 * it a server answers at most 4 MiB (gRPC's default receive limit). This client receives up to
 * MAX_MESSAGE, so every request that has the field says so, unless the caller set it.
 */
export const REPLY_FIELD = 'maxReplyBytes'; // max_reply_bytes in the .proto
export const RETRY = { maxAttempts: 5, initialBackoffMs: 100, maxBackoffMs: 2000, multiplier: 2 };

function findProtoDir() {
  if (process.env.SANDBOXD_PROTO_DIR) return process.env.SANDBOXD_PROTO_DIR;
  const shipped = path.resolve(here, '../proto'); // inside the installed package
  if (fs.existsSync(path.join(shipped, 'sandboxd/v1'))) return shipped;
  return path.resolve(here, '../../../proto'); // a checkout of the repository
}

/** Where the .proto files are: $SANDBOXD_PROTO_DIR, the package's proto/, or the repository's. */
export const PROTO_DIR = findProtoDir();

/**
 * The services of sandboxd.v1 as proto-loader definitions:
 * [{name, fullName, property, methods: [{name, method, path, requestStream, responseStream, ...}]}].
 */
export function loadServices(dir = PROTO_DIR) {
  const files = fs
    .readdirSync(path.join(dir, 'sandboxd/v1'))
    .filter((f) => f.endsWith('.proto'))
    .sort()
    .map((f) => `sandboxd/v1/${f}`);
  const definition = protoLoader.loadSync(files, {
    includeDirs: [dir],
    keepCase: false, // camelCase field names (sessionId): JavaScript's, as protobuf's JSON
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const root = loadRoot(dir); // the same files, for the Timestamp/Duration/FieldMask shapes
  const services = [];
  for (const [fullName, def] of Object.entries(definition)) {
    if (!fullName.startsWith('sandboxd.v1.') || typeof def.format === 'string') continue;
    const name = fullName.slice('sandboxd.v1.'.length);
    const service = root.lookupService(fullName);
    const methods = Object.entries(def).map(([rpc, m]) => {
      const { resolvedRequestType: req, resolvedResponseType: resp } = service.methods[rpc];
      return {
        ...m,
        name: rpc,
        method: methodName(rpc),
        takesReplyLimit: (m.requestType?.type?.field ?? []).some((f) => f.name === REPLY_FIELD),
        requestSerialize: (obj) => m.requestSerialize(toWire(obj, req)),
        responseDeserialize: (buf) => fromWire(m.responseDeserialize(buf), resp),
      };
    });
    services.push({ name, fullName, property: serviceProperty(name), methods });
  }
  return services;
}

/** gRPC's own retry (service config): idempotent calls retry UNAVAILABLE with backoff + jitter. */
export function serviceConfig(services) {
  const names = [];
  for (const s of services) {
    for (const m of s.methods) {
      if (IDEMPOTENT.has(`${s.fullName}/${m.name}`)) names.push({ service: s.fullName, method: m.name });
    }
  }
  return JSON.stringify({
    methodConfig: [
      {
        name: names,
        retryPolicy: {
          maxAttempts: RETRY.maxAttempts,
          initialBackoff: `${RETRY.initialBackoffMs / 1000}s`,
          maxBackoff: `${RETRY.maxBackoffMs / 1000}s`,
          backoffMultiplier: RETRY.multiplier,
          retryableStatusCodes: ['UNAVAILABLE'],
        },
      },
    ],
  });
}
