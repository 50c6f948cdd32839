"""What a server that no session has asked anything of keeps loaded (idle RSS target 80 MiB).

`cryptography` (some 12 MiB of RSS: its Rust extension and the x509/AEAD modules) is loaded
when a secret is first sealed or a session's CA drawn, or the E2B door first issues or opens an
access token, not at start-up (nor when the door starts listening). The door's HTTP stack
(hypercorn, h2, h11, wsproto) and its app are loaded by the first connection to it; the
OpenTelemetry SDK, zstandard and the multipart parser by what first needs them.
"""

from __future__ import annotations

import json

from fresh_python import run_snippet

_START = """
import json, sys
import sandboxd.server  # everything the server imports
from sandboxd.secrets import vault
from sandboxd.secrets.setup import SecretsSetup

sealer = vault.configure("", "").sealer  # as server_parts does at start
SecretsSetup()
at_start = sorted(m for m in sys.modules if m.split(".")[0] == "cryptography")
sealed = sealer.seal(b"value", "ctx")
print(json.dumps({"at_start": at_start, "opened": sealer.open(sealed, "ctx").decode(),
                  "after_use": "cryptography" in sys.modules}))
"""


def test_start_up_does_not_load_cryptography_and_sealing_still_works() -> None:
    out = run_snippet(_START).stdout
    result = json.loads(out)
    assert result["at_start"] == []
    assert result["opened"] == "value"
    assert result["after_use"] is True


_DOOR = """
import json, sys
import sandboxd.server
import sandboxd.e2b.listener  # what the door loads when `e2b_listen` is set
from sandboxd.e2b.tokens import AccessTokens

tokens = AccessTokens(bytes(32))  # as the door does at start
at_start = sorted(m for m in sys.modules if m.split(".")[0] == "cryptography")
token = tokens.issue("sbx1", "key")
print(json.dumps({"at_start": at_start, "opened": tokens.open("sbx1", token),
                  "after_use": "cryptography" in sys.modules}))
"""


def test_the_e2b_door_loads_cryptography_with_its_first_token() -> None:
    result = json.loads(run_snippet(_DOOR).stdout)
    assert result["at_start"] == []
    assert result["opened"] == "key"
    assert result["after_use"] is True


_LAZY_DOOR = """
import asyncio, json, sys, tempfile
from sandboxd.config import load_config
from sandboxd.e2b.listener import door

def http_stack():
    return sorted(m for m in ("hypercorn", "h2", "h11", "wsproto", "sandboxd.e2b.app")
                  if m in sys.modules)

async def main():
    data = tempfile.mkdtemp()
    flags = ["--e2b-listen", "127.0.0.1:0", "--data-dir", data, "--helper", sys.executable]
    config = load_config(flags, env={})  # any executable as the helper: no sandbox is made
    async with door(config, 1) as port:
        await asyncio.sleep(0.1)
        listening = http_stack()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        status = (await asyncio.wait_for(reader.readline(), 20)).decode().strip()
        writer.close()
        print(json.dumps({"listening": listening, "status": status, "after": http_stack()}))

asyncio.run(main())
"""


def test_the_e2b_door_loads_its_http_stack_with_the_first_connection() -> None:
    result = json.loads(run_snippet(_LAZY_DOOR).stdout)
    assert result["listening"] == []
    assert result["status"].startswith("HTTP/1.1 ")  # the first caller is served
    assert result["after"] == ["h11", "h2", "hypercorn", "sandboxd.e2b.app", "wsproto"]


_OPTIONAL = """
import json, sys
import sandboxd.server, sandboxd.e2b.listener
loaded = [m for m in ("opentelemetry.sdk", "zstandard", "python_multipart") if m in sys.modules]
from sandboxd.archive import compressed
compressed.compress(b"x")
print(json.dumps({"loaded": loaded, "zstd_on_use": "zstandard" in sys.modules}))
"""


def test_start_up_loads_no_tracing_sdk_zstandard_or_multipart_parser() -> None:
    # The SDK only exports spans (otlp_endpoint); zstandard serves compressed archives; the
    # multipart parser the door's uploads.
    result = json.loads(run_snippet(_OPTIONAL).stdout)
    assert result == {"loaded": [], "zstd_on_use": True}
