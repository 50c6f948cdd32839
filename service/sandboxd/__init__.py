"""sandboxd: isolated, resource-limited Docker sandboxes over gRPC."""

__version__ = "0.1.0"
