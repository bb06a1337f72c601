"""parsers/grpc: gRPC over HTTP/2, from the bytes of one TCP direction to messages
(one per gRPC message; trailers as control messages). See parser.py."""
from .parser import PROTOCOL, GrpcMessage, GrpcStreamParser

__all__ = ["PROTOCOL", "GrpcMessage", "GrpcStreamParser"]
