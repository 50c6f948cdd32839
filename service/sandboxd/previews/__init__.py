"""Preview URLs for a session's ports: tokens, the published-port registry, the
HTTP(S) relay and the domain API behind SessionService.PublishPort/UnpublishPort/ListPorts.

Kept import-free: `sandboxd.config` imports `previews.settings`."""
