"""The renamed fields and their deprecated originals: a request in either shape
means the same, and a reply fills both, so old callers see what they saw before."""

from __future__ import annotations

from sandboxd.api import egress_convert
from sandboxd.egress.policy import DEFAULT_QUOTAS
from sandboxd.v1 import common_pb2


def test_proxy_quotas_read_the_new_names_and_still_the_old() -> None:
    old = egress_convert.quotas(common_pb2.ProxyQuotas(max_bytes_up=10, max_bytes_down=20))
    new = egress_convert.quotas(common_pb2.ProxyQuotas(max_up_bytes=10, max_down_bytes=20))
    assert old == new
    assert (new.max_bytes_up, new.max_bytes_down) == (10, 20)
    both = egress_convert.quotas(common_pb2.ProxyQuotas(max_bytes_up=1, max_up_bytes=2))
    assert both.max_bytes_up == 2  # the new name wins


def test_proxy_quotas_replies_fill_both_names() -> None:
    pb = egress_convert.quotas_pb(DEFAULT_QUOTAS)
    assert pb.max_up_bytes == pb.max_bytes_up == DEFAULT_QUOTAS.max_bytes_up
    assert pb.max_down_bytes == pb.max_bytes_down == DEFAULT_QUOTAS.max_bytes_down
