// Session wraps the common calls of one session in a smaller, flatter shape: lifecycle,
// commands and background processes, files, folder watches, archives and snapshots. Every call
// goes through the client's service properties (client.sessions, client.processes, ...).
import { commandCall, toEvent } from './commands.js';
import { tarChunks, untarChunks } from './folders.js';
import { Interaction } from './interaction.js';

/** One session; `info` is the last Session message the server sent for it. */
export class Session {
  constructor(client, info) {
    this.client = client;
    this.info = info;
  }

  get id() {
    return this.info.sessionId;
  }

  /** "RUNNING", "EXPIRED", ... */
  get state() {
    return String(this.info.state).replace(/^SESSION_STATE_/, '');
  }

  async refresh(opts) {
    this.info = (await this.client.sessions.getSession({ sessionId: this.id }, opts)).session;
    return this;
  }

  async renew(ttlSeconds, opts) {
    const req = { sessionId: this.id, ttl: ttlSeconds ?? null };
    this.info = (await this.client.sessions.renewLease(req, opts)).session;
    return this;
  }

  async delete(opts) {
    await this.client.sessions.deleteSession({ sessionId: this.id }, opts);
  }

  async suspend(opts) {
    this.info = (await this.client.sessions.suspendSession({ sessionId: this.id }, opts)).session;
    return this;
  }

  async resume(opts) {
    this.info = (await this.client.sessions.resumeSession({ sessionId: this.id }, opts)).session;
    return this;
  }

  _execRequest(argv, opts = {}) {
    return {
      sessionId: this.id,
      argv,
      cwd: opts.cwd ?? '',
      env: opts.env ?? {},
      stdin: opts.stdin ? Buffer.from(opts.stdin) : Buffer.alloc(0),
      timeout: opts.timeout ?? null,
      maxOutputBytes: opts.maxOutputBytes ?? 0,
    };
  }

  /**
   * Runs a command and yields its events as they arrive: started, output..., exited.
   * Leaving the loop early (or aborting opts.signal) cancels the call, which kills the
   * command's process tree.
   */
  async *exec(argv, opts = {}) {
    for await (const resp of this.client.processes.exec(this._execRequest(argv, opts), commandCall(opts))) {
      const event = toEvent(resp);
      if (event === null || (event.type === 'keepalive' && !opts.keepalives)) continue;
      yield event;
    }
  }

  /** Runs a command and returns its collected output; a non-zero exit is not an error. */
  async run(argv, opts = {}) {
    const r = await this.client.processes.run(this._execRequest(argv, opts), commandCall(opts));
    return {
      exitCode: r.exitCode,
      stdout: r.stdout,
      stderr: r.stderr,
      timedOut: r.timedOut,
      truncated: r.truncated,
      signal: r.signal,
      duration: r.duration ?? 0,
      processId: r.processId,
    };
  }

  /**
   * A command with live stdin, signals and (with `pty: {rows, cols}`) a terminal:
   *
   *   const term = session.interact(['sh'], { pty: { rows: 24, cols: 80 } });
   *   term.send('echo hi; exit 3\n');
   *   for await (const event of term) { ... }   // started, output..., exited
   *
   * Unlike exec, it has no deadline and no output cap unless `timeout` or `maxOutputBytes`
   * is given; `idleTimeout` (seconds, default the server's 30 minutes) ends it after that
   * long with no input and no output (InteractIdle). Leaving the loop ends the call and the
   * command.
   */
  interact(argv, opts = {}) {
    const start = {
      request: this._execRequest(argv, opts),
      pty: opts.pty ? { rows: opts.pty.rows, cols: opts.pty.cols } : undefined,
      idleTimeout: opts.idleTimeout ?? null,
    };
    return new Interaction(this.client, start, opts);
  }

  /** Starts a background process; `processId` makes the start idempotent (and retried). */
  async startProcess(argv, opts = {}) {
    const req = {
      ...this._execRequest(argv, opts),
      processId: opts.processId ?? '',
      outputBufferBytes: opts.outputBufferBytes ?? 0,
      keepStdinOpen: opts.keepStdinOpen ?? false,
      requestId: opts.requestId ?? '',
    };
    const call = { deadline: opts.deadline, signal: opts.signal, metadata: opts.metadata };
    return (await this.client.processes.startProcess(req, call)).process;
  }

  /** Replays a background process's output from the offsets, then follows it until it exits. */
  async *attach(processId, opts = {}) {
    const req = {
      sessionId: this.id,
      processId: processId,
      stdoutOffset: opts.stdoutOffset ?? 0,
      stderrOffset: opts.stderrOffset ?? 0,
    };
    for await (const resp of this.client.processes.attachProcess(req, opts)) {
      const event = toEvent(resp);
      if (event === null || (event.type === 'keepalive' && !opts.keepalives)) continue;
      yield event;
    }
  }

  async listProcesses(opts) {
    return (await this.client.processes.listProcesses({ sessionId: this.id }, opts)).processes;
  }

  async signalProcess(processId, signal, opts) {
    const req = { sessionId: this.id, processId: processId, signal };
    await this.client.processes.signalProcess(req, opts);
  }

  async readFile(filePath, opts) {
    return (await this.client.files.readFile({ sessionId: this.id, path: filePath }, opts)).content;
  }

