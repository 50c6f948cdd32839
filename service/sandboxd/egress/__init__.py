"""Egress allowlist: the built-in CONNECT proxy of each session, its manager and audit.

Pure parts (no asyncio, no Docker): `addresses` (which IP addresses may be dialled), `target`
(names, patterns, request heads). The rest owns the upstream sockets and the proxies; a
sandbox's connections come over its agent's channel (sandboxd.agent.egress_route).
"""
