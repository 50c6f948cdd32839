// The client's entry points: SandboxClient, a Connection (connection.js) to one server, with
// the calls that make or find a Session (session.js) and ask the server what it offers.
import { Connection } from './connection.js';
import { loadServices } from './services.js';
import { Session } from './session.js';

export const DEFAULT_ADDRESS = '127.0.0.1:50051';

/**
 * A connection to one sandboxd server. Options: `token` (sent as `authorization: Bearer`),
 * `tls` (true, or {rootCerts, privateKey, certChain} as Buffers), `timeout` (seconds, the
 * default deadline of unary calls). Call close() when done.
 */
export class SandboxClient extends Connection {
  constructor(address = process.env.SANDBOXD_ADDR || DEFAULT_ADDRESS, options = {}) {
    super(address, loadServices(options.protoDir), options);
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
}
