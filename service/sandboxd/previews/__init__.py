"""Preview URLs for a session's ports: tokens, the published-port registry, the
HTTP(S) relay and the domain API behind SessionService.PublishPort/UnpublishPort/ListPorts.
Its settings are `sandboxd.config_sections.previews`."""
