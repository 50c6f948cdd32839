"""Commands in a sandbox, in the domain's terms: the `SandboxCommands` port and its one owner.

Every command the server runs in a sandbox (a helper subcommand, a tool under `sbx run`, a
caller's supervised command, a dial, a plain probe) is asked for as a typed `SandboxCommand`
(`types.py`); its `sbx` command line is built in one place (`argv.py`); and one implementation
(`sandbox.py`) runs it over the sandbox's agent channel when it has one, the engine's own exec
when it has none. The unit tests' fake of this port speaks the same types, never argv.
"""

# The port's names, as types.py lists them in its __all__ (the one list of them).
from sandboxd.commands.types import *  # noqa: F403
from sandboxd.commands.types import __all__ as __all__
