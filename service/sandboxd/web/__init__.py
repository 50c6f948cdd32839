"""The web gateway: sandboxd's API over Connect and gRPC-Web, for browsers and HTTP callers.

Kept import-free: `sandboxd.config` imports `web.settings`."""
