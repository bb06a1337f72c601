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
	SOCKCALL_COUNTER_WALK_BYTES = PSLAT_COUNTER_FIRST_EXTRA + 2,    /* bytes the walker followed */
	SOCKCALL_COUNTER_FRAMES = PSLAT_COUNTER_FIRST_EXTRA + 3,        /* frame headers it read */
	SOCKCALL_COUNTER_MESSAGES = PSLAT_COUNTER_FIRST_EXTRA + 4,      /* message ends it saw */
	SOCKCALL_COUNTER_DESYNCS = PSLAT_COUNTER_FIRST_EXTRA + 5,       /* impossible frame headers: the connection went unsynced */
	SOCKCALL_COUNTER_KEY_SAMPLES = PSLAT_COUNTER_FIRST_EXTRA + 6,   /* keys copied out as samples */
	SOCKCALL_COUNTER_TRUNCATED = PSLAT_COUNTER_FIRST_EXTRA + 7,     /* meta/command frames longer than their copy bound */
	SOCKCALL_COUNTER_NOT_ZMTP = PSLAT_COUNTER_FIRST_EXTRA + 8,      /* connections whose first bytes are not their framing's (ZMTP: no ZMTP 3 greeting) */
	SOCKCALL_COUNTER_STREAM_GAPS = PSLAT_COUNTER_FIRST_EXTRA + 9,   /* walked connections whose next call did not start where the last ended */
	SOCKCALL_COUNTER_WALK_ABORTED = PSLAT_COUNTER_FIRST_EXTRA + 10, /* walks given up: frame budget, iovecs, faults, no walker program */
	SOCKCALL_COUNTER_HINTS_APPLIED = PSLAT_COUNTER_FIRST_EXTRA + 11, /* sync hints that started a walk */
	SOCKCALL_COUNTER_HINTS_STALE = PSLAT_COUNTER_FIRST_EXTRA + 12,  /* sync hints the stream had already passed */
	SOCKCALL_COUNTER_SELF_SYNCS = PSLAT_COUNTER_FIRST_EXTRA + 13,   /* unsynced connections the walker synced by itself (walk_engine.bpf.h, self-sync) */
	SOCKCALL_COUNTER_WALK_BUDGET = PSLAT_COUNTER_FIRST_EXTRA + 14,  /* calls with more frames than the walker's step budget: the rest unwalked */
	SOCKCALL_COUNTER_HUNTED_BYTES = PSLAT_COUNTER_FIRST_EXTRA + 15, /* unsynced bytes the walker searched for a frame chain and rejected */
	/* Entries made in and removed from the per-connection LRU maps: what a
	 * full map evicted is at least made - removed - its size (user space). */
	SOCKCALL_COUNTER_CONNS_MADE = PSLAT_COUNTER_FIRST_EXTRA + 16,   /* sockcalls_conns */
	SOCKCALL_COUNTER_CONNS_REMOVED = PSLAT_COUNTER_FIRST_EXTRA + 17,
	SOCKCALL_COUNTER_WALKS_MADE = PSLAT_COUNTER_FIRST_EXTRA + 18,   /* sockcalls_walk (one per direction) */
	SOCKCALL_COUNTER_WALKS_REMOVED = PSLAT_COUNTER_FIRST_EXTRA + 19,
	/* The message records (struct sockcall_msg), when compiled in: */
	SOCKCALL_COUNTER_MSGS_OUT = PSLAT_COUNTER_FIRST_EXTRA + 20,    /* records sent */
	SOCKCALL_COUNTER_MSGS_LOST = PSLAT_COUNTER_FIRST_EXTRA + 21,   /* message ends without one: its ring was full, or the tail-call budget ran out */
	SOCKCALL_COUNTER_NR = PSLAT_COUNTER_FIRST_EXTRA + 22,
};
#define SOCKCALL_COUNTER_NOT_PROTOCOL SOCKCALL_COUNTER_NOT_ZMTP /* the engine's name for it */

/* The walker's framings (probes/framings.bpf.h): which protocol a direction
 * of a connection is walked as. Values are stable: they go into recorded
 * files (WALK_START's detail). */