  async writeFile(filePath, content, { mode = 0, makeParents = false, ...opts } = {}) {
    const req = {
      sessionId: this.id,
      path: filePath,
      content: Buffer.from(content),
      mode,
      makeParents: makeParents,
    };
    return (await this.client.files.writeFile(req, opts)).info;
  }

  async listDir(dirPath = '', { depth = 0, ...opts } = {}) {
    const req = { sessionId: this.id, path: dirPath, depth };
    return (await this.client.files.listDir(req, opts)).entries;
  }

  async stat(filePath, opts) {
    return (await this.client.files.stat({ sessionId: this.id, path: filePath }, opts)).info;
  }

  async remove(filePath, { recursive = false, ...opts } = {}) {
    await this.client.files.remove({ sessionId: this.id, path: filePath, recursive }, opts);
  }

  async makeDir(dirPath, { parents = false, ...opts } = {}) {
    const req = { sessionId: this.id, path: dirPath, parents };
    return (await this.client.files.makeDir(req, opts)).info;
  }

  /** Any process by the id Exec, Run, Interact or StartProcess reported. */
  async getProcess(processId, opts) {
    const req = { sessionId: this.id, processId: processId };
    return (await this.client.processes.getProcess(req, opts)).process;
  }

  /** More stdin for a process started with `keepStdinOpen` (never retried). */
  async sendProcessInput(processId, data, opts) {
    const req = { sessionId: this.id, processId: processId, data: Buffer.from(data) };
    await this.client.processes.sendProcessInput(req, opts);
  }

  /** End of file on the process's stdin; closing twice is fine. */
  async closeProcessStdin(processId, opts) {
    await this.client.processes.closeProcessStdin({ sessionId: this.id, processId: processId }, opts);
  }

  /** A file's bytes from `offset` (`length` at most; 0: to the end), as Buffers. */
  async *readFileStream(filePath, { offset = 0, length = 0, ...opts } = {}) {
    const req = { sessionId: this.id, path: filePath, offset, length };
    for await (const resp of this.client.files.readFileStream(req, opts)) yield resp.chunk.data;
  }

  /** Writes chunks (an iterable or async iterable of Buffers) to `filePath`, all or nothing. */
  async writeFileStream(filePath, chunks, { mode = 0, makeParents = false, ...opts } = {}) {
    const id = this.id;
    async function* requests() {
      yield { header: { sessionId: id, path: filePath, mode, makeParents: makeParents } };
      for await (const data of chunks) yield { data: Buffer.from(data) };
    }
    return (await this.client.files.writeFileStream(requests(), opts)).info;
  }

  /** Renames within the workspace; an existing destination needs `overwrite`. */
  async move(sourcePath, destinationPath, { overwrite = false, ...opts } = {}) {
    const req = {
      sessionId: this.id,
      sourcePath: sourcePath,
      destinationPath: destinationPath,
      overwrite,
    };
    return (await this.client.files.move(req, opts)).info;
  }

  /**
   * Changes beneath the folder `dirPath` (empty: the workspace) as FileEvents, until the loop is
   * left (which ends the watch) or the session ends. `onReady` is called once the watch is in
   * place: every change after it is reported. An OVERFLOW event means events were lost: list
   * the folder again.
   */
  async *watchDir(dirPath = '', { recursive = false, onReady, ...opts } = {}) {
    const req = { sessionId: this.id, path: dirPath, recursive };
    const events = this.client.files.watchDir(req, { ...opts, onMetadata: onReady });
    for await (const resp of events) yield resp.event;
  }

  /** A tar of the folder `dirPath` (empty: the workspace), as Buffers while it is made. */
  async *exportArchive(dirPath = '', opts = {}) {
    const req = { sessionId: this.id, path: dirPath };
    for await (const resp of this.client.snapshots.exportArchive(req, opts)) yield resp.chunk.data;
  }

  /**
   * Streams a tar (an iterable or async iterable of Buffers) into the folder `dirPath`; every
   * member is checked by the server before anything lands. Resolves to {files, bytes}.
   */
  async importArchive(chunks, dirPath = '', { replace = false, ...opts } = {}) {
    const id = this.id;
    async function* requests() {
      yield { header: { sessionId: id, path: dirPath, replace } };
      for await (const data of chunks) yield { data: Buffer.from(data) };
    }
    const resp = await this.client.snapshots.importArchive(requests(), opts);
    return { files: resp.files, bytes: resp.bytes };
  }

  /**
   * The local folder `localDir`'s contents into the workspace folder `dirPath` (empty: the
   * workspace), in one call: a tar made while it is sent, symlinks and modes kept.
   * `progress(bytes)` follows the tar. Each file is bounded by the session's file_bytes
   * (1 MiB unless the session asked for more, up to the server's max_file_bytes): a larger one
   * is refused FileTooLargeError and nothing lands.
   */
  async uploadDir(localDir, dirPath = '', { replace = false, progress, ...opts } = {}) {
    return this.importArchive(tarChunks(localDir, progress), dirPath, { replace, ...opts });
  }

  /** The workspace folder `dirPath` into the local folder `localDir`, unpacked as it arrives. */
  async downloadDir(dirPath, localDir, { progress, ...opts } = {}) {
    return untarChunks(this.exportArchive(dirPath, opts), localDir, progress);
  }

  /** Stores a snapshot of the workspace server-side. */
  async snapshot(labels = {}, opts) {
    const req = { sessionId: this.id, labels };
    return (await this.client.snapshots.createSnapshot(req, opts)).snapshot;
  }
}
