// Runs against a live server: SANDBOXD_ADDR must name it (tests/clients/test_client_node.py sets it).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import * as sbx from '../src/index.js';

const addr = process.env.SANDBOXD_ADDR;
if (!addr) throw new Error('SANDBOXD_ADDR must name a running sandboxd');
const here = path.dirname(fileURLToPath(import.meta.url));

let client;
before(() => {
  client = new sbx.SandboxClient(addr, { timeout: 60 });
});
after(() => client.close());

test('create, exec streaming, run, files, list, renew, delete', async () => {
  const labels = { suite: `node-${randomBytes(4).toString('hex')}` };
  const session = await client.createSession({
    shell: { allow: ['sh', 'cat'] },
    workspace: { files: [{ path: 'hello.txt', content: Buffer.from('hello\n') }] },
    labels,
  });
  try {
    assert.equal(session.state, 'RUNNING');
    const events = [];
    for await (const ev of session.exec(['sh', '-c', 'echo out; echo err >&2; exit 3'])) {
      events.push(ev);
    }
    assert.equal(events[0].type, 'started');
    assert.ok(events[0].processId);
    const last = events.at(-1);
    assert.equal(last.type, 'exited');
    assert.equal(last.exitCode, 3);
    const text = (stream) =>
      Buffer.concat(events.filter((e) => e.type === 'output' && e.stream === stream).map((e) => e.data)).toString();
    assert.equal(text('stdout'), 'out\n');
    assert.equal(text('stderr'), 'err\n');

    const r = await session.run(['cat', 'hello.txt']);
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout.toString(), 'hello\n');

    await session.writeFile('notes/todo.txt', 'ship it\n', { makeParents: true });
    assert.equal((await session.readFile('notes/todo.txt')).toString(), 'ship it\n');
    assert.equal((await session.stat('notes/todo.txt')).size, 8);
    await session.makeDir('a/b', { parents: true });
    const names = (await session.listDir('', { depth: 3 })).map((e) => e.path);
    for (const n of ['hello.txt', 'notes/todo.txt', 'a/b']) assert.ok(names.includes(n), n);
    await session.remove('a', { recursive: true });

    const listed = [];
    for await (const s of client.listSessions(labels)) listed.push(s.id);
    assert.deepEqual(listed, [session.id]);

    const before = session.info.leaseExpiresAt;
    assert.ok(before instanceof Date && before.getTime() > Date.now(), String(before));
    await session.renew(3600);
    assert.ok(session.info.leaseExpiresAt.getTime() >= before.getTime());
  } finally {
    await session.delete();
  }
  await assert.rejects(client.getSession(session.id), (err) => {
    assert.ok(err instanceof sbx.SessionNotFoundError);
    assert.ok(err instanceof sbx.NotFound);
    assert.equal(err.reason, 'SESSION_NOT_FOUND');
    return true;
  });
});

test('errors are typed from the ErrorInfo reason', async () => {
  const session = await client.createSession({ shell: { allow: ['echo'] } });
  try {
    await assert.rejects(session.run(['rm', '-rf', '/workspace']), (err) => {
      assert.ok(err instanceof sbx.PermissionDenied, err.name);
      assert.equal(err.reason, 'COMMAND_NOT_ALLOWED');
      assert.equal(err.code, 7);
      return true;
    });
    await assert.rejects(
      (async () => {
        for await (const _ of session.exec(['rm', 'x'])) { /* fails when read */ }
      })(),
      sbx.PermissionDenied,
    );
    await assert.rejects(session.readFile('nope.txt'), (err) => err.reason === 'FILE_NOT_FOUND');
  } finally {
    await session.delete();
  }
  const down = new sbx.SandboxClient('127.0.0.1:1', { timeout: 5 });
  try {
    await assert.rejects(down.serverInfo(), (err) => err instanceof sbx.Unavailable && err.reason === 'UNAVAILABLE');
  } finally {
    down.close();
  }
});

test('server info', async () => {
  const info = await client.serverInfo();
  assert.ok(info.version);
  assert.equal(info.apiVersion, 'v1');
  assert.ok(info.features.length > 0);
  assert.equal(await client.hasFeature(info.features[0]), true);
  assert.equal(await client.hasFeature('no-such-feature'), false);
  assert.equal(info.assurance, 'ASSURANCE_ENFORCED');
});

test('the example streams exec output and exits with the remote code', () => {
  const r = spawnSync(process.execPath, [path.join(here, '../examples/exec-stream.js')], {
    env: { ...process.env, SANDBOXD_ADDR: addr },
    encoding: 'utf8',
    timeout: 60_000,
  });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout, 'line 1\nline 2\nline 3\n');
  assert.equal(r.stderr, 'done\n');
});

