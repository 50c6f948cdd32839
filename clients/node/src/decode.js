// A failed gRPC call -> the typed error: the class of its ErrorInfo reason (reasons.js),
// else of its gRPC code, with the reason, code, metadata and whether it is retryable.
import * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

import * as errors from './errors.js';
import { REASONS } from './reasons.js';

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
).root; // camelCase, as every message of the client (typeUrl)
const StatusType = rpcTypes.lookupType('google.rpc.Status');
const ErrorInfoType = rpcTypes.lookupType('google.rpc.ErrorInfo');

const BY_CODE = {
  [grpc.status.INVALID_ARGUMENT]: errors.InvalidArgument,
  [grpc.status.NOT_FOUND]: errors.NotFound,
  [grpc.status.ALREADY_EXISTS]: errors.AlreadyExists,
  [grpc.status.FAILED_PRECONDITION]: errors.FailedPrecondition,
  [grpc.status.PERMISSION_DENIED]: errors.PermissionDenied,
  [grpc.status.RESOURCE_EXHAUSTED]: errors.ResourceExhausted,
  [grpc.status.OUT_OF_RANGE]: errors.OutOfRange,
  [grpc.status.UNAVAILABLE]: errors.Unavailable,
  [grpc.status.INTERNAL]: errors.Internal,
  [grpc.status.UNAUTHENTICATED]: errors.Unauthenticated,
  [grpc.status.DEADLINE_EXCEEDED]: errors.DeadlineExceeded,
  [grpc.status.CANCELLED]: errors.Cancelled,
  [grpc.status.UNIMPLEMENTED]: errors.Unimplemented,
};

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
    if (any.typeUrl.endsWith('/google.rpc.ErrorInfo')) {
      const info = ErrorInfoType.toObject(ErrorInfoType.decode(any.value));
      if (info.domain === DOMAIN) return info;
    }
  }
  return null;
}

/** The typed error for a failed gRPC call (a ServiceError from @grpc/grpc-js). */
export function fromGrpcError(err) {
  if (err instanceof errors.SandboxError || typeof err?.code !== 'number') return err;
  const info = errorInfo(err);
  const reason = info?.reason || grpc.status[err.code] || 'UNKNOWN';
  const known = REASONS[reason];
  // A reason sent with the code errors.proto declares gets its own class; otherwise the code's.
  const Cls =
    (known && grpc.status[known.code] === err.code && known.error) ||
    BY_CODE[err.code] ||
    errors.SandboxError;
  return new Cls(err.details ?? err.message, {
    reason,
    code: err.code,
    metadata: info?.metadata ?? {},
    retryable: known?.retryable,
  });
}
