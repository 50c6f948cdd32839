// Compiled by `npm run check:types` (tsc --noEmit), and again by tests/clients/test_client_node.py
// in a project outside the repository with the import below pointing at '@sandboxd/client'
// installed from the `npm pack` tarball: the declarations must describe how the client is used.
import {
  SandboxClient,
  SandboxError,
  PermissionDenied,
  SessionNotFoundError,
  IncompatibleServer,
  REASONS,
  type ExecEvent,
  type Reason,
  type GetServerInfoResponse,
  type ExecResponse,
} from '../src/index.js';

async function example(): Promise<number> {
  const client = new SandboxClient('127.0.0.1:50051', { token: 't', timeout: 5 });
  const abort = new AbortController();
  try {
    const session = await client.createSession({ shell: { allow: ['sh'] }, sessionId: 'typed' });
    let code = -1;
    for await (const ev of session.exec(['sh', '-c', 'echo hi'], { timeout: 2, signal: abort.signal })) {
      const e: ExecEvent = ev;
      if (e.type === 'output') process.stdout.write(e.data);
      if (e.type === 'exited') code = e.exitCode;
    }
    const r = await session.run(['true'], { deadline: Date.now() + 1000 });
    const text: string = r.stdout.toString();
    const expires: Date | null = session.info.leaseExpiresAt; // Timestamps are Dates
    const limits = await client.createSession({ limits: { commandTimeout: 30, fileBytes: 1 << 20 } });
    const commandTimeout: number | null | undefined = limits.info.limits?.commandTimeout; // seconds
    await client.sessions.updateNetworkPolicy({
      sessionId: session.id,
      network: { allowedDomains: ['example.org'] },
      updateMask: { paths: ['allowedDomains'] },
    });
    void [expires?.toISOString(), commandTimeout];
    const info = await session.stat('x');
    const size: number = info.size + text.length;
    for await (const s of client.listSessions({ team: 'docs' })) void s.id;

    // every RPC, typed from the protos
    const server: GetServerInfoResponse = await client.admin.getServerInfo({}, { timeout: 1 });
    const apiVersion: string = server.apiVersion;
    for await (const resp of client.processes.exec({ sessionId: session.id, argv: ['ls'] })) {
      const m: ExecResponse = resp;
      if (m.event === 'output' && m.output) process.stdout.write(m.output.data);
    }
    const proc = await session.startProcess(['sleep', '1'], { processId: 'p1' });
    for await (const ev of session.attach(proc.processId, { stdoutOffset: 0 })) void ev.type;
    const snap = await session.snapshot({ kind: 'test' });
    const fork = await client.forkSession(snap.snapshotId);
    await fork.delete();
    await client.snapshots.deleteSnapshot({ snapshotId: snap.snapshotId });
    const done = await client.snapshots.importArchive([
      { header: { sessionId: session.id, path: 'in' } },
      { data: new Uint8Array(10) },
    ]);
    void done.files;
    for await (const fe of session.watchDir('src', { recursive: true, onReady: () => {} })) {
      const kind: 'FILE_EVENT_KIND_OVERFLOW' | string = fe.kind;
      void [kind, fe.sequence, fe.path, fe.oldPath, fe.type];
      break;
    }
    await session.delete();
    return code + size + apiVersion.length;
  } catch (err) {
    if (err instanceof SessionNotFoundError) return err.code;
    if (err instanceof IncompatibleServer) return -2;
    if (err instanceof PermissionDenied || err instanceof SandboxError) {
      const reason = err.reason as Reason;
      return REASONS[reason]?.retryable ? 1 : err.code;
    }
    throw err;
  } finally {
    client.close();
  }
}
void example;
