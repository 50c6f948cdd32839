// sandboxd client for Node. Every RPC of every service in proto/sandboxd/v1 is a method of the
// client (client.sessions.createSession, client.processes.exec, ...), built from the .proto
// files the package ships (proto/, copied in by `npm pack`): unary calls return promises,
// server streams are async iterators, client streams take (async) iterables. Every call takes
// {timeout, deadline, signal, metadata}; failures are SandboxError subclasses (errors.js).
// Messages are plain objects with camelCase field names (sessionId), Timestamps as Dates,
// Durations as seconds (numbers), as every `timeout` option is; the wire is the .proto's.
// Session wraps the common calls of one session in a smaller, flatter shape.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import {
  Cancelled,
  DeadlineExceeded,
  IncompatibleServer,
  SandboxError,
  Unavailable,
} from './errors.js';
import { fromGrpcError } from './decode.js';
import { fromWire, loadRoot, toWire } from './convert.js';
import { IDEMPOTENT, IDEMPOTENT_WITH_ID, methodName, serviceProperty } from './naming.js';

export * from './errors.js';
import { tarChunks, untarChunks } from './folders.js';
export * from './reasons.js';
export { DOMAIN, fromGrpcError } from './decode.js';
export { IDEMPOTENT, IDEMPOTENT_WITH_ID, methodName, serviceProperty } from './naming.js';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The major API version this client speaks (GetServerInfo.apiVersion "1.x"). */
export const API_MAJOR = 1;
export const DEFAULT_ADDRESS = '127.0.0.1:50051';
const MAX_MESSAGE = 64 * 1024 * 1024;
/**
 * The request field by which a caller tells the server the largest reply it accepts: without
 * it a server answers at most 4 MiB (gRPC's default receive limit). This client receives up to
 * MAX_MESSAGE, so every request that has the field says so, unless the caller set it.
 */
