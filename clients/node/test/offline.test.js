// Client behaviour that needs a server misbehaving on purpose: small in-process gRPC servers
// (not sandboxd) answer GetServerInfo with another API version, fail calls with UNAVAILABLE a
// set number of times, or implement no sandboxd service at all. No live sandboxd needed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';

import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import * as sbx from '../src/index.js';
import { encodeStatus } from './status-util.mjs';
import { generate, generateReasons } from '../scripts/gen-types.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

// The fake servers keep the .proto's own field names (keepCase), as a server in any other
// language sees the wire: the client's camelCase, Dates and seconds are its surface alone.
function definitions() {
  const files = fs.readdirSync(path.join(sbx.PROTO_DIR, 'sandboxd/v1')).map((f) => `sandboxd/v1/${f}`);
  const opts = { includeDirs: [sbx.PROTO_DIR], keepCase: true, longs: Number, enums: String, defaults: true };
  return grpc.loadPackageDefinition(protoLoader.loadSync(files, opts)).sandboxd.v1;
}

/** Starts a gRPC server with `impls` ({ServiceName: {Method: handler}}) on a free port. */
async function serve(impls) {
  const v1 = definitions();
  const server = new grpc.Server();
  for (const [name, impl] of Object.entries(impls)) server.addService(v1[name].service, impl);
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  return { address: `127.0.0.1:${port}`, close: () => server.forceShutdown() };
}

const info = (apiVersion) => (_call, cb) => cb(null, { version: 'fake', api_version: apiVersion });
const unavailable = (message) => ({ code: grpc.status.UNAVAILABLE, details: message });

test('src/rpc.d.ts and src/reasons.* are what scripts/gen-types.mjs makes of the protos', () => {
  const read = (f) => fs.readFileSync(path.join(here, '../src', f), 'utf8');
  const { js, dts } = generateReasons();
  assert.equal(read('rpc.d.ts'), generate(), 'run `npm run gen:types`');
  assert.equal(read('reasons.js'), js, 'run `npm run gen:types`');
  assert.equal(read('reasons.d.ts'), dts, 'run `npm run gen:types`');
});

test('every ErrorReason has its class, under its code class', () => {
  const text = fs.readFileSync(path.join(sbx.PROTO_DIR, 'sandboxd/v1/errors.proto'), 'utf8');
  const names = [...text.matchAll(/ERROR_REASON_([A-Z0-9_]+) = \d+;/g)].map((m) => m[1]);
  assert.deepEqual(Object.keys(sbx.REASONS).sort(), names.filter((n) => n !== 'UNSPECIFIED').sort());
  const e = sbx.fromGrpcError({ code: grpc.status.NOT_FOUND, details: 'gone', metadata: null });
  assert.ok(e instanceof sbx.NotFound && e.reason === 'NOT_FOUND' && !e.retryable);
  assert.ok(sbx.SessionNotFoundError.prototype instanceof sbx.NotFound);
  assert.ok(sbx.EngineUnavailableError.prototype instanceof sbx.Unavailable);
  assert.equal(sbx.REASONS.FILE_TOO_LARGE.error, sbx.FileTooLargeError);
  assert.equal(sbx.REASONS.ENGINE_CONFLICT.retryable, true);
});

test('every RPC of every service is a client method of its kind', () => {
  const client = new sbx.SandboxClient('127.0.0.1:1', { checkServer: false });
  try {
    const v1 = definitions();
    let count = 0;
    for (const [name, ctor] of Object.entries(v1)) {
      if (!ctor.service) continue;
      const property = sbx.serviceProperty(name);
      for (const rpc of Object.keys(ctor.service)) {
        assert.equal(typeof client[property]?.[sbx.methodName(rpc)], 'function', `${name}/${rpc}`);
        count += 1;
      }
    }
    assert.ok(count >= 31, `${count} RPCs`);
  } finally {
    client.close();
  }
});

test('a server of another major API version is refused with IncompatibleServer', async () => {
  const srv = await serve({ AdminService: { GetServerInfo: info('v2'), Sweep: () => {} } });
  const client = new sbx.SandboxClient(srv.address, { timeout: 5 });
  try {
    await assert.rejects(client.sessions.getSession({ sessionId: 'x' }), (err) => {
      assert.ok(err instanceof sbx.IncompatibleServer, String(err));
      assert.equal(err.reason, 'API_VERSION_MISMATCH');
      assert.match(err.message, /v2/);
      return true;
    });
  } finally {
    client.close();
    srv.close();
  }
});

test('a gRPC server that is not sandboxd is refused with IncompatibleServer', async () => {
  const srv = await serve({ SnapshotService: {} }); // any service but AdminService
  const client = new sbx.SandboxClient(srv.address, { timeout: 5 });
  try {
    const started = Date.now();
    await assert.rejects(client.createSession({}), (err) => {
      assert.ok(err instanceof sbx.IncompatibleServer, String(err));
      assert.equal(err.reason, 'NOT_SANDBOXD');
      assert.equal(err.code, grpc.status.UNIMPLEMENTED);
      return true;
    });
    assert.ok(Date.now() - started < 5000);
  } finally {
    client.close();
    srv.close();
  }
});

