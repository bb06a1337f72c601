"""Packet captures (pcap, pcapng) -> the run-dir tables the report reads (docs/capture.md).

    read.py        capture files -> packet records (time, link type, bytes, wire length)
    decode.py      link, IP and TCP headers -> TCP segments
    reassembly.py  segments -> one direction's bytes in order, gaps, each byte's time
    point.py       one capture point's segments -> message, streams, clock-sample rows
    rundir.py      captures -> run dirs (one per capture point) that `pslat report` reads
    annotate.py    a host's packets + the agent's rows of it -> commented pcapng packets (agent --pcap)
    pcapng_write.py  pcapng out: interfaces per host, ns times, a comment per packet

A capture sees no syscall and no framework call: its rows carry the stages a
packet tap sees (a send at the driver handoff, a receive at netif_receive) and
null, with the reason, for the rest. Capture files come from other hosts: every
reader here bounds its time and memory and opens only regular files.
"""
