"""BPF probes: declared in Python, written in C, compiled by bcc at run time.

- btf.py        kernel struct member offsets from /sys/kernel/btf/vmlinux
- tracefs.py    tracepoint field offsets from tracefs formats
- declare.py    what a probe is (Probe, Attach, KernelField, TracepointField)
- filters.py    --pid/--comm/--port/--netns as validated integers
- program.py    declarations -> C text + -D constants (printable: --print-bpf)
- loader.py     compile with bcc, fill filters, attach, ring buffers, counters
- events.h      every event struct; events.py its ctypes mirror
- common.bpf.h  shared BPF helpers (BTF-offset reads, fd -> TCP sock, filters)
- sockcalls.*   the send/recv family of syscalls on TCP sockets

Only loader.py imports bcc.
"""
