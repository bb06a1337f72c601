/* sockcalls: the send/recv family of syscalls on TCP sockets of the selected
 * processes, one event per completed call (struct sockcall_event, events.h).
 *
 * Entry (syscalls:sys_enter_*): filter the process, resolve fd -> struct sock
 * through BTF offsets, keep only IPv4/IPv6 TCP sockets that pass the socket
 * filters, remember the call and the sequence number at entry, keyed by
 * thread. Exit (syscalls:sys_exit_*, one program for all): read the sequence
 * number again, the 4-tuple, the connection's ISNs, copy a bounded prefix of
 * what the call moved, emit.
 *
 * Sequence ranges: sends read tcp_sock.write_seq, receives copied_seq, at entry
 * and exit. Both only move under the socket lock inside the call, so with one
 * thread per socket and direction (libzmq's I/O thread) the range is exact;
 * two threads sending on one socket at once would see overlapping ranges.
 *
 * Connection key: (4-tuple, isn_local, isn_remote), so a reconnect on a reused
 * port is a new connection. tcp_sock does not keep the ISNs, so:
 *  - exact: on sock:inet_sock_set_state -> ESTABLISHED, nothing has been sent
 *    or received yet, so isn_local = snd_una - 1 and isn_remote = rcv_nxt - 1;
 *  - derived, for connections that existed before the probe attached, from
 *    the byte counters tcp_sock keeps since the handshake (derive_isns()).
 *    An ACK processed on another CPU between the reads can still make a
 *    derived ISN wrong; flags tell the two kinds apart, and isn_remote seen
 *    by the peer's agent (always exact) can overrule a derived isn_local.
 *
 * Payload: the stream walker (walk_engine.bpf.h, with a framing per protocol:
 * framings.bpf.h) follows the frames in the bytes each call moved and emits
 * only what user space needs (frame headers, meta and command frames, a key
 * sample, message ends) as items after the event's header. Connections it
 * cannot follow (joined mid-stream and not yet hinted, or not a protocol it
 * has a framing for) carry a raw prefix of each call instead. For each
 * message end it asks the netstack probe's rings (rings.bpf.h) for the
 * stage times (receives) or registers the end (sends).
 *
 * Load shedding: calls on connections of a host pair the agent does not
 * sample now (common.bpf.h, "host-pair sampling") stop at the entry, before
 * the in-flight slot, the netstack tracking and the whole exit (walker,
 * ring): only counted. The pair's hash is cached with the connection.
 */
/* the walker and its framings; the engine includes rings.bpf.h (the netstack probe's API) */
#include "framings.bpf.h"
#include "common.bpf.h"

#define EAGAIN_ 11
#define TCP_ESTABLISHED_ 1
#define TCP_CLOSE_ 7

#define NO_CALL (-1)

struct sockcall_inflight {
	u64 id;     /* the thread's pid_tgid: whose slot this is now (0: nobody's) */
	u64 enter_ts_ns;
	u64 sk;
	u64 ptr;    /* buffer, iovec array, or user_msghdr */
	u64 len;    /* buffer length, or iovec count (unused for *msg) */
	u32 fd;
	u32 seq_start;
	s32 syscall_nr; /* the call in flight; NO_CALL when none. The exit must be the same
	                 * syscall (a stale slot of a killed thread is not) */
	u8 call;
};

/* What stays the same for the life of a connection, read once and kept per
 * struct sock: each kernel read costs tens of ns, and an event would
 * otherwise need a dozen of them. Dropped when the socket closes. */
struct conn_info {
	u32 isn_local;
	u32 isn_remote;
	u32 netns_ino;
	u16 family;
	u16 sport;
	u16 dport;
	u8 isn_flags;  /* SOCKCALL_F_ISN_* */
	u8 has_tuple;  /* the fields below (and netns_ino, ports, pair_h16) are filled */
	u16 pair_h16;  /* host-pair sampling hash of (saddr, daddr) */
	u64 cookie;
	u8 saddr[16];
	u8 daddr[16];
};

/* The call a thread is in, in slot tid % SOCKCALLS_INFLIGHT_MAX, tagged with
 * the thread: an array, not a hash. sc_exit runs at the exit of every read and
 * write on the machine (libzmq's eventfd signals too) and must turn those away
 * cheaply; an array lookup is a few instructions where an LRU hash lookup
 * hashes and updates its LRU state (docs/cost.md). A call whose slot a
 * colliding thread took before it returned is lost and counted
 * (inflight_full); with SOCKCALLS_INFLIGHT_MAX at or above pid_max no two
 * threads share a slot. */
