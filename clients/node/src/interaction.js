// Interactive commands (Session.interact): the Interact call's requests written as the caller
// pushes them, its events read as the command runs.
import { commandCall, toEvent } from './commands.js';

/** Requests written in the order they were pushed; iterating waits for the next one. */
class RequestQueue {
  constructor() {
    this._items = [];
    this._wake = null;
    this._ended = false;
  }

  push(item) {
    if (this._ended) throw new Error('the interaction has ended');
    this._items.push(item);
    this._wake?.();
  }

  end() {
    this._ended = true;
    this._wake?.();
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      while (this._items.length) yield this._items.shift();
      if (this._ended) return;
      await new Promise((resolve) => (this._wake = resolve));
      this._wake = null;
    }
  }
}

/** A running Interact call (Session.interact): write to it, iterate its events. */
export class Interaction {
  constructor(client, start, opts = {}) {
    this._requests = new RequestQueue();
    this._requests.push({ start });
    this._keepalives = Boolean(opts.keepalives);
    this._events = client.processes.interact(this._requests, commandCall(opts));
  }

  /** Bytes (or a string, as UTF-8) for the command's stdin. */
  send(data) {
    this._requests.push({ stdin: { data: Buffer.from(data) } });
  }

  /** End of file on stdin; output keeps flowing. */
  closeStdin() {
    this._requests.push({ closeStdin: {} });
  }

  /** A signal for the command's process group: "SIGINT", "SIGTERM", ... */
  signal(name) {
    this._requests.push({ signal: { signal: name } });
  }

  /** A new terminal size (with a pty). */
  resize(rows, cols) {
    this._requests.push({ resize: { rows, cols } });
  }

  /** Ends the call (and the command) now. */
  async close() {
    this._requests.end();
    await this._events.return();
  }

  async *[Symbol.asyncIterator]() {
    try {
      for await (const resp of this._events) {
        const event = toEvent(resp);
        if (event === null || (event.type === 'keepalive' && !this._keepalives)) continue;
        if (event.type === 'exited') this._requests.end(); // nothing more to write
        yield event;
      }
    } finally {
      this._requests.end();
    }
  }
}
