"""Session events: a per-tenant, sequenced, bounded live feed (WatchSession, WatchSessions).

`EventHub` numbers and keeps each tenant's newest events and fans them out to watchers;
`ObservedStore` publishes every state change and lease renewal as the session store records
it (so the reaper, recovery and the API paths are all covered without hooks in each);
`LeaseWarner` says before a lease ends.
"""

from sandboxd.events.hub import EventHub, SessionEvent
from sandboxd.events.leases import LeaseWarner
from sandboxd.events.observed_store import ObservedStore

__all__ = ["EventHub", "LeaseWarner", "ObservedStore", "SessionEvent"]
