"""The keeper's uid and gid are not the caller's to take."""

from __future__ import annotations

import pytest
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.sessions.spec import check_reserved_user


@pytest.mark.parametrize("uid,gid", [(65533, 1000), (1000, 65533), (65533, 65533)])
def test_keeper_ids_are_refused(uid: int, gid: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_reserved_user(uid, gid, "65533:65533")
    assert err.value.reason == Reason.INVALID_USER
    assert "reserved" in str(err.value)


def test_other_ids_pass() -> None:
    check_reserved_user(1000, 1000, "65533:65533")
    check_reserved_user(65534, 65534, "065533:65533")
