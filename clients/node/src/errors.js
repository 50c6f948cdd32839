// One error vocabulary: a failed call raises a SandboxError subclass chosen by its gRPC code
// (NotFound, PermissionDenied, ...), carrying the server's ErrorInfo `reason` (one of the
// ErrorReason names of errors.proto), `code`, `metadata` and whether a retry may succeed.
import * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

export const DOMAIN = 'sandboxd';

// google.rpc.Status and ErrorInfo, inline: three small messages need no extra .proto files.
const rpcTypes = protobuf.parse(
  `
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
`,
  { keepCase: true },
).root;
const StatusType = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfoType = rpcTypes.lookupType('google.rpc.ErrorInfo');

/** Base of every error a failed call raises; `reason` is the ErrorInfo reason or the code name. */
export class SandboxError extends Error {
  constructor(message, { reason, code, metadata = {}, cause } = {}) {
    super(`${reason}: ${message}`, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.details = message;
    this.reason = reason;
    this.code = code;
    this.metadata = metadata;
  }

  /** True when the same call may succeed later: UNAVAILABLE, or the server marked it so. */
  get retryable() {
    return this.code === grpc.status.UNAVAILABLE || this.metadata?.retry === 'true';
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
export class Unimplemented extends SandboxError {}
/**
 * The server at the address is not one this client can speak to: not sandboxd at all
 * (reason NOT_SANDBOXD), or sandboxd of another major API version (API_VERSION_MISMATCH).
 */
export class IncompatibleServer extends SandboxError {}

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
  [grpc.status.UNIMPLEMENTED]: Unimplemented,
};
const BY_REASON = { SESSION_NOT_FOUND: SessionNotFound, ENGINE_UNAVAILABLE: EngineUnavailable };

function errorInfo(err) {
  const raw = err.metadata?.get?.('grpc-status-details-bin')?.[0];
  if (!raw) return null;
  let status;
  try {
    status = StatusType.decode(raw);
  } catch {
    return null; // not a google.rpc.Status: a foreign server's trailer
  }
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
