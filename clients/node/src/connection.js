// The client's connection: one gRPC channel with its credentials, a method per RPC of every
// service (bound as client.sessions, client.processes, ...), the first-use version check, and
// the machinery every call goes through: deadlines, abort signals, typed errors, retries, and
// server, client and bidi streams with backpressure. SandboxClient (client.js) extends it.
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';

import * as grpc from '@grpc/grpc-js';

import {
  Cancelled,
  DeadlineExceeded,
  IncompatibleServer,
  SandboxError,
  Unavailable,
} from './errors.js';
import { fromGrpcError } from './decode.js';
import { IDEMPOTENT, IDEMPOTENT_WITH_ID } from './naming.js';
import { MAX_MESSAGE, REPLY_FIELD, RETRY, serviceConfig } from './services.js';

/** The major API version this client speaks (GetServerInfo.apiVersion "1.x"). */
export const API_MAJOR = 1;
/** Longest the first-use GetServerInfo may take when the caller set no deadline. */
const CHECK_TIMEOUT_MS = 20_000;

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

/** A channel to one server, with `services` (loadServices) bound as its properties. */
export class Connection {
  constructor(address, services, options = {}) {
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
