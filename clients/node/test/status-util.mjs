// Builds the grpc-status-details-bin trailer (google.rpc.Status with one ErrorInfo) the way
// sandboxd's server does, for tests/offline.test.js's in-process servers.
import * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

const root = protobuf.parse(`
  syntax = "proto3";
  package google.rpc;
  message Any { string type_url = 1; bytes value = 2; }
  message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
  message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
`, { keepCase: true }).root;

export function encodeStatus(code, message, reason, metadata = {}) {
  const ErrorInfo = root.lookupType('google.rpc.ErrorInfo');
  const Status = root.lookupType('google.rpc.Status');
  const info = ErrorInfo.encode({ reason, domain: 'sandboxd', metadata }).finish();
  const status = Status.encode({
    code,
    message,
    details: [{ type_url: 'type.googleapis.com/google.rpc.ErrorInfo', value: info }],
  }).finish();
  const md = new grpc.Metadata();
  md.set('grpc-status-details-bin', Buffer.from(status));
  return md;
}