#define SOCKCALL_PROTO_NONE 0 /* not walked (a WALK_START written before protocols were said: ZMTP) */
#define SOCKCALL_PROTO_ZMTP 1 /* ZMTP 3 (ps-lite): probes/zmtp_framing.bpf.h */
#define SOCKCALL_PROTO_BRPC 2 /* brpc's baidu_std (PaddlePaddle's parameter server): probes/brpc_framing.bpf.h */
#define SOCKCALL_PROTO_MAX  2

/* flags */
#define SOCKCALL_F_ISN_EXACT    0x01 /* ISNs taken when the connection became ESTABLISHED */
#define SOCKCALL_F_ISN_DERIVED  0x02 /* ISNs derived at first sight from tcp_sock's byte counters (sockcalls.bpf.c) */
/* neither flag: the ISNs could not be read consistently this time (0) */
#define SOCKCALL_F_PAYLOAD_FAULT 0x04 /* reading the user buffer failed: the walk stopped there (WALK_END, FAULT) */
#define SOCKCALL_F_CONTINUED    0x08 /* the call's items did not fit: the next record of this thread continues them */

/* Bytes of items per record (a power of two). */
#define SOCKCALL_PAYLOAD_MAX 16384

/* One completed syscall. Emitted at syscall exit; the record is cut after
 * payload[payload_bytes], so a reader must accept records shorter than
 * sizeof(struct sockcall_event). A call whose items do not fit in one record
 * is several records with the same header, all but the last flagged
 * SOCKCALL_F_CONTINUED. */
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
	__u8  payload[SOCKCALL_PAYLOAD_MAX]; /* items (struct sockcall_item + body), in call order */
};

/* ---- sockcalls: what the walker says about the bytes of a call ------------
 *
 * payload[] is a sequence of items, each a struct sockcall_item followed by
 * `len` bytes (not padded). `call_off` counts bytes from the call's first
 * byte (TCP sequence seq_start). Within a walked range (WALK_START up to
 * WALK_END or the end of the call) every byte not carried by a BYTES item is
 * inside a frame body; outside it, bytes not carried are unknown, or, inside
 * a HUNTED item's range, searched for a frame chain and rejected. */
enum sockcall_item_kind {
	SOCKCALL_ITEM_BYTES = 1,      /* the stream's bytes at call_off (what: SOCKCALL_BYTES_*) */
	SOCKCALL_ITEM_WALK_START = 2, /* struct sockcall_walk_mark: frames are followed from call_off on */
	SOCKCALL_ITEM_WALK_END = 3,   /* struct sockcall_walk_mark: ... no longer from call_off on */
	SOCKCALL_ITEM_MSG_END = 4,    /* struct sockcall_msg_end: a message's last byte is at call_off - 1 */
	SOCKCALL_ITEM_KEYS = 5,       /* struct sockcall_keys + count keys: the keys in [call_off, +scanned_bytes) were hashed */
	SOCKCALL_ITEM_RX_TIMES = 6,   /* struct ns_rx_times for the message ending at call_off (receives) */
	SOCKCALL_ITEM_SCHED = 7,      /* struct ns_sched: the calling thread, at this receive's exit */
	SOCKCALL_ITEM_WINDOW = 8,     /* struct ns_window: the socket, at this send's exit */
	SOCKCALL_ITEM_HUNTED = 9,     /* struct sockcall_hunted: [call_off, +bytes) was searched for a frame chain, not copied,
	                               * and holds none (garbage, or the tail of a message joined mid-way) */
};

/* BYTES items: what the bytes are (OR-ed when adjacent pieces merged). */
#define SOCKCALL_BYTES_PREFIX   0x01 /* the call's first bytes, not walked (unsynced connection) */
#define SOCKCALL_BYTES_GREETING 0x02 /* the connection's preface (ZMTP: its greeting) */
#define SOCKCALL_BYTES_HEADER   0x04 /* frame header(s) (a header may be split across calls) */
#define SOCKCALL_BYTES_BODY     0x08 /* a body the framing copies, up to its copy bound (ZMTP: meta (frame 0) or command frame) */
#define SOCKCALL_BYTES_RAW      0x10 /* bytes right after WALK_END, for user space to hunt in */

