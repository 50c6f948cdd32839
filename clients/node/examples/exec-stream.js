// Streams a command's output as it is produced, then exits with the command's exit code.
//   SANDBOXD_ADDR=127.0.0.1:50051 node examples/exec-stream.js
import { SandboxClient, SandboxError } from '../src/index.js';

const client = new SandboxClient(process.env.SANDBOXD_ADDR, { timeout: 60 });
let exitCode = 1;
try {
  const session = await client.createSession({
    shell: { allow: ['sh'] },
    labels: { example: 'exec-stream' },
  });
  try {
    const script = 'for i in 1 2 3; do echo line $i; sleep 0.2; done; echo done >&2';
    for await (const event of session.exec(['sh', '-c', script])) {
      if (event.type === 'output') {
        (event.stream === 'stderr' ? process.stderr : process.stdout).write(event.data);
      } else if (event.type === 'exited') {
        exitCode = event.exitCode;
      }
    }
  } finally {
    await session.delete();
  }
} catch (err) {
  if (!(err instanceof SandboxError)) throw err;
  console.error(`exec-stream: ${err.reason}: ${err.details}`);
} finally {
  client.close();
}
process.exitCode = exitCode;
