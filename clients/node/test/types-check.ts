// Compiled by `npm run check:types` (tsc --noEmit): the declarations in src/index.d.ts must
// describe how the client is used.
import { SandboxClient, SandboxError, PermissionDenied, type ExecEvent } from '../src/index.js';

async function example(): Promise<number> {
  const client = new SandboxClient('127.0.0.1:50051', { token: 't', timeout: 5 });
  try {
    const session = await client.createSession({ shell: { allow: ['sh'] } });
    let code = -1;
    for await (const ev of session.exec(['sh', '-c', 'echo hi'], { timeout: 2 })) {
      const e: ExecEvent = ev;
      if (e.type === 'output') process.stdout.write(e.data);
      if (e.type === 'exited') code = e.exitCode;
    }
    const r = await session.run(['true']);
    const text: string = r.stdout.toString();
    const info = await session.stat('x');
    const size: number = info.size + text.length;
    for await (const s of client.listSessions({ team: 'docs' })) void s.id;
    await session.delete();
    return code + size;
  } catch (err) {
    if (err instanceof PermissionDenied || err instanceof SandboxError) return err.code;
    throw err;
  } finally {
    client.close();
  }
}
void example;
