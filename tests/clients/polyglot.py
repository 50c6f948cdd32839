"""Shared by the Node and Go client tests: the conformance scenario and the service surface
read from the protos, and a server that wants a bearer token."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from authutil import write_tokens
from conftest import REPO, ServerProcess, own_server

CONFORMANCE = REPO / "tests" / "clients" / "conformance.json"
PROTO_DIR = REPO / "proto" / "sandboxd" / "v1"
TOKEN = "polyglot-" + secrets.token_urlsafe(24)


def conformance_steps() -> list[str]:
    return [step["id"] for step in json.loads(CONFORMANCE.read_text())["steps"]]


def passed_steps(output: str) -> list[str]:
    """The step ids a conformance runner printed as `STEP <id> ok`, in order."""
    return re.findall(r"^STEP (\S+) ok$", output, flags=re.MULTILINE)


def service_rpcs() -> dict[str, list[str]]:
    """Every RPC of every service, from the service descriptors the protos compile to."""
    import importlib

    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    found: dict[str, list[str]] = {}
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        importlib.import_module(f"sandboxd.v1.{proto.stem}_pb2")  # registers the file
        fd = pool.FindFileByName(f"sandboxd/v1/{proto.name}")
        for service in fd.services_by_name.values():
            found[service.full_name] = [m.name for m in service.methods]
    return found


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server that accepts only TOKEN."""
    tmp: Path = tmp_path_factory.mktemp("polyglot-token")
    tokens = write_tokens(tmp / "tokens", {TOKEN: "alpha"})
    with own_server(
        tmp / "data", "polyglot" + secrets.token_hex(4), "--tokens-file", str(tokens)
    ) as srv:
        yield srv
