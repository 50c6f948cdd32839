"""The server: its collaborators (`parts`), its gRPC transport (`transport`), its start and
shutdown order (`run`), composed by `main`."""

from sandboxd.server.main import serve

__all__ = ["serve"]