BPF_ARRAY(sockcalls_inflight, struct sockcall_inflight, SOCKCALLS_INFLIGHT_MAX);

static __always_inline struct sockcall_inflight *sc_inflight_slot(u64 id)
{
	u32 slot = (u32)id % SOCKCALLS_INFLIGHT_MAX;
	return sockcalls_inflight.lookup(&slot);
}
BPF_TABLE("lru_hash", u64, struct conn_info, sockcalls_conns, SOCKCALLS_CONNS_MAX);
BPF_PERCPU_ARRAY(sockcalls_counters, u64, SOCKCALL_COUNTER_NR);
BPF_RINGBUF_OUTPUT(sockcalls_events, SOCKCALLS_RING_PAGES);

/* bcc cannot expand map calls inside macros, hence a function per probe. */
static __always_inline void sc_add(int slot, u64 n)
{
	u64 *v = sockcalls_counters.lookup(&slot);
	if (v)
		*v += n;
}

static __always_inline void sc_count(int slot)
{
	sc_add(slot, 1);
}

static __always_inline long sc_output(void *rec, u64 size)
{
	return sockcalls_events.ringbuf_output(rec, size, 0);
}

static __always_inline int is_send(u8 call)
{
	return call == SOCKCALL_WRITE || call == SOCKCALL_WRITEV || call == SOCKCALL_SENDTO ||
	       call == SOCKCALL_SENDMSG;
}


/* ISNs at the moment a connection is established (both ends: connect() and
 * the child socket accept() will return), forgotten when it closes. */
int sc_conn_state(void *ctx)
{
	if (TP_U16(ctx, TP_ISS_PROTOCOL) != IPPROTO_TCP_)
		return 0;
	u64 sk = TP_U64(ctx, TP_ISS_SKADDR);
	s32 newstate = TP_S32(ctx, TP_ISS_NEWSTATE);
	if (newstate == TCP_ESTABLISHED_) {
		struct conn_info c = {};
		c.isn_local = kread_u32(sk + OFF_TCP_SND_UNA) - 1;
		c.isn_remote = kread_u32(sk + OFF_TCP_RCV_NXT) - 1;
		c.isn_flags = SOCKCALL_F_ISN_EXACT;
		if (sockcalls_conns.insert(&sk, &c) == 0)
			sc_count(SOCKCALL_COUNTER_CONNS_MADE);
		else /* a socket address reused before its close was seen */
			sockcalls_conns.update(&sk, &c);
	} else if (newstate == TCP_CLOSE_) {
		if (sockcalls_conns.delete(&sk) == 0)
			sc_count(SOCKCALL_COUNTER_CONNS_REMOVED);
		struct wk_key k = {.sk = sk, .dir = WK_DIR_TX};
		if (sockcalls_walk.delete(&k) == 0)
			sc_count(SOCKCALL_COUNTER_WALKS_REMOVED);
		sockcalls_sync_hint.delete(&k);
		k.dir = WK_DIR_RX;
		if (sockcalls_walk.delete(&k) == 0)
			sc_count(SOCKCALL_COUNTER_WALKS_REMOVED);
		sockcalls_sync_hint.delete(&k);
	}
	return 0;
}

/* ISNs of a connection first seen mid-stream (it existed before the probe).
 * bytes_received never counts the peer's SYN (rcv_nxt is set past it
 * directly), so isn_remote = rcv_nxt - bytes_received - 1. bytes_acked counts
 * our own SYN only on the side that connected (its tcp_ack of the SYN-ACK
 * moves snd_una over the SYN); an accepted socket had snd_una set past its
 * SYN-ACK at creation. The side: an accepted socket is a clone of its
 * listener and keeps the listener's sk_max_ack_backlog (> 0), a connected one
 * has 0 (a listener with backlog 0 would be misjudged as connecting). */
static __always_inline int derive_isns(u64 sk, struct conn_info *c)
{
	/* snd_una and bytes_acked move together when an ACK is processed; read
	 * snd_una on both sides of bytes_acked and give up if it moved. */
	u32 una = kread_u32(sk + OFF_TCP_SND_UNA);
	u32 acked = (u32)kread_u64(sk + OFF_TCP_BYTES_ACKED);
	if (kread_u32(sk + OFF_TCP_SND_UNA) != una)
		return -1;
	u32 rcv_nxt = kread_u32(sk + OFF_TCP_RCV_NXT);
	u32 received = (u32)kread_u64(sk + OFF_TCP_BYTES_RECEIVED);
	if (kread_u32(sk + OFF_TCP_RCV_NXT) != rcv_nxt)
		return -1;
	int accepted = kread_u32(sk + OFF_SK_MAX_ACK_BACKLOG) > 0;
	c->isn_local = una - acked - (accepted ? 1 : 0);
	c->isn_remote = rcv_nxt - received - 1;
	c->isn_flags = SOCKCALL_F_ISN_DERIVED;
	return 0;
}