/* WALK_START how */
#define SOCKCALL_WALK_GREETING  1 /* the connection's first byte: synced from its preface (ZMTP: the greeting) */
#define SOCKCALL_WALK_FIRST_BYTE SOCKCALL_WALK_GREETING /* the engine's name for it */
#define SOCKCALL_WALK_CONTINUE  2 /* the walk of the previous call goes on */
#define SOCKCALL_WALK_HINT      3 /* a sync hint from user space placed a frame header here */
#define SOCKCALL_WALK_SELF      4 /* unsynced: the walker found sync by itself (walk_engine.bpf.h, self-sync:
                                   * a chain of frames from a framing's candidate, for ZMTP a ps-lite meta header;
                                   * user space may still disagree) */

/* WALK_END reasons */
#define SOCKCALL_STOP_NOT_ZMTP    1 /* the first bytes are not the framing's (ZMTP: no ZMTP 3 greeting) */
#define SOCKCALL_STOP_NOT_PROTOCOL SOCKCALL_STOP_NOT_ZMTP /* the engine's name for it */
#define SOCKCALL_STOP_OPAQUE      2 /* a preface that says the frames are encrypted (ZMTP: the CURVE mechanism) */
#define SOCKCALL_STOP_BAD_FLAGS   3 /* a header with reserved flag bits (detail: the flags) */
#define SOCKCALL_STOP_BAD_SIZE    4 /* a frame longer than 2^SOCKCALLS_FRAME_MAX_BITS */
#define SOCKCALL_STOP_BAD_COMMAND 5 /* a command with MORE, inside a message, or too long */
#define SOCKCALL_STOP_STREAM_GAP  6 /* this call does not start where the walk stopped (calls missed) */
#define SOCKCALL_STOP_BUDGET      7 /* more frames in one call than the walker's step budget */
#define SOCKCALL_STOP_IOV         8 /* bytes beyond the iovecs the walker reads */
#define SOCKCALL_STOP_FAULT       9 /* the user buffer could not be read */
#define SOCKCALL_STOP_NO_WALKER  10 /* the walker program was not installed yet */
#define SOCKCALL_STOP_BAD_MAGIC  11 /* a header without the framing's magic (brpc: "PRPC") */
/* Reasons that mean the bytes are no header the framing accepts there: the
 * stream lost sync (counted desyncs; the walker hunts in the rest of the call). */
#define SOCKCALL_STOP_DESYNC(r) \
	((r) == SOCKCALL_STOP_BAD_FLAGS || (r) == SOCKCALL_STOP_BAD_SIZE || (r) == SOCKCALL_STOP_BAD_COMMAND || \
	 (r) == SOCKCALL_STOP_BAD_MAGIC)

struct sockcall_item {
	__u8  kind;          /* enum sockcall_item_kind */
	__u8  what;          /* BYTES: SOCKCALL_BYTES_* */
	__u16 len;           /* bytes that follow */
	__u32 call_off;
};

struct sockcall_walk_mark {
	__u32 frame_idx;     /* WALK_START: index in its message of the frame the walk is in */
	__u8  how;           /* WALK_START: SOCKCALL_WALK_*; WALK_END: SOCKCALL_STOP_* */
	__u8  phase;         /* the walker's phase there (walk_engine.bpf.h enum wk_phase) */
	__u16 detail;        /* WALK_START: the framing walked from here on (SOCKCALL_PROTO_*);
	                      * WALK_END BAD_FLAGS and BAD_COMMAND: the flags byte */
};

struct sockcall_hunted {
	__u32 bytes;         /* bytes searched, from call_off */
	__u32 _pad;
};

struct sockcall_msg_end {
	__u32 end_seq;       /* TCP sequence one past the message's last byte */
	__u32 frames;        /* frames of the message */
	__u64 msg_index;     /* messages this direction of the connection ended before it, since the walk began */
};

/* ---- sockcalls: one fixed record per message end (issue 15's fast path) ----
 *
 * Sent to its own ring (sockcalls_msgs) for every message end the walker
 * finds, beside the call's record, when SOCKCALLS_MSG_RECORDS is compiled
 * in. `items` is the slice of the call's payload that belongs to the
 * message: the items from the previous message end of the call (or from the
 * call's first item) up to and including this message's MSG_END item. They
 * decode as a call's payload does (probes/events.py decode_items): the
 * framing's copied headers and id-bearing bodies, key samples, marks. */