const REPLY_FIELD = 'maxReplyBytes'; // max_reply_bytes in the .proto
/** Longest the first-use GetServerInfo may take when the caller set no deadline. */
const CHECK_TIMEOUT_MS = 20_000;
const RETRY = { maxAttempts: 5, initialBackoffMs: 100, maxBackoffMs: 2000, multiplier: 2 };

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
function serviceConfig(services) {
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

/** The call options inside a command's options, whose `timeout` is the command's own. */
function commandCall(opts = {}) {
  return { timeout: null, deadline: opts.deadline, signal: opts.signal, metadata: opts.metadata };
}

function majorOf(apiVersion) {
  const m = /^v?(\d+)/.exec(String(apiVersion ?? ''));
  return m ? Number(m[1]) : null;
}

function abortError(signal) {
  return new Cancelled('the call was aborted', {
    reason: 'CANCELLED',
    code: grpc.status.CANCELLED,
    cause: signal.reason,
  });
}

/** Rejects with the typed error when `signal` aborts or `deadline` (ms epoch) passes first. */
function within(promise, deadline, signal) {
  if (deadline == null && !signal) return promise;
  return new Promise((resolve, reject) => {
    let timer = null;
    const onAbort = () => reject(abortError(signal));
    const done = () => {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    if (deadline != null) {
      timer = setTimeout(
        () =>
          reject(
            new DeadlineExceeded('deadline exceeded before the server answered', {
              reason: 'DEADLINE_EXCEEDED',
              code: grpc.status.DEADLINE_EXCEEDED,
            }),
          ),
        Math.max(0, deadline - Date.now()),
      );
    }
    promise.then(
      (v) => (done(), resolve(v)),
      (e) => (done(), reject(e)),
    );
  });
}

/** An exec event in a small, flat shape; null for kinds this client does not know. */
export function toEvent(resp) {
  switch (resp.event) {
    case 'started':
      return { type: 'started', processId: resp.started.processId };
    case 'output':
      return {
        type: 'output',
        stream: resp.output.stream === 'OUTPUT_STREAM_STDERR' ? 'stderr' : 'stdout',
        data: resp.output.data,
        offset: resp.output.offset,
      };
    case 'exited': {
      const e = resp.exited;
      return {
        type: 'exited',
        exitCode: e.exitCode,
        signal: e.signal,
        timedOut: e.timedOut,
        truncated: e.truncated,
        duration: e.duration ?? 0,
      };
    }
    case 'gap':
      return {
        type: 'gap',
        stream: resp.gap.stream === 'OUTPUT_STREAM_STDERR' ? 'stderr' : 'stdout',
        offset: resp.gap.offset,
        length: resp.gap.length,
      };
    case 'keepalive':
      return { type: 'keepalive' };
    default:
      return null;
  }
}

// ---- interactive commands ------------------------------------------------------------------

/** Requests written in the order they were pushed; iterating waits for the next one. */
class RequestQueue {
  constructor() {
    this._items = [];
    this._wake = null;
    this._ended = false;
  }

  push(item) {
    if (this._ended) throw new Error('the interaction has ended');
    this._items.push(item);
    this._wake?.();
  }

  end() {
    this._ended = true;
    this._wake?.();
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      while (this._items.length) yield this._items.shift();
      if (this._ended) return;
      await new Promise((resolve) => (this._wake = resolve));
      this._wake = null;
    }
  }
}

/** A running Interact call (Session.interact): write to it, iterate its events. */
export class Interaction {
  constructor(client, start, opts = {}) {
    this._requests = new RequestQueue();
    this._requests.push({ start });
    this._keepalives = Boolean(opts.keepalives);
    this._events = client.processes.interact(this._requests, commandCall(opts));
  }

  /** Bytes (or a string, as UTF-8) for the command's stdin. */
  send(data) {
    this._requests.push({ stdin: { data: Buffer.from(data) } });
  }

  /** End of file on stdin; output keeps flowing. */
  closeStdin() {
    this._requests.push({ closeStdin: {} });
  }

  /** A signal for the command's process group: "SIGINT", "SIGTERM", ... */
  signal(name) {
    this._requests.push({ signal: { signal: name } });
  }

  /** A new terminal size (with a pty). */
  resize(rows, cols) {
    this._requests.push({ resize: { rows, cols } });
  }

  /** Ends the call (and the command) now. */
  async close() {
    this._requests.end();
    await this._events.return();
  }

  async *[Symbol.asyncIterator]() {
    try {
      for await (const resp of this._events) {
        const event = toEvent(resp);
        if (event === null || (event.type === 'keepalive' && !this._keepalives)) continue;
        if (event.type === 'exited') this._requests.end(); // nothing more to write
        yield event;
      }
    } finally {
      this._requests.end();
    }
  }
}

// ---- sessions -----------------------------------------------------------------------------

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

// ---- the client ---------------------------------------------------------------------------

/**
 * A connection to one sandboxd server. Options: `token` (sent as `authorization: Bearer`),
 * `tls` (true, or {rootCerts, privateKey, certChain} as Buffers), `timeout` (seconds, the
 * default deadline of unary calls). Call close() when done.
 */
export class SandboxClient {
  constructor(address = process.env.SANDBOXD_ADDR || DEFAULT_ADDRESS, options = {}) {
    const services = loadServices(options.protoDir);
    let creds;
    if (options.tls) {
      const t = options.tls === true ? {} : options.tls;
      creds = grpc.credentials.createSsl(t.rootCerts, t.privateKey, t.certChain);
      if (options.token) {
        const bearer = grpc.credentials.createFromMetadataGenerator((_, cb) => {
          const md = new grpc.Metadata();
          md.set('authorization', `Bearer ${options.token}`);
          cb(null, md);
        });
        creds = grpc.credentials.combineChannelCredentials(creds, bearer);
      }
    } else {
      creds = grpc.credentials.createInsecure();
    }
    // On a plaintext channel (loopback by default) the token travels as call metadata.
    this._plainToken = options.tls ? null : (options.token ?? null);
    this._timeout = options.timeout ?? null;
    this._checkVersion = options.checkServer ?? true;
    this._compatible = null; // the pending or passed first-use check
    this._grpc = new grpc.Client(address, creds, {
      'grpc.max_receive_message_length': MAX_MESSAGE,
      'grpc.max_send_message_length': MAX_MESSAGE,
      'grpc.service_config': serviceConfig(services),
      'grpc.enable_retries': 1,
    });
    this.address = address;
    /** GetServerInfo's answer from the first-use check (null before the first call). */
    this.server = null;
    this.services = services;
    for (const s of services) {
      const methods = {};
      for (const m of s.methods) methods[m.method] = this._bind(s, m);
      this[s.property] = Object.freeze(methods);
    }
  }

  close() {
    this._grpc.close();
  }

  // ---- sessions (the entry points; the rest is on Session and the service properties) ----

  /** Creates a session from CreateSessionRequest fields (camelCase: `{ sessionId, shell: { allowAll } }`). */
  async createSession(request = {}, opts) {
    return new Session(this, (await this.sessions.createSession(request, opts)).session);
  }

  async getSession(sessionId, opts) {
    return new Session(this, (await this.sessions.getSession({ sessionId: sessionId }, opts)).session);
  }

  /** Forks a new session from a stored snapshot (CreateSession{fromSnapshotId}). */
  async forkSession(snapshotId, request = {}, opts) {
    return this.createSession({ ...request, fromSnapshotId: snapshotId }, opts);
  }

  /** Every session carrying all of `labels`, page after page. */
  async *listSessions(labels = {}, { pageSize = 0, ...opts } = {}) {
    let token = '';
    do {
      const req = { labelSelector: labels, pageSize: pageSize, pageToken: token };
      const resp = await this.sessions.listSessions(req, opts);
      for (const info of resp.sessions) yield new Session(this, info);
      token = resp.nextPageToken;
    } while (token);
  }

  /** GetServerInfo, fetched now (the first-use check keeps its answer in `server`). */
  async serverInfo(opts) {
    return this.admin.getServerInfo({}, opts);
  }

  /** Whether the server has an optional feature ("pty", "snapshots", "egress", ...). */
  async hasFeature(name, opts = {}) {
    await this._ready(this._deadline(opts, true), opts.signal);
    if (this.server) return this.server.features.includes(name);
    return (await this.serverInfo(opts)).features.includes(name); // checkServer: false
  }

  // ---- calls --------------------------------------------------------------------------------

  _metadata(extra) {
    const md = new grpc.Metadata();
    if (this._plainToken) md.set('authorization', `Bearer ${this._plainToken}`);
    for (const [k, v] of Object.entries(extra ?? {})) md.set(k, v);
    return md;
  }

  /** The call's deadline in ms since the epoch, or null: deadline, else timeout (s), else the client's (unary). */
  _deadline(opts = {}, unary) {
    if (opts.deadline != null) return new Date(opts.deadline).getTime();
    const timeout = opts.timeout !== undefined ? opts.timeout : unary ? this._timeout : null;
    return timeout == null ? null : Date.now() + timeout * 1000;
  }

  /**
   * On first use: GetServerInfo must answer, from sandboxd (not UNIMPLEMENTED), of this
   * client's major API version. Within the caller's deadline; a failed check that may pass
   * later (server down, wrong token) is tried again by the next call.
   */
  async _ready(deadline, signal) {
    if (!this._checkVersion) return;
    if (this._compatible === true) return;
    if (!this._compatible) {
      const until = Math.min(deadline ?? Infinity, Date.now() + CHECK_TIMEOUT_MS);
      this._compatible = this._check(until).then(
        () => (this._compatible = true),
        (err) => {
          if (!(err instanceof IncompatibleServer)) this._compatible = null;
          throw err;
        },
      );
    }
    await within(this._compatible, deadline, signal);
  }

  async _check(deadline) {
    const m = this._method('AdminService', 'GetServerInfo');
    let info;
    try {
      info = await this._unaryOnce(m, {}, deadline, {});
    } catch (err) {
      if (err.code === grpc.status.UNIMPLEMENTED) {
        throw new IncompatibleServer(
          `the server at ${this.address} is not sandboxd: it does not implement ${m.path}`,
          { reason: 'NOT_SANDBOXD', code: err.code },
        );
      }
      if (err.code === grpc.status.UNAVAILABLE && !(err.metadata && Object.keys(err.metadata).length)) {
        throw new Unavailable(`cannot reach sandboxd at ${this.address}: ${err.details}`, {
          reason: err.reason,
          code: err.code,
        });
      }
      throw err;
    }
    const major = majorOf(info.apiVersion);
    if (major !== null && major !== API_MAJOR) {
      throw new IncompatibleServer(
        `the server at ${this.address} speaks sandboxd API ${info.apiVersion}; this client ` +
          `speaks ${API_MAJOR}.x`,
        { reason: 'API_VERSION_MISMATCH', code: grpc.status.FAILED_PRECONDITION },
      );
    }
    this.server = info;
  }

  _method(service, rpc) {
    return this.services.find((s) => s.name === service).methods.find((m) => m.name === rpc);
  }

  _bind(service, m) {
    const full = `${service.fullName}/${m.name}`;
    if (!m.requestStream && !m.responseStream) return (req, opts) => this._unary(full, m, req, opts);
    if (!m.requestStream) return (req, opts) => this._serverStream(m, req, opts);
    if (!m.responseStream) return (reqs, opts) => this._clientStream(m, reqs, opts);
    return (reqs, opts) => this._bidiStream(m, reqs, opts);
  }

  _callOptions(deadline) {
    return deadline == null ? {} : { deadline: new Date(deadline) };
  }

  _unaryOnce(m, request, deadline, opts) {
    return new Promise((resolve, reject) => {
      const signal = opts.signal;
      if (signal?.aborted) return reject(abortError(signal));
      const onAbort = () => call.cancel();
      const req = request ?? {};
      const call = this._grpc.makeUnaryRequest(
        m.path,
        m.requestSerialize,
        m.responseDeserialize,
        m.takesReplyLimit && !req[REPLY_FIELD] ? { ...req, [REPLY_FIELD]: MAX_MESSAGE } : req,
        this._metadata(opts.metadata),
        this._callOptions(deadline),
        (err, resp) => {
          signal?.removeEventListener('abort', onAbort);
          if (!err) return resolve(resp);
          reject(signal?.aborted ? abortError(signal) : fromGrpcError(err));
        },
      );
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  async _unary(full, m, request, opts = {}) {
    const deadline = this._deadline(opts, true);
    await this._ready(deadline, opts.signal);
    // UNAVAILABLE on an idempotent call is retried by gRPC (service config). This loop adds
    // what a service config cannot say: errors the server marked retryable with another code,
    // and the calls that are idempotent only with a caller-chosen id.
    const idField = IDEMPOTENT_WITH_ID[full];
    const idempotent = idField ? Boolean(request?.[idField]) : IDEMPOTENT.has(full);
    let backoff = RETRY.initialBackoffMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this._unaryOnce(m, request, deadline, opts);
      } catch (err) {
        const covered = !idField && err.code === grpc.status.UNAVAILABLE;
        const pause = Math.random() * backoff; // full jitter
        const again =
          idempotent &&
          err instanceof SandboxError &&
          err.retryable &&
          !covered &&
          attempt < RETRY.maxAttempts &&
          (deadline == null || Date.now() + pause < deadline);
        if (!again) throw err;
        await sleep(pause, undefined, { signal: opts.signal }).catch(() => {
          throw abortError(opts.signal);
        });
        backoff = Math.min(backoff * RETRY.multiplier, RETRY.maxBackoffMs);
      }
    }
  }

  _watchAbort(call, signal) {
    if (!signal) return () => {};
    const onAbort = () => call.cancel();
    signal.addEventListener('abort', onAbort, { once: true });
    return () => signal.removeEventListener('abort', onAbort);
  }

  async *_read(call, signal, pump) {
    const unwatch = this._watchAbort(call, signal);
    try {
      for await (const resp of call) yield resp;
      if (pump) await pump;
    } catch (err) {
      throw signal?.aborted ? abortError(signal) : fromGrpcError(err);
    } finally {
      unwatch();
      call.cancel(); // leaving the loop early ends the call (the server stops the work)
    }
  }

  async *_serverStream(m, request, opts = {}) {
    const deadline = this._deadline(opts, false);
    await this._ready(deadline, opts.signal);
    if (opts.signal?.aborted) throw abortError(opts.signal);
    const call = this._grpc.makeServerStreamRequest(
      m.path,
      m.requestSerialize,
      m.responseDeserialize,
      request ?? {},
      this._metadata(opts.metadata),
      this._callOptions(deadline),
    );
    // The response headers: for WatchDir, the sign that the watch is in place.
    if (opts.onMetadata) call.once('metadata', (md) => opts.onMetadata(md.getMap()));
    yield* this._read(call, opts.signal);
  }

  /**
   * Writes `requests` into the call with backpressure, then half-closes; cancels on failure.
   * Stops writing as soon as the call has ended (`ended`): a server that refuses early (a bad
   * header) never leaves the writer waiting for a drain that will not come.
   */
  async _pump(call, requests, ended) {
    let over = false;
    const stop = ended.then(() => (over = true));
    const stopped = stop.then(() => ({ done: true }));
    const source = requests[Symbol.asyncIterator]();
    try {
      for (;;) {
        // A source that waits for its next request (an Interaction with nothing typed) must
        // not hold the call open after the server ended it.
        const next = await Promise.race([source.next(), stopped]);
        if (next.done || over) break;
        if (!call.write(next.value)) await Promise.race([once(call, 'drain'), stop]);
      }
      if (!over) call.end();
      // Not awaited: a generator parked on its own await finishes only when that settles.
      else source.return?.()?.catch?.(() => {});
    } catch (err) {
      call.cancel();
      throw err;
    }
  }

  async _clientStream(m, requests, opts = {}) {
    const deadline = this._deadline(opts, false);
    await this._ready(deadline, opts.signal);
    if (opts.signal?.aborted) throw abortError(opts.signal);
    let call;
    const done = new Promise((resolve, reject) => {
      call = this._grpc.makeClientStreamRequest(
        m.path,
        m.requestSerialize,
        m.responseDeserialize,
        this._metadata(opts.metadata),
        this._callOptions(deadline),
        (err, resp) => (err ? reject(err) : resolve(resp)),
      );
    });
    const settled = done.then(
      () => {},
      () => {},
    ); // also keeps an early failure from being an unhandled rejection
    const unwatch = this._watchAbort(call, opts.signal);
    try {
      try {
        await this._pump(call, requests, settled);
      } catch (err) {
        await settled; // the server's error, if any, is the one to report
        await done.catch((serverErr) => {
          if (serverErr.code !== grpc.status.CANCELLED) throw serverErr;
        });
        throw err;
      }
      return await done;
    } catch (err) {
      throw opts.signal?.aborted ? abortError(opts.signal) : fromGrpcError(err);
    } finally {
      unwatch();
    }
  }

  async *_bidiStream(m, requests, opts = {}) {
    const deadline = this._deadline(opts, false);
    await this._ready(deadline, opts.signal);
    if (opts.signal?.aborted) throw abortError(opts.signal);
    const call = this._grpc.makeBidiStreamRequest(
      m.path,
      m.requestSerialize,
      m.responseDeserialize,
      this._metadata(opts.metadata),
      this._callOptions(deadline),
    );
    const ended = once(call, 'status').then(
      () => {},
      () => {},
    );
    const pump = this._pump(call, requests, ended);
    pump.catch(() => {}); // reported when the reading ends
    yield* this._read(call, opts.signal, pump);
  }
}