test('a closed port fails Unavailable within the deadline, for unary calls and streams', async () => {
  const port = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const client = new sbx.SandboxClient(`127.0.0.1:${port}`, { timeout: 3 });
  try {
    const started = Date.now();
    await assert.rejects(client.serverInfo(), (err) => err instanceof sbx.Unavailable && /cannot reach/.test(err.message));
    await assert.rejects(
      (async () => {
        for await (const _ of client.processes.exec({ sessionId: 'x', argv: ['true'] }, { timeout: 3 })) {
          /* never */
        }
      })(),
      sbx.Unavailable,
    );
    assert.ok(Date.now() - started < 7000, `${Date.now() - started} ms`);
  } finally {
    client.close();
  }
});

test('a server that never answers: the deadline, not a hang', async () => {
  const sockets = [];
  const silent = net.createServer((s) => sockets.push(s)).listen(0, '127.0.0.1'); // never speaks
  await new Promise((r) => silent.once('listening', r));
  const client = new sbx.SandboxClient(`127.0.0.1:${silent.address().port}`, { timeout: 1 });
  try {
    const started = Date.now();
    await assert.rejects(client.serverInfo(), sbx.SandboxError);
    assert.ok(Date.now() - started < 4000, `${Date.now() - started} ms`);
  } finally {
    client.close();
    for (const s of sockets) s.destroy();
    silent.close();
  }
});

test('an AbortSignal cancels a call with Cancelled', async () => {
  const srv = await serve({
    AdminService: { GetServerInfo: info('v1'), Sweep: () => {} },
    SessionService: { GetSession: () => {} }, // never answers
  });
  const client = new sbx.SandboxClient(srv.address, { timeout: 30 });
  try {
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 200);
    await assert.rejects(client.sessions.getSession({ sessionId: 'x' }, { signal: ac.signal }), sbx.Cancelled);
  } finally {
    client.close();
    srv.close();
  }
});

/** A server whose calls fail UNAVAILABLE (or as `fail` says) `failures` times, then succeed. */
async function flaky(failures, fail = () => unavailable('try again')) {
  const calls = { GetSession: 0, Run: 0, CreateSession: 0, Remove: 0 };
  const answer = (name, ok) => (_call, cb) => {
    calls[name] += 1;
    if (calls[name] <= failures) cb(fail());
    else cb(null, ok);
  };
  const srv = await serve({
    AdminService: { GetServerInfo: info('v1'), Sweep: () => {} },
    SessionService: {
      GetSession: answer('GetSession', { session: { session_id: 's' } }),
      CreateSession: answer('CreateSession', { session: { session_id: 's' } }),
    },
    ProcessService: { Run: answer('Run', { exit_code: 0 }) },
    FilesystemService: { Remove: answer('Remove', {}) },
  });
  return { ...srv, calls };
}

test('idempotent calls retry UNAVAILABLE; non-idempotent calls never retry', async () => {
  const srv = await flaky(2);
  const client = new sbx.SandboxClient(srv.address, { timeout: 10 });
  try {
    assert.equal((await client.sessions.getSession({ sessionId: 's' })).session.sessionId, 's');
    assert.equal(srv.calls.GetSession, 3);
    await assert.rejects(client.processes.run({ sessionId: 's', argv: ['x'] }), sbx.Unavailable);
    assert.equal(srv.calls.Run, 1);
    await assert.rejects(client.files.remove({ sessionId: 's', path: 'x' }), sbx.Unavailable);
    assert.equal(srv.calls.Remove, 1);
    // CreateSession: retried only with a caller-chosen id
    await assert.rejects(client.sessions.createSession({}), sbx.Unavailable);
    assert.equal(srv.calls.CreateSession, 1);
    await client.sessions.createSession({ sessionId: 'mine' });
    assert.equal(srv.calls.CreateSession, 3);
  } finally {
    client.close();
    srv.close();
  }
});

for (const [what, reason, metadata] of [
  ['a reason errors.proto declares retryable', 'ENGINE_CONFLICT', {}],
  ['an error the server marks retry=true', 'SESSION_NOT_RUNNING', { retry: 'true' }],
]) {
  test(`${what} (code FAILED_PRECONDITION, out of gRPC's own policy) is retried`, async () => {
    const fail = () => ({
      code: grpc.status.FAILED_PRECONDITION,
      details: 'busy',
      metadata: encodeStatus(grpc.status.FAILED_PRECONDITION, 'busy', reason, metadata),
    });
    const srv = await flaky(2, fail);
    const client = new sbx.SandboxClient(srv.address, { timeout: 10 });
    try {
      await client.sessions.getSession({ sessionId: 's' });
      assert.equal(srv.calls.GetSession, 3);
      await assert.rejects(client.processes.run({ sessionId: 's', argv: ['x'] }), (err) => {
        assert.ok(err instanceof sbx.FailedPrecondition);
        assert.ok(err instanceof sbx.REASONS[reason].error);
        assert.equal(err.reason, reason);
        assert.equal(err.retryable, true);
        return true;
      });
      assert.equal(srv.calls.Run, 1);
    } finally {
      client.close();
      srv.close();
    }
  });
}