#define SOCKCALL_MSG_ITEMS_MAX 512 /* a power of two */

#define SOCKCALL_MSG_F_ITEMS_CUT  0x01 /* the slice is longer than items[]: its first items_bytes only */
#define SOCKCALL_MSG_F_ITEMS_LOST 0x02 /* the slice began in an earlier record of the call (flushed): items[] is empty */
#define SOCKCALL_MSG_F_RX_TIMES   0x04 /* rx holds the netstack's times (receives, with the netstack probe) */
/* struct sockcall_msg: after the netstack section (it holds a struct ns_rx_times) */


/* A stretch of frame 1 (ps-lite's keys, little-endian uint64) that was
 * hashed: key t of the stretch (at call_off + 8 t) is sampled iff
 * splitmix64(key) >> (64 - level) == 0 (level 0: every key). Followed by
 * `count` keys: the sampled ones, lowest t first, up to the message's cap
 * (bit t of mask set for every sampled key, also those past the cap). */
struct sockcall_keys {
	__u32 scanned_bytes; /* whole keys from call_off on */
	__u8  level;
	__u8  count;         /* keys that follow */
	__u16 _pad;
	__u64 mask;
};

/* ==== netstack: BEGIN (owner: probes/netstack.bpf.c, probes/rings.bpf.h) ====
 * Kernel network stack, per message end (not per packet): the walker in
 * sockcalls.bpf.c calls the ns_* functions of rings.bpf.h, and the netstack
 * probe emits the events below into its own ring (ns_events). Every event
 * starts with a one-byte kind. */

enum ns_event_kind {
	NS_EV_TX = 1,      /* struct ns_tx_event: a message's last byte handed to the driver */
	NS_EV_TX_DONE = 2, /* struct ns_tx_done_event: what became of that skb after the driver */
	NS_EV_RETRANS = 3, /* struct ns_retrans_event: tcp:tcp_retransmit_skb on a traced socket */
	NS_EV_CONN = 4,    /* struct ns_conn_event: sock:inet_sock_set_state on a traced socket */
	NS_EV_CALL = 5,    /* struct ns_call_event: connect()/accept() of a selected process */
	NS_EV_CLOCK = 6,   /* struct ns_clock_event: a segment that starts a burst, for the clock estimate */
};

/* Extra counter slots of the netstack probe. */
enum ns_counter {
	NS_COUNTER_TX_EXPECT_OVERWRITTEN = PSLAT_COUNTER_FIRST_EXTRA, /* expected ends pushed out of their socket's ring before reaching the driver */
	NS_COUNTER_TX_SENT_UNSEEN = PSLAT_COUNTER_FIRST_EXTRA + 1,    /* expected ends already sent whose driver handoff was not on record */
	NS_COUNTER_RX_NETIF_OVERWRITTEN = PSLAT_COUNTER_FIRST_EXTRA + 2, /* RX lookups whose segment record was pushed out of the flow ring */
	NS_COUNTER_RX_NETIF_MISSING = PSLAT_COUNTER_FIRST_EXTRA + 3,  /* RX lookups that found no record of the segment (other reasons) */
	NS_COUNTER_RX_DR_MISSING = PSLAT_COUNTER_FIRST_EXTRA + 4,     /* RX lookups without a data-ready at or past the end */
	NS_COUNTER_SKB_UNPARSED = PSLAT_COUNTER_FIRST_EXTRA + 5,      /* skbs of traced sockets/flows whose headers could not be read */
	NS_COUNTER_TRACK_FAILED = PSLAT_COUNTER_FIRST_EXTRA + 6,      /* sockets whose state could not be created */
	NS_COUNTER_SOCKS_MADE = PSLAT_COUNTER_FIRST_EXTRA + 7,        /* tracked sockets (ns_tx_socks, with their rx state and flow ring) */
	NS_COUNTER_SOCKS_REMOVED = PSLAT_COUNTER_FIRST_EXTRA + 8,     /* of those, removed at close or when shed */
	NS_COUNTER_NR = PSLAT_COUNTER_FIRST_EXTRA + 9,
};

