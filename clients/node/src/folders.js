// Folders as tar streams (Session.uploadDir / downloadDir): made and unpacked as the bytes
// move, never whole in memory; symlinks travel as symlinks, modes as modes (without setuid,
// setgid and sticky, which the server refuses). Unpacking writes nothing outside its folder.
import { createReadStream, createWriteStream } from 'node:fs';
import { lstat, mkdir, readdir, readlink, symlink, chmod, rm } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import tarStream from 'tar-stream';

/** Every entry of `root`, parents before children, as [relative posix name, lstat]. */
async function* walk(root, rel = '') {
  const entries = (await readdir(path.join(root, rel))).sort();
  for (const name of entries) {
    const child = rel ? `${rel}/${name}` : name;
    const st = await lstat(path.join(root, child));
    yield [child, st];
    if (st.isDirectory()) yield* walk(root, child);
  }
}

/** The tar of `root`'s contents as Buffers, while it is made; `progress(bytes)` as they go. */
export async function* tarChunks(root, progress) {
  const pack = tarStream.pack();
  const filling = (async () => {
    for await (const [name, st] of walk(root)) {
      const mode = st.mode & 0o777;
      const header = { name, mode, mtime: st.mtime, uid: 0, gid: 0 };
      if (st.isDirectory()) {
        pack.entry({ ...header, type: 'directory' });
      } else if (st.isSymbolicLink()) {
        pack.entry({ ...header, type: 'symlink', linkname: await readlink(path.join(root, name)) });
      } else if (st.isFile()) {
        const entry = pack.entry({ ...header, type: 'file', size: st.size });
        await pipeline(createReadStream(path.join(root, name)), entry);
      }
    }
    pack.finalize();
  })();
  filling.catch((err) => pack.destroy(err));
  let sent = 0;
  for await (const chunk of pack) {
    sent += chunk.length;
    progress?.(sent);
    yield chunk;
  }
  await filling;
}

function inside(root, name) {
  const target = path.resolve(root, name);
  if (target !== root && !target.startsWith(root + path.sep)) {
    throw new Error(`archive member ${JSON.stringify(name)} leaves the destination`);
  }
  return target;
}

/** Unpacks a tar (an async iterable of Buffers) into the folder `dest`, as it arrives. */
export async function untarChunks(chunks, dest, progress) {
  const root = path.resolve(dest);
  await mkdir(root, { recursive: true });
  const extract = tarStream.extract();
  const modes = [];
  let got = 0;
  const counted = Readable.from(
    (async function* () {
      for await (const chunk of chunks) {
        got += chunk.length;
        progress?.(got);
        yield chunk;
      }
    })(),
  );
  const feeding = pipeline(counted, extract);
  for await (const entry of extract) {
    const { name, type, mode, linkname } = entry.header;
    const target = inside(root, name);
    if (type === 'directory') {
      await mkdir(target, { recursive: true });
      modes.push([target, mode & 0o777]); // last: a read-only folder still gets its files
      entry.resume();
    } else if (type === 'file') {
      await mkdir(path.dirname(target), { recursive: true });
      await pipeline(entry, createWriteStream(target, { mode: mode & 0o777 }));
      await chmod(target, mode & 0o777);
    } else if (type === 'symlink') {
      if (path.isAbsolute(linkname)) throw new Error(`symlink ${name} -> ${linkname} is absolute`);
      inside(root, path.join(path.dirname(name), linkname));
      await rm(target, { force: true });
      await symlink(linkname, target);
      entry.resume();
    } else {
      throw new Error(`archive member ${name}: type ${type} is not unpacked here`);
    }
  }
  await feeding;
  for (const [dir, mode] of modes.reverse()) await chmod(dir, mode);
  return got;
}
