"""The E2B-compatible door: E2B's REST control plane and envd (Connect, JSON codec) over
sandboxd's sessions, as a client of the server's own gRPC API (docs/e2b.md)."""