/* ns_tx_event.flags */
#define NS_TX_F_RETRANS        0x0001 /* the end was handed to the driver again (a retransmission); the first event stands */
#define NS_TX_F_OVERWRITTEN    0x0002 /* pushed out of the socket's ring before its segment reached the driver: no times */
#define NS_TX_F_CLOSED         0x0004 /* the socket closed before the segment reached the driver: no times */
#define NS_TX_F_SENT_UNSEEN    0x0008 /* already sent when registered, but its handoff is not on record (ring overwritten, or sent before the socket was tracked): no times */
#define NS_TX_F_NO_QUEUE       0x0010 /* no net_dev_queue seen for the skb (e.g. segmented after the qdisc): ts_queue_ns is 0 */
#define NS_TX_F_BEFORE_EXPECT  0x0020 /* handed to the driver before ns_tx_expect_end was called (normal: veth and loopback transmit inside the send syscall) */
#define NS_TX_F_STACKED        0x0040 /* the skb went through more than one device (vlan, bond, bridge...): the times are of the latest */
#define NS_TX_F_NEXT_DEVICE    0x0080 /* an extra event: the skb of an earlier event for this end was passed on to another device (ifindex); the last event of an end is the real driver's handoff */

/* ns_tx_done_event.reason */
#define NS_TXC_COMPLETED  1 /* consume_skb of the transmitted skb: the driver released it (TX completion) */
#define NS_TXC_FORWARDED  2 /* the skb reappeared on a receive path: the device (veth, loopback) hands skbs to a peer and has no TX completion */
#define NS_TXC_DROPPED    3 /* kfree_skb of the transmitted skb: dropped after the driver handoff */

/* A message end handed to the driver. Exactly one event per ns_tx_expect_end
 * call without NS_TX_F_RETRANS or NS_TX_F_NEXT_DEVICE (times, or a flag
 * saying why not), plus one NS_TX_F_RETRANS event per later re-send of the
 * same end and one NS_TX_F_NEXT_DEVICE event per further device an already
 * reported skb is passed to. */
struct ns_tx_event {
	__u8  kind;          /* NS_EV_TX */
	__u8  nr_xmit;       /* handoffs of this end so far (1 = first transmission) */
	__u16 flags;         /* NS_TX_F_* */
	__u32 end_seq;       /* the message's last byte is end_seq - 1 */
	__u64 sk;            /* struct sock address */
	__u64 msg_id;        /* the caller's id for the message */
	__u64 ts_expect_ns;  /* when ns_tx_expect_end was called (send syscall exit) */
	__u64 ts_queue_ns;   /* net_dev_queue of the skb that carried byte end_seq - 1 (qdisc entry); 0: flags */
	__u64 ts_xmit_ns;    /* net_dev_start_xmit of that skb (driver handoff); 0: flags */
	__u32 skb_seq;       /* sequence range of that skb's payload: [skb_seq, skb_end_seq) */
	__u32 skb_end_seq;
	__u32 ifindex;       /* device it was handed to */
	__u32 netns_ino;     /* the socket's network namespace */
};

/* What happened to the skb carrying a message end after the driver handoff.
 * At most one per NS_EV_TX event that had times (stacked devices: the last
 * device's). */
struct ns_tx_done_event {
	__u8  kind;          /* NS_EV_TX_DONE */
	__u8  reason;        /* NS_TXC_* */
	__u16 _pad;
	__u32 end_seq;
	__u64 sk;
	__u64 msg_id;
	__u64 ts_xmit_ns;    /* the handoff this is about */
	__u64 ts_done_ns;    /* NS_TXC_COMPLETED: the TX completion; NS_TXC_DROPPED: the drop; NS_TXC_FORWARDED: 0 (there is none) */
	__u32 ifindex;
	__u32 netns_ino;
};

struct ns_retrans_event {
	__u8  kind;          /* NS_EV_RETRANS */
	__u8  state;         /* TCP state of the socket */
	__u16 family;
	__u32 netns_ino;
	__u64 ts_ns;
	__u64 sk;
	__u32 seq;           /* the retransmitted skb: [seq, end_seq) (tcp_skb_cb; SYN/FIN count one) */
	__u32 end_seq;
	__s32 err;           /* the tracepoint's err: 0 when the retransmission was sent */
	__u16 sport;         /* host byte order */
	__u16 dport;
	__u8  saddr[16];     /* IPv4 in the first 4 bytes */
	__u8  daddr[16];
};

