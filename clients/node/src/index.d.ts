// Types of the sandboxd Node client. Request and reply messages are plain objects with the
// .proto's field names (snake_case), enums as their names, int64 as numbers.
export declare const PROTO_DIR: string;
export declare const DEFAULT_ADDRESS: string;

export interface ErrorOptions { reason: string; code: number; metadata?: Record<string, string> }
export declare class SandboxError extends Error {
  constructor(message: string, options: ErrorOptions);
  /** The server's message, without the reason prefix. */
  readonly details: string;
  /** The google.rpc.ErrorInfo reason (domain "sandboxd"), or the gRPC code's name. */
  readonly reason: string;
  /** The gRPC status code. */
  readonly code: number;
  readonly metadata: Record<string, string>;
}
export declare class InvalidArgument extends SandboxError {}
export declare class NotFound extends SandboxError {}
export declare class SessionNotFound extends NotFound {}
export declare class AlreadyExists extends SandboxError {}
export declare class FailedPrecondition extends SandboxError {}
export declare class PermissionDenied extends SandboxError {}
export declare class ResourceExhausted extends SandboxError {}
export declare class OutOfRange extends SandboxError {}
export declare class Unavailable extends SandboxError {}
export declare class EngineUnavailable extends Unavailable {}
export declare class Internal extends SandboxError {}
export declare class Unauthenticated extends SandboxError {}
export declare class DeadlineExceeded extends SandboxError {}
export declare class Cancelled extends SandboxError {}
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
      duration: number;
    }
  | { type: 'keepalive' };

export interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Seconds; the session's command_timeout when unset. */
  timeout?: number;
  maxOutputBytes?: number;
  /** Yield keepalive events too. */
  keepalives?: boolean;
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

export interface FileInfo {
  path: string;
  name: string;
  type: 'FILE_TYPE_FILE' | 'FILE_TYPE_DIRECTORY' | 'FILE_TYPE_SYMLINK' | 'FILE_TYPE_OTHER';
  size: number;
  mode: number;
  modified_at: { seconds: number; nanos: number } | null;
  symlink_target: string;
}

/** A sandboxd.v1.Session message. */
export interface SessionInfo {
  session_id: string;
  state: string;
  image: string;
  fingerprint: string;
  labels: Record<string, string>;
  lease_expires_at: { seconds: number; nanos: number } | null;
  [field: string]: unknown;
}

export declare class Session {
  readonly client: SandboxClient;
  info: SessionInfo;
  readonly id: string;
  /** "RUNNING", "EXPIRED", ... */
  readonly state: string;
  refresh(): Promise<this>;
  renew(ttlSeconds?: number): Promise<this>;
  delete(): Promise<void>;
  exec(argv: string[], opts?: ExecOptions): AsyncGenerator<ExecEvent, void, undefined>;
  run(argv: string[], opts?: Omit<ExecOptions, 'keepalives'>): Promise<RunResult>;
  readFile(path: string): Promise<Buffer>;
  writeFile(
    path: string,
    content: string | Uint8Array,
    opts?: { mode?: number; makeParents?: boolean },
  ): Promise<FileInfo>;
  listDir(path?: string, opts?: { depth?: number }): Promise<FileInfo[]>;
  stat(path: string): Promise<FileInfo>;
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
  makeDir(path: string, opts?: { parents?: boolean }): Promise<FileInfo>;
  exportArchive(path?: string): AsyncGenerator<Buffer, void, undefined>;
  importArchive(
    chunks: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    path?: string,
    opts?: { replace?: boolean },
  ): Promise<{ files: number; bytes: number }>;
}

export interface ClientOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  tls?: boolean | { rootCerts?: Buffer; privateKey?: Buffer; certChain?: Buffer };
  /** Deadline of unary calls, in seconds. */
  timeout?: number;
}

export declare class SandboxClient {
  constructor(address?: string, options?: ClientOptions);
  readonly address: string;
  /** CreateSessionRequest fields as in the .proto (session_id, shell, workspace, labels...). */
  createSession(request?: Record<string, unknown>): Promise<Session>;
  getSession(sessionId: string): Promise<Session>;
  listSessions(
    labels?: Record<string, string>,
    opts?: { pageSize?: number },
  ): AsyncGenerator<Session, void, undefined>;
  serverInfo(): Promise<Record<string, unknown>>;
  close(): void;
}
