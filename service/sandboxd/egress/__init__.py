"""Egress allowlist: the built-in CONNECT proxy, its per-session networks, filters and audit.

Pure parts (no asyncio, no Docker): `addresses` (which IP addresses may be dialled), `target`
(names, patterns, request heads). The rest owns sockets, networks and iptables rules.
"""
