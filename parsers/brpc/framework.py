"""brpc's framework records (probes/framework.py, layer "brpc": one record per RPC end
at PackRpcRequest, OnVersionedRPCReturned, ProcessRpcRequest and SendRpcResponse) name
their wire message's ids themselves: the correlation id, which the response echoes on
the same connection (docs/paddle.md, "The framework boundary")."""
from __future__ import annotations

_INT64_SIGN = 1 << 63


class RecordIds:
    """The ids a brpc record names: call_key as parsers/protocol.py gives them for its
    wire message (call_space None: one counter per connection)."""
    keyed = True   # its records are probes.framework.KeyedMessage

    values_rejected = 0   # nothing here is refused: every 64-bit id is a correlation id

    @staticmethod
    def fill(fields: dict, sock_type: int | None, request: bool | None) -> None:
        # the wire's correlation_id is an int64; the probe reads its 64 bits unsigned
        cid = fields["sock"]
        fields["call_key"] = (None, cid - (1 << 64) if cid >= _INT64_SIGN else cid, request)
