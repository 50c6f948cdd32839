"""The interceptors run as one Chain: the handler is looked up once and each layer wraps it in
the order a list of nested gRPC interceptors had (the first outermost), a missing method stays
missing, and a layer used alone is still an interceptor."""

from __future__ import annotations

from typing import Any

import grpc
from sandboxd.api.chain import Chain, Layer


class _Marking(Layer):
    def __init__(self, name: str, calls: list[str]) -> None:
        self._name = name
        self._calls = calls

    def wrap(self, handler: Any, handler_call_details: Any) -> Any:
        inner = handler.unary_unary
        name, calls = self._name, self._calls

        async def marked(request: Any, context: Any) -> Any:
            calls.append(f"{name} in")
            reply = await inner(request, context)
            calls.append(f"{name} out")
            return reply

        return handler._replace(unary_unary=marked)


async def _servicer(request: Any, context: Any) -> Any:
    return request + "!"


async def test_layers_wrap_in_list_order_with_one_lookup() -> None:
    calls: list[str] = []
    lookups = 0

    async def lookup(details: Any) -> Any:
        nonlocal lookups
        lookups += 1
        return grpc.unary_unary_rpc_method_handler(_servicer)

    chain = Chain([_Marking("outer", calls), _Marking("middle", calls), _Marking("inner", calls)])
    handler = await chain.intercept_service(lookup, None)
    assert await handler.unary_unary("hi", None) == "hi!"
    assert lookups == 1
    assert calls == ["outer in", "middle in", "inner in", "inner out", "middle out", "outer out"]


async def test_a_missing_method_stays_missing_and_a_layer_alone_still_intercepts() -> None:
    calls: list[str] = []

    async def nothing(details: Any) -> Any:
        return None

    async def found(details: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(_servicer)

    assert await Chain([_Marking("a", calls)]).intercept_service(nothing, None) is None
    alone = await _Marking("alone", calls).intercept_service(found, None)
    assert await alone.unary_unary("x", None) == "x!"
    assert calls == ["alone in", "alone out"]