static __always_inline void read_tuple(u64 sk, struct conn_info *c)
{
	c->cookie = kread_u64(sk + OFF_SKC_COOKIE);
	c->netns_ino = sock_netns_ino(sk);
	FILL_TUPLE(c, sk);
	c->pair_h16 = (u16)pslat_addrs_hash16(c->family, c->saddr, c->daddr);
	c->has_tuple = 1;
}

/* The connection's fixed facts, from the cache when known; else read now
 * into `fresh` and cached when its ISNs could be read (else tried again at
 * the next call). */
static __always_inline struct conn_info *conn_get(u64 sk, struct conn_info *fresh)
{
	struct conn_info *c = sockcalls_conns.lookup(&sk);
	if (!c) {
		read_tuple(sk, fresh);
		if (derive_isns(sk, fresh) == 0 && sockcalls_conns.insert(&sk, fresh) == 0)
			sc_count(SOCKCALL_COUNTER_CONNS_MADE);
		return fresh;
	}
	if (!c->has_tuple)
		read_tuple(sk, c); /* entry made at ESTABLISHED: fill it in place */
	return c;
}

/* Load shedding: is this socket's host pair unsampled now? Then its calls
 * are not traced, and the netstack rings stop following it (its packets then
 * cost one failed lookup each); tracking starts again at its next sampled
 * call, and the walker finds a stream gap there and resynchronises. Ends
 * still waiting for their segments are dropped without an event: their
 * rows go out without TX times. */
static __always_inline int sc_pair_shed(u64 sk)
{
	u32 shed = pslat_shed_units();
	if (!shed)
		return 0;
	struct conn_info fresh = {};
	struct conn_info *c = conn_get(sk, &fresh);
	if (c->pair_h16 >= shed)
		return 0;
	pslat_count_shed(PSLAT_SHED_CALLS);
#ifdef NETSTACK_LOADED
	if (ns_tx_socks.lookup(&sk)) {
		struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
		if (rs) {
			ns_flows.delete(&rs->key);
			ns_rx_socks.delete(&sk);
		}
		if (ns_tx_socks.delete(&sk) == 0)
			ns_count(NS_COUNTER_SOCKS_REMOVED);
	}
#endif
	return 1;
}

static __always_inline int sc_enter(void *ctx, u8 call, u64 fd, u64 ptr, u64 len)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!process_selected(id >> 32))
		return 0;
	/* After the process filter (one hash lookup) so that unselected
	 * processes do not pay for it, before the fd walk. */
	u64 ts = bpf_ktime_get_ns();
	if (fd > 0x7fffffff)
		return 0;
	u64 sk = fd_to_tcp_sock((u32)fd);
	if (!sk || !sock_selected(sk) || sc_pair_shed(sk))
		return 0;
	/* The netstack rings must follow the socket before this call sends:
	 * on veth and loopback the segments leave inside the syscall. */
	ns_track(sk);
	struct sockcall_inflight in = {};
	in.id = id;
	in.enter_ts_ns = ts;
	in.sk = sk;
	in.ptr = ptr;
	in.len = len;
	in.fd = (u32)fd;
	in.syscall_nr = TP_S32(ctx, TP_SYSCALL_NR);
	in.call = call;
	in.seq_start = kread_u32(sk + (is_send(call) ? OFF_TCP_WRITE_SEQ : OFF_TCP_COPIED_SEQ));
	struct sockcall_inflight *slot = sc_inflight_slot(id);
	if (!slot)
		return 0;
	if (slot->id != id && slot->id && slot->syscall_nr != NO_CALL)
		sc_count(SOCKCALL_COUNTER_INFLIGHT_FULL); /* another thread's call in flight there is lost */
	*slot = in;
	return 0;
}

/* Each syscall has its own tracepoint, so each its own small entry program;
 * argument offsets come from the tracepoints' tracefs formats. */