test('tar import and export', async () => {
  const session = await client.createSession({ shell: { allowAll: true } });
  try {
    // a one-member ustar archive, built by hand: header, content, two zero blocks
    const content = Buffer.from('tarred\n');
    const header = Buffer.alloc(512);
    header.write('t.txt', 0);
    header.write('0000644\0', 100);
    header.write('0000000\0', 108);
    header.write('0000000\0', 116);
    header.write(content.length.toString(8).padStart(11, '0') + '\0', 124);
    header.write('00000000000\0', 136);
    header.write('        ', 148);
    header.write('0', 156);
    header.write('ustar\0' + '00', 257);
    const sum = header.reduce((a, b) => a + b, 0);
    header.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
    const body = Buffer.alloc(512);
    content.copy(body);
    const tar = Buffer.concat([header, body, Buffer.alloc(1024)]);

    const done = await session.importArchive([tar.subarray(0, 700), tar.subarray(700)], 'in');
    assert.equal(done.files, 1);
    assert.equal(done.bytes, content.length);
    assert.equal((await session.readFile('in/t.txt')).toString(), 'tarred\n');

    const chunks = [];
    for await (const c of session.exportArchive('in')) chunks.push(c);
    assert.ok(Buffer.concat(chunks).includes(content));

    await assert.rejects(
      (async () => {
        for await (const _ of session.exportArchive('missing')) { /* fails when read */ }
      })(),
      sbx.SandboxError,
    );
  } finally {
    await session.delete();
  }
});

test('interact: a bidirectional stream fed from an async generator', async () => {
  const session = await client.createSession({ shell: { allow: ['cat'] } });
  try {
    async function* requests() {
      yield { start: { request: { sessionId: session.id, argv: ['cat'] } } };
      yield { stdin: { data: Buffer.from('typed in\n') } };
      yield { closeStdin: {} };
    }
    let out = '';
    let exit = null;
    for await (const resp of client.processes.interact(requests(), { timeout: 60 })) {
      if (resp.event === 'output') out += resp.output.data.toString();
      if (resp.event === 'exited') exit = resp.exited.exitCode;
    }
    assert.equal(out, 'typed in\n');
    assert.equal(exit, 0);
  } finally {
    await session.delete();
  }
});

test('session.interact: a terminal that outlives the command timeout, typed into as it runs', async () => {
  const session = await client.createSession({
    shell: { allowAll: true },
    limits: { commandTimeout: 1 }, // seconds
  });
  try {
    const term = session.interact(['sh'], { pty: { rows: 20, cols: 70 }, idleTimeout: 60 });
    let out = '';
    let exit = null;
    let typed = false;
    for await (const event of term) {
      if (event.type === 'output') out += event.data.toString();
      if (!typed && out.includes('$ ')) {
        typed = true;
        term.send('stty size; sleep 2; echo still-$((40+2)); exit 4\n');
      }
      if (event.type === 'exited') exit = event;
    }
    assert.match(out, /20 70/);
    assert.match(out, /still-42/);
    assert.equal(exit.exitCode, 4);
    assert.equal(exit.timedOut, false);
  } finally {
    await session.delete();
  }
});

test('uploadDir and downloadDir: a folder up and back, links and modes kept', async () => {
  const fs = await import('node:fs/promises');
  const os = await import('node:os');
  const src = await fs.mkdtemp(path.join(os.tmpdir(), 'sbx-up-'));
  const back = path.join(await fs.mkdtemp(path.join(os.tmpdir(), 'sbx-back-')), 'back');
  await fs.mkdir(path.join(src, 'src', 'pkg'), { recursive: true });
  await fs.writeFile(path.join(src, 'src', 'run.sh'), 'echo run\n', { mode: 0o755 });
  await fs.writeFile(path.join(src, 'src', 'pkg', 'secret'), 'only me', { mode: 0o600 });
  const big = randomBytes(3 * 1024 * 1024 + 5);
  await fs.writeFile(path.join(src, 'big.bin'), big);
  await fs.symlink('run.sh', path.join(src, 'src', 'latest'));
  const session = await client.createSession({
    shell: { allowAll: true },
    limits: { fileBytes: 4 * 1024 * 1024 },
  });
  try {
    let sent = 0;
    const done = await session.uploadDir(src, 'proj', { progress: (n) => (sent = n) });
    assert.ok(done.files >= 3 && sent >= big.length);
    const ran = await session.run([
      'sh', '-c', 'cd proj && sh src/run.sh && readlink src/latest && stat -c %a src/run.sh src/pkg/secret',
    ]);
    assert.equal(ran.stdout.toString(), 'run\nrun.sh\n755\n600\n');
    await session.downloadDir('proj', back);
    assert.ok((await fs.readFile(path.join(back, 'big.bin'))).equals(big));
    assert.equal(await fs.readlink(path.join(back, 'src', 'latest')), 'run.sh');
    assert.equal((await fs.stat(path.join(back, 'src', 'pkg', 'secret'))).mode & 0o777, 0o600);
  } finally {
    await session.delete();
  }
});

test('an AbortSignal ends a running exec with Cancelled', async () => {
  const session = await client.createSession({ shell: { allow: ['sleep'] } });
  try {
    const ac = new AbortController();
    const started = Date.now();
    await assert.rejects(
      (async () => {
        for await (const ev of session.exec(['sleep', '30'], { signal: ac.signal })) {
          if (ev.type === 'started') ac.abort();
        }
      })(),
      sbx.Cancelled,
    );
    assert.ok(Date.now() - started < 10_000);
  } finally {
    await session.delete();
  }
});

