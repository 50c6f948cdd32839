// One error vocabulary: a failed call raises a SandboxError subclass chosen by its gRPC code
// (NotFound, PermissionDenied, ...), carrying the server's ErrorInfo `reason` (one of the
// ErrorReason names of errors.proto), `code`, `metadata` and whether a retry may succeed.
// The class per reason is generated (reasons.js); decode.js turns a gRPC error into one.
import * as grpc from '@grpc/grpc-js';

/** Base of every error a failed call raises; `reason` is the ErrorInfo reason or the code name. */
export class SandboxError extends Error {
  constructor(message, { reason, code, metadata = {}, retryable, cause } = {}) {
    super(`${reason}: ${message}`, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.details = message;
    this.reason = reason;
    this.code = code;
    this.metadata = metadata;
    /**
     * The same call may succeed later: UNAVAILABLE, a reason errors.proto declares retryable,
     * or an error the server marked so (ErrorInfo metadata retry=true).
     */
    this.retryable = Boolean(
      retryable || code === grpc.status.UNAVAILABLE || metadata?.retry === 'true',
    );
  }
}
export class InvalidArgument extends SandboxError {}
export class NotFound extends SandboxError {}
export class AlreadyExists extends SandboxError {}
export class FailedPrecondition extends SandboxError {}
export class PermissionDenied extends SandboxError {}
export class ResourceExhausted extends SandboxError {}
export class OutOfRange extends SandboxError {}
export class Unavailable extends SandboxError {}
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