test('idempotent server streams retry before their first message; exec never', async () => {
  const calls = { ExportArchive: 0, Exec: 0 };
  const srv = await serve({
    AdminService: { GetServerInfo: info('v1'), Sweep: () => {} },
    SnapshotService: {
      ExportArchive: (call) => {
        calls.ExportArchive += 1;
        if (calls.ExportArchive <= 2) return call.emit('error', unavailable('not yet'));
        call.write({ chunk: { data: Buffer.from('ab') } });
        call.write({ chunk: { data: Buffer.from('cd') } });
        call.end();
      },
    },
    ProcessService: {
      Exec: (call) => {
        calls.Exec += 1;
        call.emit('error', unavailable('not yet'));
      },
    },
  });
  const client = new sbx.SandboxClient(srv.address, { timeout: 10 });
  try {
    const chunks = [];
    for await (const m of client.snapshots.exportArchive({ sessionId: 's' })) chunks.push(m.chunk.data);
    assert.equal(Buffer.concat(chunks).toString(), 'abcd');
    assert.equal(calls.ExportArchive, 3);
    await assert.rejects(
      (async () => {
        for await (const _ of client.processes.exec({ sessionId: 's', argv: ['true'] })) {
          /* never */
        }
      })(),
      sbx.Unavailable,
    );
    assert.equal(calls.Exec, 1);
  } finally {
    client.close();
    srv.close();
  }
});

test('retries stop at the deadline', async () => {
  const srv = await flaky(1000);
  const client = new sbx.SandboxClient(srv.address, { timeout: 1.5 });
  try {
    const started = Date.now();
    await assert.rejects(client.sessions.getSession({ sessionId: 's' }), sbx.SandboxError);
    assert.ok(Date.now() - started < 3000);
    assert.ok(srv.calls.GetSession >= 2 && srv.calls.GetSession <= 5, `${srv.calls.GetSession}`);
  } finally {
    client.close();
    srv.close();
  }
});



test('camelCase fields, Dates and seconds on the client; the names and shapes of the .proto on the wire', async () => {
  const seen = {};
  const created = { seconds: 1_700_000_000, nanos: 250_000_000 };
  const srv = await serve({
    AdminService: { GetServerInfo: info('v1'), Sweep: () => {} },
    SessionService: {
      RenewLease: (call, cb) => {
        seen.renew = call.request;
        cb(null, { session: { session_id: call.request.session_id, created_at: created } });
      },
      UpdateNetworkPolicy: (call, cb) => {
        seen.update = call.request;
        cb(null, { session: { session_id: 's-1', network: { allowed_domains: ['example.org'] } } });
      },
    },
    ProcessService: {
      Run: (call, cb) => {
        seen.run = call.request;
        cb(null, { exit_code: 3, process_id: 'p-1', duration: { seconds: 2, nanos: 500_000_000 } });
      },
    },
  });
  const client = new sbx.SandboxClient(srv.address, { timeout: 10 });
  try {
    const renewed = await client.sessions.renewLease({ sessionId: 's-1', ttl: 90.25 });
    assert.equal(seen.renew.session_id, 's-1');
    assert.deepEqual(seen.renew.ttl, { seconds: 90, nanos: 250_000_000 });
    assert.equal(renewed.session.sessionId, 's-1');
    assert.ok(renewed.session.createdAt instanceof Date);
    assert.equal(renewed.session.createdAt.getTime(), 1_700_000_000_250);
    assert.equal(renewed.session.leaseExpiresAt, null); // unset: null, as every message field

    const session = new sbx.Session(client, renewed.session);
    const ran = await session.run(['true'], { timeout: 1.5, maxOutputBytes: 10 });
    assert.equal(seen.run.session_id, 's-1');
    assert.equal(seen.run.max_output_bytes, 10);
    assert.deepEqual(seen.run.timeout, { seconds: 1, nanos: 500_000_000 });
    assert.equal(seen.run.max_reply_bytes, 64 * 1024 * 1024);
    assert.deepEqual([ran.exitCode, ran.processId, ran.duration], [3, 'p-1', 2.5]);

    const request = {
      sessionId: 's-1',
      network: { allowedDomains: ['example.org'] },
      updateMask: { paths: ['allowedDomains', 'quotas.maxConnections'] },
    };
    const updated = await client.sessions.updateNetworkPolicy(request);
    assert.deepEqual(seen.update.update_mask.paths, ['allowed_domains', 'quotas.max_connections']);
    assert.deepEqual(seen.update.network.allowed_domains, ['example.org']);
    assert.deepEqual(request.updateMask.paths, ['allowedDomains', 'quotas.maxConnections']); // untouched
    assert.deepEqual(updated.session.network.allowedDomains, ['example.org']);
  } finally {
    client.close();
    srv.close();
  }
});