test('a client stream the server refuses early ends with its typed error, not a hang', async () => {
  const session = await client.createSession({ shell: { allow: ['sh'] } });
  try {
    async function* big() {
      for (let i = 0; i < 400; i++) yield Buffer.alloc(1 << 20, 1); // 400 MiB, never all sent
    }
    const started = Date.now();
    await assert.rejects(session.importArchive(big(), '../outside'), (err) => {
      assert.ok(err instanceof sbx.PathOutsideWorkspaceError, String(err));
      assert.ok(err instanceof sbx.InvalidArgument);
      return true;
    });
    assert.ok(Date.now() - started < 10_000);
  } finally {
    await session.delete();
  }
});

test('one handle for every process, streamed files and move', async () => {
  const session = await client.createSession({ shell: { allowAll: true } });
  try {
    const ran = await session.run(['sh', '-c', 'echo hi']);
    const got = await session.getProcess(ran.processId);
    assert.equal(got.origin, 'PROCESS_ORIGIN_RUN');
    assert.equal(got.state, 'PROCESS_STATE_EXITED');

    const cat = await session.startProcess(['cat'], { stdin: Buffer.from('a\n'), keepStdinOpen: true });
    assert.equal(cat.stdinOpen, true);
    await session.sendProcessInput(cat.processId, 'b\n');
    await session.closeProcessStdin(cat.processId);
    const out = [];
    for await (const ev of session.attach(cat.processId)) {
      if (ev.type === 'output') out.push(ev.data);
    }
    assert.equal(Buffer.concat(out).toString(), 'a\nb\n');

    const big = randomBytes(300_000);
    const info = await session.writeFileStream('d/big.bin', [big.subarray(0, 100_000), big.subarray(100_000)], {
      makeParents: true,
    });
    assert.equal(info.sizeBytes, big.length);
    const moved = await session.move('d/big.bin', 'big.bin');
    assert.equal(moved.path, 'big.bin');
    const back = [];
    for await (const chunk of session.readFileStream('big.bin', { offset: 10 })) back.push(chunk);
    assert.deepEqual(Buffer.concat(back), big.subarray(10));
  } finally {
    await session.delete();
  }
});

test('watchDir: events after onReady, typed refusals, leaving the loop ends the watch', async () => {
  const session = await client.createSession({ shell: { allowAll: true } });
  try {
    const missing = session.watchDir('missing');
    await assert.rejects(missing.next(), (err) => err.reason === 'FILE_NOT_FOUND');

    let ready;
    const inPlace = new Promise((resolve) => (ready = resolve));
    const events = session.watchDir('', { recursive: true, onReady: ready });
    const first = events.next(); // starts the call; the watch is in place once onReady runs
    await inPlace;
    await session.writeFile('node.txt', 'x');
    const { value } = await first;
    assert.equal(value.kind, 'FILE_EVENT_KIND_CREATED');
    assert.equal(value.path, 'node.txt');
    assert.equal(value.type, 'FILE_TYPE_FILE');
    assert.equal(Number(value.sequence), 1);
    await events.return(); // leaving ends the call
  } finally {
    await session.delete();
  }
});

test('a Run over a default 4 MiB reply: this client takes more, and says so', async () => {
  const session = await client.createSession({
    shell: { allow: ['sh', 'head'] },
    limits: { outputBytes: 16 * 1024 * 1024 },
  });
  try {
    const script = 'head -c 9000000 /dev/zero; head -c 9000000 /dev/zero >&2; exit 3';
    const r = await session.run(['sh', '-c', script], { maxOutputBytes: 16 * 1024 * 1024 });
    assert.equal(r.exitCode, 3);
    assert.ok(r.truncated);
    assert.ok(r.stdout.length + r.stderr.length > 4 * 1024 * 1024, `${r.stdout.length}+${r.stderr.length}`);
  } finally {
    await session.delete();
  }
});

test('an import refused at its first header is its own error every time', async () => {
  const session = await client.createSession({ shell: { allow: ['sh'] } });
  try {
    const size = 48 * 1024 * 1024;
    const header = Buffer.alloc(512);
    header.write('big.bin', 0);
    header.write('0000644\0', 100);
    header.write('0000000\0', 108);
    header.write('0000000\0', 116);
    header.write(size.toString(8).padStart(11, '0') + '\0', 124);
    header.write('00000000000\0', 136);
    header.write('0', 156);
    header.write('ustar\u000000', 257);
    header.fill(' ', 148, 156);
    let sum = 0;
    for (const b of header) sum += b;
    header.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
    async function* chunks() {
      yield header;
      const zeros = Buffer.alloc(256 * 1024);
      for (let sent = 0; sent < size; sent += zeros.length) yield zeros;
    }
    for (let i = 0; i < 12; i++) {
      await assert.rejects(session.importArchive(chunks()), (err) => {
        assert.equal(err.reason, 'FILE_TOO_LARGE', `try ${i}: ${err.reason} ${err.message}`);
        return true;
      });
    }
  } finally {
    await session.delete();
  }
});
