// Types of the sandboxd Node client. Messages (rpc.d.ts, generated from the .proto files) are
// plain objects with camelCase field names (sessionId for the .proto's session_id), enums as
// their names, int64 as numbers, bytes as Buffers, google.protobuf.Timestamp as Date and
// google.protobuf.Duration as a number of seconds (as every `timeout` option).
import type {
  CallOptions,
  FileEvent,
  FileInfo,
  GetServerInfoResponse,
  Init,
  CreateSessionRequest,
  Process,
  Session as SessionMessage,
  Services,
  Snapshot,
} from './rpc.js';

export * from './rpc.js';
export * from './reasons.js';

export declare const PROTO_DIR: string;
export declare const DEFAULT_ADDRESS: string;
/** The major API version this client speaks. */
export declare const API_MAJOR: number;
/** RPCs ("sandboxd.v1.Service/Method") retried on a retryable error. */
export declare const IDEMPOTENT: ReadonlySet<string>;
/** RPCs idempotent (and retried) when the request names its id: the field that does. */
export declare const IDEMPOTENT_WITH_ID: Readonly<Record<string, string>>;
export declare function serviceProperty(serviceName: string): string;
export declare function methodName(rpcName: string): string;

export interface ErrorOptions {
  reason: string;
  code: number;
  metadata?: Record<string, string>;
  retryable?: boolean;
  cause?: unknown;
}
export declare class SandboxError extends Error {
  constructor(message: string, options: ErrorOptions);
  /** The server's message, without the reason prefix. */
  readonly details: string;
  /** The ErrorInfo reason (an ErrorReason name without its prefix), or the gRPC code's name. */
  readonly reason: string;
  /** The gRPC status code. */
  readonly code: number;
  readonly metadata: Record<string, string>;
  /** The same call may succeed later (UNAVAILABLE, or marked so by the server). */
  readonly retryable: boolean;
}
export declare class InvalidArgument extends SandboxError {}
export declare class NotFound extends SandboxError {}
export declare class AlreadyExists extends SandboxError {}
export declare class FailedPrecondition extends SandboxError {}
export declare class PermissionDenied extends SandboxError {}
export declare class ResourceExhausted extends SandboxError {}
export declare class OutOfRange extends SandboxError {}
export declare class Unavailable extends SandboxError {}
export declare class Internal extends SandboxError {}
export declare class Unauthenticated extends SandboxError {}
export declare class DeadlineExceeded extends SandboxError {}
export declare class Cancelled extends SandboxError {}
export declare class Unimplemented extends SandboxError {}
/** Not sandboxd (reason NOT_SANDBOXD) or another major API version (API_VERSION_MISMATCH). */
export declare class IncompatibleServer extends SandboxError {}
export declare const DOMAIN: string;
export declare function fromGrpcError(err: unknown): unknown;

export type ExecEvent =
  | { type: 'started'; processId: string }
  | { type: 'output'; stream: 'stdout' | 'stderr'; data: Buffer; offset: number }
  | {
      type: 'exited';
      exitCode: number;
      signal: string;
      timedOut: boolean;
      truncated: boolean;
      /** Seconds. */
      duration: number;
    }
  | { type: 'gap'; stream: 'stdout' | 'stderr'; offset: number; length: number }
  | { type: 'keepalive' };

/** Options of a command; `timeout` is the command's (seconds), not the call's. */
export interface ExecOptions extends Omit<CallOptions, 'timeout'> {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Seconds; the session's commandTimeout when unset. */
  timeout?: number;
  maxOutputBytes?: number;
  /** Yield keepalive events too. */
  keepalives?: boolean;
}

/** Options of an interactive command: no deadline or output cap unless asked for. */
export interface InteractOptions extends ExecOptions {
  /** A terminal of this size: stdout and stderr merged, ^C interrupts. */
  pty?: { rows: number; cols: number };
  /** Seconds with no input and no output before the command is ended (default 30 minutes). */
  idleTimeout?: number;
}

/** A running Interact call: write to it while iterating its events. */
export declare class Interaction implements AsyncIterable<ExecEvent> {
  send(data: string | Uint8Array): void;
  closeStdin(): void;
  signal(name: string): void;
  resize(rows: number, cols: number): void;
  close(): Promise<void>;
  [Symbol.asyncIterator](): AsyncIterator<ExecEvent>;
}

export interface RunResult {
  exitCode: number;
  stdout: Buffer;
  stderr: Buffer;
  timedOut: boolean;
  truncated: boolean;
  signal: string;
  duration: number;
  processId: string;
}

export type SessionInfo = SessionMessage;