/* ns_conn_event.flags */
#define NS_CONN_F_ISN   0x01 /* isn_local/isn_remote are valid (taken at ESTABLISHED) */
#define NS_CONN_F_TGID  0x02 /* tgid is the process that connected / accepts on the listener */

struct ns_conn_event {
	__u8  kind;          /* NS_EV_CONN */
	__u8  oldstate;      /* TCP_* state numbers (include/net/tcp_states.h) */
	__u8  newstate;
	__u8  flags;         /* NS_CONN_F_* */
	__u32 netns_ino;
	__u64 ts_ns;
	__u64 sk;
	__u64 sk_cookie;     /* 0 when nothing has asked the kernel for one yet */
	__u32 tgid;
	__u32 isn_local;
	__u32 isn_remote;
	__u16 family;
	__u16 sport;
	__u16 dport;
	__u16 _pad;
	__u8  saddr[16];
	__u8  daddr[16];
	__u32 _pad2;
};

/* A payload segment of a traced flow that starts a burst: nothing else of the
 * flow was handed to the driver (sender) / arrived (receiver) for
 * NS_CLOCK_GAP_NS before it, carrying at least NS_CLOCK_MIN_BYTES (a smaller
 * one is a whole message, sampled by its own times). Both ends report the
 * first segment of a large message sent after a pause; user space matches them by flow and seq into one-way
 * samples for the clock estimate (reports/clocks.py). A message's last
 * segment, which the per-message times describe, queues behind its own
 * burst on the way; the first does not. Re-sends are not reported by the
 * sender; the receiver reports what arrives (user space keeps the first). */
struct ns_clock_event {
	__u8  kind;          /* NS_EV_CLOCK */
	__u8  rx;            /* 0: handed to the driver (net_dev_start_xmit) by the sender; 1: arrived at the receiver */
	__u16 family;        /* AF_INET / AF_INET6 (v4-mapped sockets report IPv4, as their packets) */
	__u32 netns_ino;
	__u64 ts_ns;         /* the handoff, or the arrival (NAPI GRO entry / netif_rx, else netif_receive_skb) */
	__u32 seq;           /* the segment's first payload byte */
	__u16 sport;         /* the segment's source and destination ports, host byte order */
	__u16 dport;
	__u8  saddr[16];     /* the segment's source address (IPv4 in the first 4 bytes) */
	__u8  daddr[16];
};

#define NS_CALL_CONNECT 1
#define NS_CALL_ACCEPT  2

/* One connect() or accept()/accept4() of a selected process on a TCP socket. */
struct ns_call_event {
	__u8  kind;          /* NS_EV_CALL */
	__u8  call;          /* NS_CALL_* */
	__u16 family;
	__u32 netns_ino;
	__u64 ts_enter_ns;   /* 0: an accept() that began before the probe attached */
	__u64 ts_exit_ns;
	__u64 sk;            /* connect: the socket; accept: the new socket (0 when the call failed) */
	__s64 ret;           /* connect: 0 or -errno (-EINPROGRESS for non-blocking); accept: the new fd or -errno */
	__u32 tgid;
	__u32 tid;
	__u32 fd;            /* connect: the socket's fd; accept: the listener's fd (~0 when ts_enter_ns is 0) */
	__u16 sport;
	__u16 dport;
	__u8  saddr[16];
	__u8  daddr[16];
	char  comm[16];
};

