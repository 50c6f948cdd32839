// `npm pack` / `npm publish` (prepack): copies the repository's proto/sandboxd into the
// package, so the installed client loads the contract it was built with, wherever it lives.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const source = path.resolve(pkg, '../../proto/sandboxd');
const target = path.join(pkg, 'proto/sandboxd');
if (!fs.existsSync(source)) {
  throw new Error(`copy-protos: ${source} not found (run from a checkout of the repository)`);
}
fs.rmSync(path.join(pkg, 'proto'), { recursive: true, force: true });
fs.cpSync(source, target, { recursive: true });
const copied = fs.readdirSync(path.join(target, 'v1')).filter((f) => f.endsWith('.proto'));
console.error(`copy-protos: ${copied.length} files into ${path.relative(pkg, target)}/v1`);
