"""Secrets the sandbox never sees: declared in a session's network policy, sealed at rest,
added by the egress proxy (TLS terminated with a per-session CA) for the hosts they are bound to.
"""
