// sandboxd client for Node. Every RPC of every service in proto/sandboxd/v1 is a method of the
// client (client.sessions.createSession, client.processes.exec, ...), built from the .proto
// files the package ships (proto/, copied in by `npm pack`): unary calls return promises,
// server streams are async iterators, client streams take (async) iterables. Every call takes
// {timeout, deadline, signal, metadata}; failures are SandboxError subclasses (errors.js).
// Messages are plain objects with camelCase field names (sessionId), Timestamps as Dates,
// Durations as seconds (numbers), as every `timeout` option is; the wire is the .proto's.
// Session wraps the common calls of one session in a smaller, flatter shape.
//
// This module names the package's exports; each is defined with its part: the .proto files and
// the services built from them (services.js), the connection and the call machinery
// (connection.js), SandboxClient (client.js), Session (session.js), interactive commands
// (interaction.js), a command's events (commands.js), the errors (errors.js, reasons.js,
// decode.js) and the names of services and RPCs (naming.js).
export * from './errors.js';
export * from './reasons.js';
export { DOMAIN, fromGrpcError } from './decode.js';
export { IDEMPOTENT, IDEMPOTENT_WITH_ID, methodName, serviceProperty } from './naming.js';
export { PROTO_DIR, loadServices } from './services.js';
export { API_MAJOR } from './connection.js';
export { toEvent } from './commands.js';
export { Interaction } from './interaction.js';
export { Session } from './session.js';
export { DEFAULT_ADDRESS, SandboxClient } from './client.js';
