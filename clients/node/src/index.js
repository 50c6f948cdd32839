// sandboxd client for Node: loads proto/sandboxd/v1 at run time with @grpc/proto-loader, so
// it always speaks the repository's contract. Errors are decoded from the google.rpc.Status
// trailer into SandboxError subclasses named like the server's domain errors.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import fs from 'node:fs';
import { once } from 'node:events';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

const here = path.dirname(fileURLToPath(import.meta.url));

/** Where the .proto files are: $SANDBOXD_PROTO_DIR, or the repository's proto/ folder. */
export const PROTO_DIR = process.env.SANDBOXD_PROTO_DIR || path.resolve(here, '../../../proto');
export const DEFAULT_ADDRESS = '127.0.0.1:50051';
const DOMAIN = 'sandboxd';
const MAX_MESSAGE = 64 * 1024 * 1024;

function loadServices() {
  const files = fs
    .readdirSync(path.join(PROTO_DIR, 'sandboxd/v1'))
    .filter((f) => f.endsWith('.proto'))
    .map((f) => `sandboxd/v1/${f}`);
  const definition = protoLoader.loadSync(files, {
    includeDirs: [PROTO_DIR],
    keepCase: true, // field names as in the .proto (session_id), as grpcurl shows them
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).sandboxd.v1;
}

// google.rpc.Status and ErrorInfo, inline: three small messages need no extra .proto files.
const rpcTypes = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
`, { keepCase: true }).root;
const StatusType = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfoType = rpcTypes.lookupType('google.rpc.ErrorInfo');

// ---- errors --------------------------------------------------------------------------------

/** Base of every error a failed call raises; `reason` is the ErrorInfo reason or the code name. */
export class SandboxError extends Error {
  constructor(message, { reason, code, metadata = {} }) {
    super(`${reason}: ${message}`);
    this.name = new.target.name;
    this.details = message;
    this.reason = reason;
    this.code = code;
    this.metadata = metadata;
  }
}
export class InvalidArgument extends SandboxError {}
export class NotFound extends SandboxError {}
export class SessionNotFound extends NotFound {}
export class AlreadyExists extends SandboxError {}
export class FailedPrecondition extends SandboxError {}
export class PermissionDenied extends SandboxError {}
export class ResourceExhausted extends SandboxError {}
export class OutOfRange extends SandboxError {}
export class Unavailable extends SandboxError {}
export class EngineUnavailable extends Unavailable {}
export class Internal extends SandboxError {}
export class Unauthenticated extends SandboxError {}
export class DeadlineExceeded extends SandboxError {}
export class Cancelled extends SandboxError {}

const BY_CODE = {
  [grpc.status.INVALID_ARGUMENT]: InvalidArgument,
  [grpc.status.NOT_FOUND]: NotFound,
  [grpc.status.ALREADY_EXISTS]: AlreadyExists,
  [grpc.status.FAILED_PRECONDITION]: FailedPrecondition,
  [grpc.status.PERMISSION_DENIED]: PermissionDenied,
  [grpc.status.RESOURCE_EXHAUSTED]: ResourceExhausted,
  [grpc.status.OUT_OF_RANGE]: OutOfRange,
  [grpc.status.UNAVAILABLE]: Unavailable,
  [grpc.status.INTERNAL]: Internal,
  [grpc.status.UNAUTHENTICATED]: Unauthenticated,
  [grpc.status.DEADLINE_EXCEEDED]: DeadlineExceeded,
  [grpc.status.CANCELLED]: Cancelled,
};
const BY_REASON = { SESSION_NOT_FOUND: SessionNotFound, ENGINE_UNAVAILABLE: EngineUnavailable };

function errorInfo(err) {
  const raw = err.metadata?.get('grpc-status-details-bin')?.[0];
  if (!raw) return null;
  const status = StatusType.decode(raw);
  for (const any of status.details) {
    if (any.type_url.endsWith('/google.rpc.ErrorInfo')) {
      const info = ErrorInfoType.toObject(ErrorInfoType.decode(any.value));
      if (info.domain === DOMAIN) return info;
    }
  }
  return null;
}

/** The typed error for a failed gRPC call (a ServiceError from @grpc/grpc-js). */
export function fromGrpcError(err) {
  if (err instanceof SandboxError || typeof err?.code !== 'number') return err;
  const info = errorInfo(err);
  const reason = info?.reason || grpc.status[err.code] || 'UNKNOWN';
  const Cls = BY_REASON[reason] || BY_CODE[err.code] || SandboxError;
  return new Cls(err.details ?? err.message, {
    reason,
    code: err.code,
    metadata: info?.metadata ?? {},
  });
}

// ---- helpers ------------------------------------------------------------------------------

function seconds(s) {
  if (s == null) return null;
  const whole = Math.floor(s);
  return { seconds: whole, nanos: Math.round((s - whole) * 1e9) };
}

function toSeconds(d) {
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

function unary(stub, method, request, options = {}) {
  return new Promise((resolve, reject) => {
    stub[method](request, options, (err, resp) => (err ? reject(fromGrpcError(err)) : resolve(resp)));
  });
}

/** An exec event in a small, flat shape; null for kinds this client does not know. */
function toEvent(resp) {
  switch (resp.event) {
    case 'started':
      return { type: 'started', processId: resp.started.process_id };
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
        exitCode: e.exit_code,
        signal: e.signal,
        timedOut: e.timed_out,
        truncated: e.truncated,
        duration: toSeconds(e.duration),
      };
    }
    case 'keepalive':
      return { type: 'keepalive' };
    default:
      return null;
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
    return this.info.session_id;
  }

  /** "RUNNING", "EXPIRED", ... */
  get state() {
    return String(this.info.state).replace(/^SESSION_STATE_/, '');
  }

  async refresh() {
    this.info = (await this.client._unary('sessions', 'GetSession', { session_id: this.id })).session;
    return this;
  }

  async renew(ttlSeconds) {
    const req = { session_id: this.id, ttl: seconds(ttlSeconds) };
    this.info = (await this.client._unary('sessions', 'RenewLease', req)).session;
    return this;
  }

  async delete() {
    await this.client._unary('sessions', 'DeleteSession', { session_id: this.id });
  }

  _execRequest(argv, opts = {}) {
    return {
      session_id: this.id,
      argv,
      cwd: opts.cwd ?? '',
      env: opts.env ?? {},
      stdin: opts.stdin ? Buffer.from(opts.stdin) : Buffer.alloc(0),
      timeout: seconds(opts.timeout),
      max_output_bytes: opts.maxOutputBytes ?? 0,
    };
  }

  /**
   * Runs a command and yields its events as they arrive: started, output..., exited.
   * Leaving the loop early cancels the call, which kills the command's process tree.
   */
  async *exec(argv, opts = {}) {
    const call = this.client._stub('processes').Exec(this._execRequest(argv, opts));
    try {
      for await (const resp of call) {
        const event = toEvent(resp);
        if (event === null || (event.type === 'keepalive' && !opts.keepalives)) continue;
        yield event;
      }
    } catch (err) {
      throw fromGrpcError(err);
    } finally {
      call.cancel();
    }
  }

  /** Runs a command and returns its collected output; a non-zero exit is not an error. */
  async run(argv, opts = {}) {
    const r = await this.client._unary('processes', 'Run', this._execRequest(argv, opts), {
      noDeadline: true,
    });
    return {
      exitCode: r.exit_code,
      stdout: r.stdout,
      stderr: r.stderr,
      timedOut: r.timed_out,
      truncated: r.truncated,
      signal: r.signal,
      duration: toSeconds(r.duration),
      processId: r.process_id,
    };
  }

  async readFile(filePath) {
    return (await this.client._unary('files', 'ReadFile', { session_id: this.id, path: filePath }))
      .content;
  }

  async writeFile(filePath, content, { mode = 0, makeParents = false } = {}) {
    const req = {
      session_id: this.id,
      path: filePath,
      content: Buffer.from(content),
      mode,
      make_parents: makeParents,
    };
    return (await this.client._unary('files', 'WriteFile', req)).info;
  }

  async listDir(dirPath = '', { depth = 0 } = {}) {
    const req = { session_id: this.id, path: dirPath, depth };
    return (await this.client._unary('files', 'ListDir', req)).entries;
  }

  async stat(filePath) {
    return (await this.client._unary('files', 'Stat', { session_id: this.id, path: filePath })).info;
  }

  async remove(filePath, { recursive = false } = {}) {
    await this.client._unary('files', 'Remove', { session_id: this.id, path: filePath, recursive });
  }

  async makeDir(dirPath, { parents = false } = {}) {
    const req = { session_id: this.id, path: dirPath, parents };
    return (await this.client._unary('files', 'MakeDir', req)).info;
  }

  /** A tar of the folder `dirPath` (empty: the workspace), as Buffers while it is made. */
  async *exportArchive(dirPath = '') {
    const call = this.client._stub('snapshots').ExportArchive({ session_id: this.id, path: dirPath });
    try {
      for await (const resp of call) yield resp.chunk.data;
    } catch (err) {
      throw fromGrpcError(err);
    } finally {
      call.cancel();
    }
  }

  /**
   * Streams a tar (an iterable or async iterable of Buffers) into the folder `dirPath`; every
   * member is checked by the server before anything lands. Resolves to {files, bytes}.
   */
  async importArchive(chunks, dirPath = '', { replace = false } = {}) {
    let call;
    const done = new Promise((resolve, reject) => {
      call = this.client._stubs.snapshots.ImportArchive(this.client._metadata(), (err, resp) =>
        err ? reject(fromGrpcError(err)) : resolve({ files: resp.files, bytes: resp.bytes }),
      );
    });
    try {
      call.write({ header: { session_id: this.id, path: dirPath, replace } });
      for await (const data of chunks) {
        if (!call.write({ data: Buffer.from(data) })) await once(call, 'drain');
      }
      call.end();
    } catch (err) {
      call.cancel();
      await done.catch(() => {}); // the server's error, if any, is the one to report
      throw err;
    }
    return done;
  }
}

// ---- the client ---------------------------------------------------------------------------

/**
 * A connection to one sandboxd server. Options: `token` (sent as `authorization: Bearer`),
 * `tls` (true, or {rootCerts, privateKey, certChain} as Buffers), `timeout` (seconds, unary
 * calls only). Call close() when done.
 */
export class SandboxClient {
  constructor(address = process.env.SANDBOXD_ADDR || DEFAULT_ADDRESS, options = {}) {
    const v1 = loadServices();
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
    this._plainToken = options.tls ? null : options.token ?? null;
    this._timeout = options.timeout ?? null;
    const channelOptions = {
      'grpc.max_receive_message_length': MAX_MESSAGE,
      'grpc.max_send_message_length': MAX_MESSAGE,
    };
    const first = new v1.SessionService(address, creds, channelOptions);
    const shared = { channelOverride: first.getChannel() };
    this._stubs = {
      sessions: first,
      processes: new v1.ProcessService(address, creds, shared),
      files: new v1.FilesystemService(address, creds, shared),
      admin: new v1.AdminService(address, creds, shared),
      snapshots: new v1.SnapshotService(address, creds, shared),
    };
    this.address = address;
  }

  _stub(name) {
    const stub = this._stubs[name];
    if (!this._plainToken) return stub;
    // Wrap so every call carries the token without each method building metadata.
    return new Proxy(stub, {
      get: (target, prop) => {
        const fn = target[prop];
        if (typeof fn !== 'function' || prop.startsWith?.('get')) return fn;
        return (req, ...rest) => fn.call(target, req, this._metadata(), ...rest);
      },
    });
  }

  /** Call metadata: the bearer token on a plaintext channel (TLS channels add it themselves). */
  _metadata() {
    const md = new grpc.Metadata();
    if (this._plainToken) md.set('authorization', `Bearer ${this._plainToken}`);
    return md;
  }

  _unary(stubName, method, request, { noDeadline = false } = {}) {
    const options = {};
    if (this._timeout != null && !noDeadline) {
      options.deadline = new Date(Date.now() + this._timeout * 1000);
    }
    return unary(this._stub(stubName), method, request, options);
  }

  /** Creates a session from CreateSessionRequest fields (snake_case, as in the .proto). */
  async createSession(request = {}) {
    return new Session(this, (await this._unary('sessions', 'CreateSession', request)).session);
  }

  async getSession(sessionId) {
    return new Session(this, (await this._unary('sessions', 'GetSession', { session_id: sessionId })).session);
  }

  /** Every session carrying all of `labels`, page after page. */
  async *listSessions(labels = {}, { pageSize = 0 } = {}) {
    let token = '';
    do {
      const req = { label_selector: labels, page_size: pageSize, page_token: token };
      const resp = await this._unary('sessions', 'ListSessions', req);
      for (const info of resp.sessions) yield new Session(this, info);
      token = resp.next_page_token;
    } while (token);
  }

  async serverInfo() {
    return this._unary('admin', 'GetServerInfo', {});
  }

  close() {
    this._stubs.sessions.close();
  }
}
