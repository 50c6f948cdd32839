// A command's shapes (Session.exec, run, attach; Interaction): its events in a small, flat
// form (toEvent), and the call options inside its options (commandCall).

/** The call options inside a command's options, whose `timeout` is the command's own. */
export function commandCall(opts = {}) {
  return { timeout: null, deadline: opts.deadline, signal: opts.signal, metadata: opts.metadata };
}

/** An exec event in a small, flat shape; null for kinds this client does not know. */
export function toEvent(resp) {
  switch (resp.event) {
    case 'started':
      return { type: 'started', processId: resp.started.processId };
    case 'output':
      return {
        type: 'output',
        stream: resp.output.stream === 'OUTPUT_STREAM_STDERR' ? 'stderr' : 'stdout',
        data: resp.output.data,
        offset: resp.output.offset,
      };
    case 'exited': {
      const e = resp.exited;
      return {
        type: 'exited',
        exitCode: e.exitCode,
        signal: e.signal,
        timedOut: e.timedOut,
        truncated: e.truncated,
        duration: e.duration ?? 0,
      };
    }
    case 'gap':
      return {
        type: 'gap',
        stream: resp.gap.stream === 'OUTPUT_STREAM_STDERR' ? 'stderr' : 'stdout',
        offset: resp.gap.offset,
        length: resp.gap.length,
      };
    case 'keepalive':
      return { type: 'keepalive' };
    default:
      return null;
  }
}