/* Filled by ns_rx_lookup_end(). */
#define NS_RX_F_NETIF          0x0001 /* ts_netif_ns found */
#define NS_RX_F_NIC            0x0002 /* ts_nic_ns found */
#define NS_RX_F_DATA_READY     0x0004 /* ts_data_ready_ns found */
#define NS_RX_F_NO_NAPI        0x0008 /* the segment reached netif_receive_skb with no arrival record (neither NAPI GRO entry nor netif_rx): no NIC time */
#define NS_RX_F_NETIF_OVERWRITTEN 0x0010 /* the segment's record was pushed out of the flow ring */
#define NS_RX_F_NETIF_MISSING  0x0020 /* no record of the segment (arrived before the flow was tracked, or not seen) */
#define NS_RX_F_DR_OVERWRITTEN 0x0040 /* the data-ready found may not be the first: older ones were pushed out of the ring */
#define NS_RX_F_DR_MISSING     0x0080 /* no data-ready at or past end_seq on record */
#define NS_RX_F_DUPLICATE      0x0100 /* the segment arrived more than once (retransmission): reported is the last arrival before the data-ready (the one that delivered it), or the first without one */
#define NS_RX_F_UNTRACKED      0x0200 /* the socket was not tracked before this call (tracking starts now) */
#define NS_RX_F_NOT_LOADED     0x8000 /* the netstack probe is not part of this program */

struct ns_rx_times {
	__u64 ts_nic_ns;        /* arrival (napi_gro_receive_entry or netif_rx) of the segment carrying byte end_seq - 1; 0: flags */
	__u64 ts_netif_ns;      /* netif_receive_skb of the skb carrying it; 0: flags */
	__u64 ts_data_ready_ns; /* first sk_data_ready after which rcv_nxt >= end_seq; 0: flags */
	__u32 data_ready_rcv_nxt; /* rcv_nxt at that data-ready */
	__u32 flags;            /* NS_RX_F_* */
};

/* Filled by ns_thread_sched(). */
#define NS_SCHED_F_TRACKED    0x01 /* the thread was tracked before this call: the fields are valid */
#define NS_SCHED_F_NOT_LOADED 0x80

struct ns_sched {
	__u64 ts_wakeup_ns;    /* latest sched_wakeup of the thread; 0: none since tracking began */
	__u64 ts_switch_in_ns; /* latest time it was switched in; 0: none yet */
	__u64 oncpu_ns;        /* on-CPU time of its completed slices since tracking began
	                        * (the current slice, from ts_switch_in_ns to now, is not in it) */
	__u64 runq_ns;         /* time spent runnable but not running (wake-up or preemption to switch-in), since tracking began */
	__u64 ts_tracked_ns;   /* when tracking of this thread began */
	__u32 nr_switch_in;
	__u32 flags;           /* NS_SCHED_F_* */
};

/* Filled by ns_window_state(): tcp_sock and sock fields as the kernel has them. */
#define NS_WIN_F_VALID      0x01
#define NS_WIN_F_NOT_LOADED 0x80

struct ns_window {
	__u32 snd_cwnd;        /* segments */
	__u32 snd_ssthresh;    /* segments */
	__u32 packets_out;     /* segments in flight */
	__u32 retrans_out;     /* retransmitted segments in flight */
	__u32 snd_wnd;         /* bytes: the peer's receive window as advertised (scaled) */
	__u32 snd_una;
	__u32 snd_nxt;
	__u32 write_seq;
	__u32 mss_cache;       /* bytes */
	__s32 wmem_queued_bytes; /* sock.sk_wmem_queued: bytes in the write queue (sent and unsent) */
	__s32 sndbuf_bytes;    /* sock.sk_sndbuf */
	__u32 flags;           /* NS_WIN_F_* */
};
/* ==== netstack: END ==== */

/* The fixed message record of the sockcalls section (SOCKCALL_MSG_*, above). */
struct sockcall_msg {
	__u64 enter_ts_ns;   /* the call holding the message's last byte: entry (CLOCK_MONOTONIC) */
	__u64 exit_ts_ns;    /* ... and exit */
	__u64 sk;
	__u64 msg_index;     /* as in its MSG_END item */
	__u32 tgid;
	__u32 tid;
	__u32 netns_ino;
	__u32 seq_start;     /* the call's range, as in its record */
	__u32 seq_end;
	__u32 end_seq;       /* TCP sequence one past the message's last byte */
	__u32 frames;
	__u16 items_bytes;   /* valid bytes in items[] */
	__u8  call;          /* enum sockcall_call */
	__u8  flags;         /* SOCKCALL_MSG_F_* */
	struct ns_rx_times rx; /* receives with the netstack probe (flags RX_TIMES) */
	__u8  items[SOCKCALL_MSG_ITEMS_MAX];
};

#endif /* PSLAT_EVENTS_H */