int sc_enter_read(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_READ, TP_U64(ctx, TP_READ_FD), TP_U64(ctx, TP_READ_BUF), TP_U64(ctx, TP_READ_COUNT));
}
int sc_enter_write(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_WRITE, TP_U64(ctx, TP_WRITE_FD), TP_U64(ctx, TP_WRITE_BUF), TP_U64(ctx, TP_WRITE_COUNT));
}
int sc_enter_readv(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_READV, TP_U64(ctx, TP_READV_FD), TP_U64(ctx, TP_READV_VEC), TP_U64(ctx, TP_READV_VLEN));
}
int sc_enter_writev(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_WRITEV, TP_U64(ctx, TP_WRITEV_FD), TP_U64(ctx, TP_WRITEV_VEC), TP_U64(ctx, TP_WRITEV_VLEN));
}
int sc_enter_recvfrom(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_RECVFROM, TP_U64(ctx, TP_RECVFROM_FD), TP_U64(ctx, TP_RECVFROM_UBUF), TP_U64(ctx, TP_RECVFROM_SIZE));
}
int sc_enter_sendto(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_SENDTO, TP_U64(ctx, TP_SENDTO_FD), TP_U64(ctx, TP_SENDTO_BUFF), TP_U64(ctx, TP_SENDTO_LEN));
}
int sc_enter_recvmsg(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_RECVMSG, TP_U64(ctx, TP_RECVMSG_FD), TP_U64(ctx, TP_RECVMSG_MSG), 0);
}
int sc_enter_sendmsg(void *ctx)
{
	return sc_enter(ctx, SOCKCALL_SENDMSG, TP_U64(ctx, TP_SENDMSG_FD), TP_U64(ctx, TP_SENDMSG_MSG), 0);
}

/* The connection's fixed facts into the event, from the cache when known. */
static __always_inline void conn_facts(u64 sk, struct sockcall_event *ev)
{
	struct conn_info fresh = {};
	struct conn_info *c = conn_get(sk, &fresh);
	ev->isn_local = c->isn_local;
	ev->isn_remote = c->isn_remote;
	ev->flags |= c->isn_flags;
	ev->netns_ino = c->netns_ino;
	ev->sk_cookie = c->cookie;
	ev->family = c->family;
	ev->sport = c->sport;
	ev->dport = c->dport;
	__builtin_memcpy(ev->saddr, c->saddr, 16);
	__builtin_memcpy(ev->daddr, c->daddr, 16);
}

int sc_exit(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	struct sockcall_inflight *found = sc_inflight_slot(id);
	if (!found || found->id != id || found->syscall_nr != TP_S32(ctx, TP_SYSCALL_NR))
		return 0;
	u64 ts = bpf_ktime_get_ns();
	struct sockcall_inflight in = *found;
	found->syscall_nr = NO_CALL;
	s64 ret = TP_S64(ctx, TP_EXIT_RET);
	if (ret == -EAGAIN_) {
		sc_count(SOCKCALL_COUNTER_EAGAIN);
		return 0;
	}
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
	struct sockcall_event *ev = &s->ev;
	__builtin_memset(ev, 0, offsetof(struct sockcall_event, payload));
	ev->enter_ts_ns = in.enter_ts_ns;
	ev->exit_ts_ns = ts;
	ev->sk = in.sk;
	ev->ret = ret;
	ev->tgid = id >> 32;
	ev->tid = (u32)id;
	ev->fd = in.fd;
	ev->seq_start = in.seq_start;
	int send = is_send(in.call);
	ev->seq_end = kread_u32(in.sk + (send ? OFF_TCP_WRITE_SEQ : OFF_TCP_COPIED_SEQ));
	ev->call = in.call;
	conn_facts(in.sk, ev);
	bpf_get_current_comm(&ev->comm, sizeof(ev->comm));
	s->w.data_pos = 0;
	s->w.has_piece = 0;
	/* Walk only bytes the call consumed from / added to the stream: a
	 * MSG_PEEK receive returns bytes that the next receive returns again.
	 * A range that disagrees with ret otherwise (two threads on one socket)
	 * is not walked; the next call then sees a stream gap. */
	u64 moved = (u32)(ev->seq_end - ev->seq_start);
	/* A receive that reached the peer's FIN also consumed its sequence
	 * number (tcp_recvmsg: copied_seq + 1): its bytes are still walked,
	 * or a stream's last read (often its last messages) would be lost. */
	if (!send && ret > 0 && moved == (u64)ret + 1)
		moved = (u64)ret;
	if (ret <= 0 || moved != (u64)ret) {
		wk_emit(s, 0);
		return 0;
	}
	u32 isn_next = (send ? ev->isn_local : ev->isn_remote) + 1;
	int isn_known = (ev->flags & (SOCKCALL_F_ISN_EXACT | SOCKCALL_F_ISN_DERIVED)) != 0;
	int next = wk_begin(s, in.sk, in.call, send ? WK_DIR_TX : WK_DIR_RX, in.ptr, in.len, (u64)ret, isn_next,
			    isn_known);
	wk_dispatch(ctx, s, next);
	wk_write_stop(s, 1);
	wk_finish(s);
	return 0;
}
