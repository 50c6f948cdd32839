"""The Node and Go clients retry the same RPCs, and name only RPCs the protos have."""

from __future__ import annotations

import json
import re
import subprocess

from conftest import REPO
from polyglot import service_rpcs

NODE_DIR = REPO / "clients" / "node"
GO_RETRY = REPO / "clients" / "go" / "sandboxd" / "retry.go"


def node_policy() -> tuple[set[str], dict[str, str]]:
    script = (
        "import('./src/naming.js').then((m) => console.log(JSON.stringify("
        "{ids: [...m.IDEMPOTENT], withId: m.IDEMPOTENT_WITH_ID})))"
    )
    out = subprocess.run(
        ["node", "-e", script], cwd=NODE_DIR, capture_output=True, text=True, check=True
    )
    policy = json.loads(out.stdout)
    # Node names the id field in its own (camelCase) spelling, Go in the .proto's.
    snake = {
        rpc: re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), field)
        for rpc, field in policy["withId"].items()
    }
    return set(policy["ids"]), snake


def go_policy() -> tuple[set[str], dict[str, str]]:
    source = GO_RETRY.read_text()
    ids = {m for m in re.findall(r'"/(sandboxd\.v1\.\w+/\w+)":\s+true', source)}
    with_id = dict(re.findall(r'"/(sandboxd\.v1\.\w+/\w+)":\s+"(\w+)"', source))
    return ids, with_id


def test_node_and_go_retry_the_same_rpcs() -> None:
    node_ids, node_with_id = node_policy()
    go_ids, go_with_id = go_policy()
    assert node_ids and node_with_id
    assert node_ids == go_ids
    assert node_with_id == go_with_id
    known = {f"{svc}/{rpc}" for svc, rpcs in service_rpcs().items() for rpc in rpcs}
    assert node_ids | set(node_with_id) <= known, "a retry list names an RPC the protos lack"
