"""tarfile's header checksum, the same sums computed by C loops instead of a 504-field unpack.

The import parses every member's header with tarfile and writes a fresh one for the sanitised
copy (check.py), and tarfile sums each of those 512-byte blocks twice over (unsigned and
signed bytes) with `struct.unpack_from` and `sum` of 504 small ints: about 16 us a header, so
some 55 ms of the server's CPU for an import of a source tree of 1700 members, a sixth of all
it spends on it. `sum` of two byte slices and a `translate` that counts the bytes of 128 and
over give the same two numbers in about a fifth of the time (a byte b >= 128 is b - 256 when
signed, so the signed sum is the unsigned one less 256 per such byte).

`install` puts it in tarfile's module namespace, where its header parser and writer look the
name up at each call; the results are the ones tarfile's own function returns, for any block
(anything shorter than a header goes to the original, which refuses it as before).
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable

_HIGH = bytes(range(128, 256))
# Not in typeshed's tarfile: reached through the module's namespace.
_ORIGINAL: Callable[[bytes], tuple[int, int]] = vars(tarfile)["calc_chksums"]
_CHKSUM_AT, _CHKSUM_END, _BLOCK = 148, 156, 512


def calc_chksums(buf: bytes) -> tuple[int, int]:
    """(unsigned, signed) sums of the header block with its checksum field read as spaces."""
    if len(buf) < _BLOCK:
        return _ORIGINAL(buf)
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    head, tail = buf[:_CHKSUM_AT], buf[_CHKSUM_END:_BLOCK]
    unsigned = 256 + sum(head) + sum(tail)  # 256: the 8 spaces of the checksum field
    high = (
        len(head) - len(head.translate(None, _HIGH)) + len(tail) - len(tail.translate(None, _HIGH))
    )
    return unsigned, unsigned - 256 * high


def install() -> None:
    """Have tarfile use `calc_chksums` (idempotent)."""
    vars(tarfile)["calc_chksums"] = calc_chksums
