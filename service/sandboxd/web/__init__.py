"""The web gateway: sandboxd's API over Connect and gRPC-Web, for browsers and HTTP callers.
Its settings are `sandboxd.config_sections.web`."""