export declare class Session {
  constructor(client: SandboxClient, info: SessionMessage);
  readonly client: SandboxClient;
  info: SessionMessage;
  readonly id: string;
  /** "RUNNING", "EXPIRED", ... */
  readonly state: string;
  refresh(opts?: CallOptions): Promise<this>;
  renew(ttlSeconds?: number, opts?: CallOptions): Promise<this>;
  delete(opts?: CallOptions): Promise<void>;
  suspend(opts?: CallOptions): Promise<this>;
  resume(opts?: CallOptions): Promise<this>;
  exec(argv: string[], opts?: ExecOptions): AsyncGenerator<ExecEvent, void, undefined>;
  run(argv: string[], opts?: Omit<ExecOptions, 'keepalives'>): Promise<RunResult>;
  interact(argv: string[], opts?: InteractOptions): Interaction;
  uploadDir(
    localDir: string,
    dirPath?: string,
    opts?: CallOptions & { replace?: boolean; progress?: (bytes: number) => void },
  ): Promise<{ files: number; bytes: number }>;
  downloadDir(
    dirPath: string,
    localDir: string,
    opts?: CallOptions & { progress?: (bytes: number) => void },
  ): Promise<number>;
  startProcess(
    argv: string[],
    opts?: ExecOptions & {
      processId?: string;
      outputBufferBytes?: number;
      keepStdinOpen?: boolean;
      requestId?: string;
    },
  ): Promise<Process>;
  attach(
    processId: string,
    opts?: CallOptions & { stdoutOffset?: number; stderrOffset?: number; keepalives?: boolean },
  ): AsyncGenerator<ExecEvent, void, undefined>;
  listProcesses(opts?: CallOptions): Promise<Process[]>;
  signalProcess(processId: string, signal: string, opts?: CallOptions): Promise<void>;
  readFile(path: string, opts?: CallOptions): Promise<Buffer>;
  writeFile(
    path: string,
    content: string | Uint8Array,
    opts?: CallOptions & { mode?: number; makeParents?: boolean },
  ): Promise<FileInfo>;
  listDir(path?: string, opts?: CallOptions & { depth?: number }): Promise<FileInfo[]>;
  stat(path: string, opts?: CallOptions): Promise<FileInfo>;
  remove(path: string, opts?: CallOptions & { recursive?: boolean }): Promise<void>;
  makeDir(path: string, opts?: CallOptions & { parents?: boolean }): Promise<FileInfo>;
  exportArchive(path?: string, opts?: CallOptions): AsyncGenerator<Buffer, void, undefined>;
  importArchive(
    chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    path?: string,
    opts?: CallOptions & { replace?: boolean },
  ): Promise<{ files: number; bytes: number }>;
  snapshot(labels?: Record<string, string>, opts?: CallOptions): Promise<Snapshot>;
  getProcess(processId: string, opts?: CallOptions): Promise<Process>;
  sendProcessInput(processId: string, data: string | Uint8Array, opts?: CallOptions): Promise<void>;
  closeProcessStdin(processId: string, opts?: CallOptions): Promise<void>;
  readFileStream(
    path: string,
    opts?: CallOptions & { offset?: number; length?: number },
  ): AsyncGenerator<Buffer, void, undefined>;
  writeFileStream(
    path: string,
    chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    opts?: CallOptions & { mode?: number; makeParents?: boolean },
  ): Promise<FileInfo>;
  move(
    sourcePath: string,
    destinationPath: string,
    opts?: CallOptions & { overwrite?: boolean },
  ): Promise<FileInfo>;
  /**
   * Changes beneath a folder (empty: the workspace) until the loop is left or the session ends;
   * `onReady` runs once the watch is in place. OVERFLOW: events were lost, list again.
   */
  watchDir(
    path?: string,
    opts?: CallOptions & {
      recursive?: boolean;
      onReady?: (headers: Record<string, string | Buffer>) => void;
    },
  ): AsyncGenerator<FileEvent, void, undefined>;
}

export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  tls?: boolean | { rootCerts?: Buffer; privateKey?: Buffer; certChain?: Buffer };
  /** Default deadline of unary calls, in seconds. */
  timeout?: number;
  /** Check the server with GetServerInfo on first use (default true). */
  checkServer?: boolean;
  /** Where the .proto files are (default: the package's own). */
  protoDir?: string;
}

/** Every RPC is a method of a service property (Services): client.sessions.createSession(...). */
export interface SandboxClient extends Services {}
export declare class SandboxClient {
  constructor(address?: string, options?: ClientOptions);
  readonly address: string;
  /** GetServerInfo's answer from the first-use check; null before the first call. */
  readonly server: GetServerInfoResponse | null;
  createSession(request?: Init<CreateSessionRequest>, opts?: CallOptions): Promise<Session>;
  getSession(sessionId: string, opts?: CallOptions): Promise<Session>;
  forkSession(
    snapshotId: string,
    request?: Init<CreateSessionRequest>,
    opts?: CallOptions,
  ): Promise<Session>;
  listSessions(
    labels?: Record<string, string>,
    opts?: CallOptions & { pageSize?: number },
  ): AsyncGenerator<Session, void, undefined>;
  serverInfo(opts?: CallOptions): Promise<GetServerInfoResponse>;
  /** Whether the server has an optional feature ("pty", "snapshots", "egress", ...). */
  hasFeature(name: string, opts?: CallOptions): Promise<boolean>;
  close(): void;
}
