"""What a server that no session has asked anything of keeps loaded (idle RSS target 80 MiB).

`cryptography` (some 12 MiB of RSS: its Rust extension and the x509/AEAD modules) is loaded
when a secret is first sealed or a session's CA drawn, not at start-up.
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
