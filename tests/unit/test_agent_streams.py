"""The streams table (issue 13, "Traffic that no protocol recognises"): one row per
connection the stream decoder saw, with what it moved each way and whether a parser
recognised it, written when the connection is dropped and at the stop. Synthetic
calls (test_agent_decode's records), no root."""
from __future__ import annotations

from agent.daemon import Pipeline
from agent.calls import SockcallAssembler
from agent.streams import SIGNATURE_BYTES, StreamDecoder
from agent.hosts import HostMap
from agent.rundir import read_run_dir
from test_agent_decode import CLIENT, ISN_C, ISN_S, calls_of, record, stream

HTTP_REQUEST = b"POST /rpc HTTP/1.1\r\nHost: ps0\r\nContent-Length: 64\r\n\r\n" + bytes(64)
HTTP_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n" + bytes(8)


def _exchange(rounds: int, sk: int = 0xABC, tid: int = 101, local=CLIENT) -> list[bytes]:
    """A client's calls of `rounds` HTTP requests and responses (not ps-lite)."""
    out, sent, got = [], 0, 0
    for i in range(rounds):
        out.append(record(True, ISN_C + 1 + sent, len(HTTP_REQUEST), HTTP_REQUEST, ts=1_000_000 * (i + 1),
                          sk=sk, tid=tid, local=local))
        sent += len(HTTP_REQUEST)
        out.append(record(False, ISN_S + 1 + got, len(HTTP_RESPONSE), HTTP_RESPONSE,
                          ts=1_000_000 * (i + 1) + 500_000, sk=sk, tid=tid, local=local))
        got += len(HTTP_RESPONSE)
    return out


def _decode(records) -> tuple[StreamDecoder, list]:
    rows = []
    dec = StreamDecoder(on_stream=lambda conn, end: rows.append((conn, end)))
    asm = SockcallAssembler("prefix")
    for r in records:
        c = asm.feed(r)
        if c is not None:
            dec.feed(c)
    return dec, rows


def test_a_connection_no_parser_recognises_is_said_with_what_it_moved():
    from agent.streams import stream_row

    dec, dropped = _decode(_exchange(5))
    assert dropped == []            # still open
    dec.finish()                    # the stop
    [(conn, end)] = dropped
    row = stream_row(conn, "h1", end)
    assert end == "open_at_stop" and row["protocol"] == "unrecognised"
    assert (row["calls_tx"], row["bytes_tx"], row["calls_rx"], row["bytes_rx"]) == (
        5, 5 * len(HTTP_REQUEST), 5, 5 * len(HTTP_RESPONSE))
    assert row["messages_tx"] == row["messages_rx"] == 0
    assert bytes.fromhex(row["signature_tx"]) == HTTP_REQUEST[:SIGNATURE_BYTES]
    assert bytes.fromhex(row["signature_rx"]) == HTTP_RESPONSE[:SIGNATURE_BYTES]
    assert row["signature_offset_tx"] == row["signature_offset_rx"] == 0
    assert row["pids"] == [100] and row["threads"] == ["pslat-test"]
    assert len(dec.conns) == 1   # said, not dropped: its parsers keep what they hold


def test_a_pslite_connection_is_recognised():
    from agent.streams import stream_row

    data, _ = stream(3)
    dec, dropped = _decode(calls_of(data, 200, ISN_C))
    dec.finish()
    [(conn, end)] = dropped
    row = stream_row(conn, "h1", end)
    assert row["protocol"] == "pslite" and row["bytes_tx"] == len(data) and row["messages_tx"] == 3


def test_the_pipeline_writes_a_streams_row_per_connection_and_host(tmp_path):
    pipe = Pipeline(tmp_path, HostMap("h", names={}), {"clock": {}})
    data, _ = stream(2)
    for r in _exchange(3, sk=0x1) + calls_of(data, 200, ISN_C):   # the ps-lite one on socket 0xABC
        pipe.handle("sockcalls", r)
    pipe.close()
    t = read_run_dir(tmp_path / "h").tables["streams"]
    assert sorted(t["protocol"]) == ["pslite", "unrecognised"]
    http = t[t.protocol == "unrecognised"].iloc[0]
    assert http["bytes_tx"] == 3 * len(HTTP_REQUEST) and http["end"] == "open_at_stop"
    assert len(read_run_dir(tmp_path / "h").tables["messages"]) == 2
