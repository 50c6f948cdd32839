"""Background processes: started or adopted, followed and read, held to their budgets.

`manager` owns a server's processes (start, adopt after a restart, signal, forget);
`record` is one process's state; `adoption` takes processes back from a restarted agent;
`follow` reads output from the live tail or the agent's ring; `budget` decides which
records make room; `forgets` and `stdin` are the agent-side chores of a record.
"""

from sandboxd.output_ring import OutputBuffer
from sandboxd.processes.manager import SESSION_OUTPUT_BUFFER_BYTES, ProcessManager
from sandboxd.processes.record import (
    AttachEvent,
    BackgroundProcess,
    OutputGap,
    ProcessOrigin,
    StartOptions,
)

__all__ = [
    "SESSION_OUTPUT_BUFFER_BYTES",
    "AttachEvent",
    "BackgroundProcess",
    "OutputBuffer",
    "OutputGap",
    "ProcessManager",
    "ProcessOrigin",
    "StartOptions",
]
