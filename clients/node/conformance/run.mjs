// Runs tests/clients/conformance.json through the Node client against SANDBOXD_ADDR, printing
// `STEP <id> ok` per passed step. The client module is $SANDBOXD_CLIENT_MODULE (a path or
// '@sandboxd/client', as installed from the tarball) or this checkout's src/index.js. The
// scenario's JSON keeps the .proto's names (session_id); the client's are camelCase.
//   node conformance/run.mjs ../../tests/clients/conformance.json
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const moduleName = process.env.SANDBOXD_CLIENT_MODULE || path.join(here, '../src/index.js');
const sbx = await import(moduleName.startsWith('/') ? pathToFileURL(moduleName).href : moduleName);

const specPath = process.argv[2];
if (!specPath) throw new Error('usage: run.mjs CONFORMANCE_JSON');
const run = randomBytes(4).toString('hex');
const spec = JSON.parse(fs.readFileSync(specPath, 'utf8').replaceAll('{run}', run));
const steps = Object.fromEntries(spec.steps.map((s) => [s.id, s]));
const labels = spec.labels;

const client = new sbx.SandboxClient(process.env.SANDBOXD_ADDR, { timeout: 60 });
const code = (name) => GRPC_CODES[name];
const GRPC_CODES = {
  INVALID_ARGUMENT: 3,
  NOT_FOUND: 5,
  PERMISSION_DENIED: 7,
  FAILED_PRECONDITION: 9,
};

async function collect(events) {
  const all = [];
  for await (const ev of events) all.push(ev);
  const text = (stream) =>
    Buffer.concat(all.filter((e) => e.type === 'output' && e.stream === stream).map((e) => e.data)).toString();
  return { all, stdout: text('stdout'), stderr: text('stderr'), last: all.at(-1) };
}

async function expectError(promise, { code: name, reason }) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof sbx.SandboxError, `${err}`);
    assert.equal(err.code, code(name), `${err.message}`);
    assert.equal(err.reason, reason);
    return true;
  });
}

function ok(id) {
  console.log(`STEP ${id} ok`);
}

let session;
try {
  let s = steps.server_info;
  const info = await client.serverInfo();
  assert.ok(info.version);
  assert.ok(client.server, 'the first-use check keeps GetServerInfo');
  ok(s.id);

  s = steps.create;
  const request = {
    sessionId: s.session_id,
    shell: { allow: s.allow },
    workspace: { files: [{ path: s.workspace_file.path, content: Buffer.from(s.workspace_file.content) }] },
    labels,
  };
  session = await client.createSession(request);
  assert.equal(session.id, s.session_id);
  assert.equal(session.state, s.expect.state);
  const again = await client.createSession(request);
  assert.equal(again.id, session.id);
  ok(s.id);

  s = steps.exec_stream;
  let r = await collect(session.exec(s.argv));
  assert.equal(r.all[0].type, 'started');
  assert.ok(r.all[0].processId);
  assert.equal(r.last.type, 'exited');
  assert.equal(r.last.exitCode, s.expect.exit_code);
  assert.equal(r.stdout, s.expect.stdout);
  assert.equal(r.stderr, s.expect.stderr);
  ok(s.id);

  s = steps.exec_stdin;
  r = await collect(session.exec(s.argv, { stdin: s.stdin }));
  assert.equal(r.stdout, s.expect.stdout);
  assert.equal(r.last.exitCode, s.expect.exit_code);
  ok(s.id);

  s = steps.run;
  const ran = await session.run(s.argv);
  assert.equal(ran.exitCode, s.expect.exit_code);
  assert.equal(ran.stdout.toString(), s.expect.stdout);
  ok(s.id);

  s = steps.files;
  await session.writeFile(s.write.path, s.write.content, { makeParents: true });
  assert.equal((await session.readFile(s.write.path)).toString(), s.write.content);
  assert.equal((await session.stat(s.write.path)).size, s.expect.size);
  await session.makeDir(s.make_dir, { parents: true });
  const listed = (await session.listDir('', { depth: 3 })).map((e) => e.path);
  for (const p of s.expect.listed) assert.ok(listed.includes(p), `${p} not in ${listed}`);
  await session.remove(s.remove_dir, { recursive: true });
  ok(s.id);

  s = steps.export_import;
  const parts = [];
  for await (const chunk of session.exportArchive(s.export_path)) parts.push(chunk);
  const tar = Buffer.concat(parts);
  const chunks = [];
  for (let i = 0; i < tar.length; i += 1000) chunks.push(tar.subarray(i, i + 1000));
  const imported = await session.importArchive(chunks, s.import_path);
  assert.ok(imported.files >= s.expect.min_files);
  assert.equal((await session.readFile(s.expect.read_path)).toString(), s.expect.content);
  ok(s.id);

  s = steps.background;
  const proc = await session.startProcess(s.argv, { processId: s.process_id });
  assert.equal(proc.processId, s.process_id);
  assert.ok((await session.listProcesses()).some((p) => p.processId === s.process_id));
  r = await collect(session.attach(s.process_id));
  assert.equal(r.stdout, s.expect.stdout);
  assert.equal(r.last.type, 'exited');
  assert.equal(r.last.exitCode, s.expect.exit_code);
  r = await collect(session.attach(s.process_id, { stdoutOffset: s.stdout_offset }));
  assert.equal(r.stdout, s.expect.tail);
  ok(s.id);

  s = steps.snapshot_fork;
  const snap = await session.snapshot(labels);
  assert.equal((await client.snapshots.getSnapshot({ snapshotId: snap.snapshotId })).snapshot.snapshotId, snap.snapshotId);
  const fork = await client.forkSession(snap.snapshotId, { labels });
  try {
    assert.notEqual(fork.id, session.id);
    assert.equal((await fork.readFile(s.expect.read_path)).toString(), s.expect.content);
  } finally {
    await fork.delete();
  }
  await client.snapshots.deleteSnapshot({ snapshotId: snap.snapshotId });
  ok(s.id);

  s = steps.errors;
  for (const c of s.cases) {
    if (c.call === 'ReadFile') await expectError(session.readFile(c.path), c);
    else if (c.call === 'Run') await expectError(session.run(c.argv), c);
    else if (c.call === 'GetSession') await expectError(client.getSession(c.session_id), c);
    else throw new Error(`unknown error case ${c.call}`);
  }
  ok(s.id);

  s = steps.delete;
  await session.delete();
  await expectError(client.getSession(session.id), s.expect);
  await session.delete();
  session = null;
  ok(s.id);
} finally {
  if (session) await session.delete().catch(() => {});
  client.close();
}
