/* The records probes emit to user space: one header for every probe's event
 * struct, mirrored field by field in probes/events.py (tests/unit/
 * test_probes_events.py compiles this header and compares every offset and
 * size with the ctypes mirror).
 *
 * Layout rules: fixed-width types only, every field naturally aligned, padding
 * explicit, so the layout is the same for clang -target bpf, gcc on x86-64 and
 * ctypes. Units are in the names (_ns, _bytes).
 */
#ifndef PSLAT_EVENTS_H
#define PSLAT_EVENTS_H

#ifndef __BPF__
#include <linux/types.h>
#endif

/* Counter slots every probe has, in its per-CPU counters array. Probe-specific
 * slots follow from PSLAT_COUNTER_FIRST_EXTRA on. */
enum pslat_counter {
	PSLAT_COUNTER_SEEN = 0,        /* events the probe produced: delivered + lost */
	PSLAT_COUNTER_LOST = 1,        /* events the ring buffer refused (it was full) */
	PSLAT_COUNTER_FIRST_EXTRA = 2,
};

/* ---- sockcalls: send/recv family of syscalls on TCP sockets ------------- */

/* Which syscall. Values are stable: they go into recorded files. */
enum sockcall_call {
	SOCKCALL_READ = 1,
	SOCKCALL_WRITE = 2,
	SOCKCALL_READV = 3,
	SOCKCALL_WRITEV = 4,
	SOCKCALL_RECVFROM = 5,
	SOCKCALL_SENDTO = 6,
	SOCKCALL_RECVMSG = 7,
	SOCKCALL_SENDMSG = 8,
};

/* Extra counter slots of the sockcalls probe. */
enum sockcall_counter {
	SOCKCALL_COUNTER_EAGAIN = PSLAT_COUNTER_FIRST_EXTRA, /* calls that returned -EAGAIN: counted, not emitted */
	SOCKCALL_COUNTER_INFLIGHT_FULL = PSLAT_COUNTER_FIRST_EXTRA + 1, /* entries dropped: in-flight table full */
	SOCKCALL_COUNTER_NR = PSLAT_COUNTER_FIRST_EXTRA + 2,
};

/* flags */
#define SOCKCALL_F_ISN_EXACT    0x01 /* ISNs taken when the connection became ESTABLISHED */
#define SOCKCALL_F_ISN_DERIVED  0x02 /* ISNs derived at first sight from tcp_sock's byte counters (sockcalls.bpf.c) */
/* neither flag: the ISNs could not be read consistently this time (0) */
#define SOCKCALL_F_PAYLOAD_FAULT 0x04 /* reading the user buffer failed: payload[] is incomplete */

#define SOCKCALL_PAYLOAD_MAX 256

/* One completed syscall. Emitted at syscall exit; the record is cut after
 * payload[payload_bytes], so a reader must accept records shorter than
 * sizeof(struct sockcall_event). */
struct sockcall_event {
	__u64 enter_ts_ns;   /* bpf_ktime_get_ns() at syscall entry: CLOCK_MONOTONIC */
	__u64 exit_ts_ns;    /* ... at syscall exit */
	__u64 sk;            /* struct sock address: the socket's identity while it lives */
	__u64 sk_cookie;     /* sock_common.skc_cookie when first seen; 0 if nothing had asked the kernel for one yet */
	__s64 ret;           /* syscall return: bytes moved, or -errno */
	__u32 tgid;          /* process */
	__u32 tid;           /* thread */
	__u32 fd;
	__u32 netns_ino;     /* inode number of the socket's network namespace */
	__u32 seq_start;     /* sends: tcp_sock.write_seq at entry; receives: copied_seq at entry */
	__u32 seq_end;       /* the same at exit; [seq_start, seq_end) is what this call wrote/read
	                      * (a receive returning 0 at end of stream consumed the FIN: one more;
	                      * a MSG_PEEK receive returns bytes but consumes none: use the range) */
	__u32 isn_local;     /* initial sequence number of this end (first data byte = isn_local + 1) */
	__u32 isn_remote;    /* initial sequence number of the peer */
	__u8  saddr[16];     /* local address; IPv4 in the first 4 bytes */
	__u8  daddr[16];     /* remote address */
	__u16 family;        /* AF_INET or AF_INET6 */
	__u16 sport;         /* local port, host byte order */
	__u16 dport;         /* remote port, host byte order */
	__u16 payload_bytes; /* valid bytes in payload[] */
	__u8  call;          /* enum sockcall_call */
	__u8  flags;         /* SOCKCALL_F_* */
	__u8  _pad[6];
	char  comm[16];      /* thread name */
	__u8  payload[SOCKCALL_PAYLOAD_MAX]; /* first bytes the call moved (user buffer / iovecs in order) */
};

#endif /* PSLAT_EVENTS_H */
