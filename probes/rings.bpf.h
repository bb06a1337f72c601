/* rings.bpf.h: the netstack probe's per-socket and per-flow rings, and the
 * API other probes of the same program call (the ZMTP walker in
 * sockcalls.bpf.c). Owner: the netstack probe (netstack.bpf.c attaches the
 * hooks that fill the rings; netstack.py declares constants and offsets).
 *
 * Why rings: the kernel sees packets, user space wants messages. A message
 * end (the TCP sequence number one past its last byte) is only known when the
 * walker has seen the bytes, in a send or recv syscall. So the hooks keep
 * small rings of recent per-segment times per socket / flow, and the walker
 * asks about one end per message; user space never sees per-packet events.
 *
 * API (all static __always_inline; `sk` is a struct sock address as u64, the
 * convention of common.bpf.h, so bcc's rewriter leaves it alone):
 *
 *   void ns_track(u64 sk)
 *       Start tracking a TCP socket (TX state, data-ready ring, its flow's RX
 *       ring). Cheap when already tracked (one hash lookup). Call it at send
 *       and recv syscall ENTRY: on veth and loopback a send transmits inside
 *       the syscall, so a socket tracked only at exit misses its first
 *       handoff. Sockets that connect/accept while the probe runs and pass
 *       the filters are tracked from ESTABLISHED on without it.
 *
 *   void ns_tx_expect_end(u64 sk, u32 end_seq, u64 msg_id)
 *       "A message ends at end_seq" (call at send syscall exit, once per
 *       message end). Emits exactly one struct ns_tx_event for it, now if
 *       the skb carrying byte end_seq-1 was already handed to the driver,
 *       else when it is; or one with a flag saying why there are no times
 *       (NS_TX_F_OVERWRITTEN, _CLOSED, _SENT_UNSEEN). Then at most one
 *       struct ns_tx_done_event (TX completion / none on this device / drop),
 *       one NS_TX_F_RETRANS event per re-send of the end, and, on stacked
 *       devices (bridge, vlan, bond), one NS_TX_F_NEXT_DEVICE event per
 *       further device the skb is handed to: the last event of an end is
 *       the real driver's handoff. Ring sizes: the socket's last
 *       2^NS_TX_XMIT_SLOTS_LOG2 segments, 2^NS_TX_EXPECT_SLOTS_LOG2 ends.
 *
 *   int ns_rx_lookup_end(u64 sk, u32 end_seq, struct ns_rx_times *out)
 *       At recv syscall exit, for a message ending at end_seq: NAPI and
 *       netif_receive times of the segment carrying byte end_seq-1 (of the
 *       arrival that delivered it, when it arrived more than once) and the
 *       first data-ready after which rcv_nxt >= end_seq; out->flags says
 *       which were found and why not. Returns 0 when the socket was tracked,
 *       -1 when it was not (tracking starts then; out->flags has
 *       NS_RX_F_UNTRACKED). `out` may point into a map value (e.g. the
 *       caller's event being built). Rings: the flow's last
 *       2^NS_RX_SLOTS_LOG2 segments, the socket's last 2^NS_DR_SLOTS_LOG2
 *       data-ready wake-ups that moved rcv_nxt.
 *
 *   void ns_thread_sched(u32 tid, struct ns_sched *out)
 *       The thread's latest wake-up and switch-in times and its cumulative
 *       on-CPU and run-queue times. The first call for a thread starts
 *       tracking it (the sched hooks only follow threads asked about, which
 *       the callers' process filters selected); that call has flags 0.
 *
 *   void ns_window_state(u64 sk, struct ns_window *out)
 *       Congestion/receive window and send-queue state, read now (eleven
 *       kernel reads: call it once per send call, not per message). User
 *       space tells the holds apart: cwnd-limited when packets_out >=
 *       snd_cwnd, rwnd-limited when snd_nxt - snd_una nears snd_wnd,
 *       sndbuf-limited when wmem_queued_bytes nears sndbuf_bytes; the qdisc
 *       wait is ns_tx_event's ts_xmit_ns - ts_queue_ns.
 *
 * Costs measured on this machine (tests/privileged/test_probes_netstack_cost.py,
 * loopback ping-pong): a send exit calling ns_window_state and
 * ns_tx_expect_end ~1.0 us; a recv exit calling ns_rx_lookup_end and
 * ns_thread_sched ~0.6 us (both including a small harness).
 *
 * Without the netstack probe in the program (NETSTACK_LOADED undefined) the
 * same functions exist and report NS_*_F_NOT_LOADED, so a probe that calls
 * them compiles either way.
 *
 * Verifier: these functions are inlined into the caller's program, next to
 * the caller's own loops, so they must verify cheaply. Their ring scans keep
 * loop results (an index, a count) in map memory, not in registers: the
 * verifier prunes a loop's states only when registers agree, and a register
 * counting hits differs on every path (2^iterations states).
 *
 * Sequence numbers wrap at 2^32: every comparison is done on differences.
 * Rings are written without locks; two CPUs handling the same socket at the
 * same instant can lose one entry (TCP serialises most of a socket's work,
 * so this is rare); a lost entry shows up as a "missing" flag, never as a
 * wrong time.
 */
#ifndef PSLAT_RINGS_BPF_H
#define PSLAT_RINGS_BPF_H

#include "common.bpf.h"

/* A loop accumulator kept in map memory: volatile, so that clang does not
 * cache it in a register (see "Verifier" above). */
#define NS_MEM(x) (*(volatile typeof(x) *)&(x))

/* Wrap-safe sequence arithmetic. */
static __always_inline int ns_seq_before(u32 a, u32 b)
{
	return (s32)(a - b) < 0;
}

/* seq in [start, end) modulo 2^32 */
static __always_inline int ns_seq_in(u32 seq, u32 start, u32 end)
{
	return (u32)(seq - start) < (u32)(end - start);
}

#ifdef NETSTACK_LOADED

#define NS_TX_XMIT_SLOTS (1 << NS_TX_XMIT_SLOTS_LOG2)
#define NS_TX_EXPECT_SLOTS (1 << NS_TX_EXPECT_SLOTS_LOG2)
#define NS_RX_SLOTS (1 << NS_RX_SLOTS_LOG2)
#define NS_DR_SLOTS (1 << NS_DR_SLOTS_LOG2)

#define NS_TCP_CLOSE 7

/* ---- state --------------------------------------------------------------- */

/* One skb of a tracked socket handed to the driver. */
struct ns_xrec {
	u64 skb;
	u64 ts_queue_ns;
	u64 ts_xmit_ns;
	u32 seq;
	u32 end;
	u32 ifindex;
	u8 done_reason; /* NS_TXC_*, 0 while unknown */
	u8 hops;        /* devices it was passed on to after the first (stacked devices) */
	u8 _pad[2];
	u64 ts_done_ns;
};

#define NS_EXP_FREE 0
#define NS_EXP_PENDING 1 /* waiting for its segment to reach the driver */
#define NS_EXP_XMIT 2    /* handed to the driver; waiting for what happens to the skb */
#define NS_EXP_DONE 3    /* done event sent; kept to flag retransmissions */

struct ns_expect {
	u64 msg_id;
	u64 ts_expect_ns;
	u64 ts_xmit_ns;
	u64 skb;
	u32 end_seq;
	u8 state;
	u8 nr_xmit;
	u16 _pad;
};

struct ns_tx_sock {
	u32 xhead;      /* skbs recorded so far; slot = count & (SLOTS - 1) */
	u32 ehead;      /* expectations registered so far */
	u32 pending;    /* expectations in NS_EXP_PENDING */
	u32 max_end;    /* highest end sent so far: an skb ending at or before it is a re-send */
	u32 netns_ino;
	u32 ports;      /* (dport << 16) | sport, network order, as a TCP header has them */
	u32 scan_idx;   /* loop result of ns_tx_expect_end (see "Verifier" above) */
	u8 have_max;
	u8 _pad[3];
	/* The last GSO skb segmented in software (validate_xmit_skb consumes it
	 * before its segments, new skbs, reach the driver): its range and qdisc
	 * entry time, which its segments inherit. */
	u32 gso_seq;
	u32 gso_end;
	u64 gso_ts_queue_ns;
	struct ns_xrec x[NS_TX_XMIT_SLOTS];
	struct ns_expect e[NS_TX_EXPECT_SLOTS];
};

/* The receive side of a flow as its receiver sees it: local = destination of
 * the packets. IPv4 addresses in the first 4 bytes, the rest zero. */
struct ns_flow_key {
	u32 netns_ino;
	u16 lport;     /* host byte order */
	u16 rport;
	u8 v6;
	u8 _pad[3];
	u8 laddr[16];
	u8 raddr[16];
};

struct ns_rxrec {
	u64 ts_nic_ns;   /* napi_gro_receive_entry or netif_rx; 0 when the segment had none */
	u64 ts_netif_ns; /* netif_receive_skb; 0 while GRO still holds it */
	u32 seq;         /* payload range [seq, end) */
	u32 end;
};

struct ns_flow {
	u32 head;
	u32 gro_held; /* arrival records still waiting for their netif_receive_skb */
	u64 last_skb; /* the latest skb at netif_receive_skb, its first seq and */
	u64 last_ts_ns; /* time: seen again at once, a stacked device (bridge, */
	u32 last_seq; /* vlan) passes it up */
	u32 _pad;
	struct ns_rxrec r[NS_RX_SLOTS];
};

struct ns_drrec {
	u64 ts_ns;
	u32 rcv_nxt;
	u32 _pad;
};

struct ns_rx_sock {
	struct ns_flow_key key;
	u32 head;
	u32 scan_idx;   /* loop results of ns_rx_lookup_end (see "Verifier" above) */
	u32 scan_hits;
	u32 scan_oldest_seq;
	struct ns_drrec d[NS_DR_SLOTS];
};

struct ns_thread {
	u64 ts_wakeup_ns;
	u64 ts_switch_in_ns;
	u64 ts_runnable_ns; /* runnable since (woken or preempted), 0 when running or sleeping */
	u64 oncpu_ns;
	u64 runq_ns;
	u64 ts_tracked_ns;
	u32 nr_switch_in;
	u32 on_cpu;
	u32 tid;            /* whose slot this is now (0: nobody's) */
	u32 _pad;
};

/* The skb of a tracked socket between net_dev_queue and what happens to it
 * after the driver (TX completion, forwarding to a peer, drop). */
struct ns_skb {
	u64 sk;
	u64 ts_queue_ns;
	u64 ts_xmit_ns;
};

/* Zero-filled templates for creating entries larger than the BPF stack. */
union ns_zero {
	struct ns_tx_sock tx;
	struct ns_flow flow;
	struct ns_rx_sock rx;
};

BPF_TABLE("lru_hash", u64, struct ns_tx_sock, ns_tx_socks, NS_SOCKS_MAX);
BPF_TABLE("lru_hash", u64, struct ns_rx_sock, ns_rx_socks, NS_SOCKS_MAX);
BPF_TABLE("lru_hash", struct ns_flow_key, struct ns_flow, ns_flows, NS_SOCKS_MAX);
BPF_TABLE("lru_hash", u64, struct ns_skb, ns_skbs, NS_SKBS_MAX);
/* Threads by slot tid % NS_THREADS_MAX, each slot tagged with its thread: an
 * array, not a hash. The scheduler hooks fire for every context switch and
 * wake-up on the machine, and an array lookup is a few instructions where an
 * LRU hash lookup hashes and updates its LRU state (docs/cost.md). A thread
 * whose slot another thread took since is asked about afresh (its scheduler
 * fields absent once, as for a new thread); with NS_THREADS_MAX at or above
 * pid_max no two threads share a slot. */
BPF_ARRAY(ns_threads, struct ns_thread, NS_THREADS_MAX);

/* Thread tid's slot (which may be another thread's: compare its tid). */
static __always_inline struct ns_thread *ns_thread_slot(u32 tid)
{
	u32 slot = tid % NS_THREADS_MAX;
	return ns_threads.lookup(&slot);
}

/* Thread tid's state, when the sched hooks follow it. */
static __always_inline struct ns_thread *ns_thread_of(u32 tid)
{
	struct ns_thread *t = ns_thread_slot(tid);
	return t && t->tid == tid ? t : 0;
}
BPF_ARRAY(ns_zero_tmpl, union ns_zero, 1);
BPF_PERCPU_ARRAY(ns_counters, u64, NS_COUNTER_NR);
BPF_RINGBUF_OUTPUT(ns_events, NS_RING_PAGES);

static __always_inline void ns_count(int slot)
{
	u64 *v = ns_counters.lookup(&slot);
	if (v)
		*v += 1;
}

static __always_inline void ns_emit(void *ev, u32 size)
{
	ns_count(PSLAT_COUNTER_SEEN);
	if (ns_events.ringbuf_output(ev, size, 0))
		ns_count(PSLAT_COUNTER_LOST);
}

/* ---- flow keys ------------------------------------------------------------ */

/* The key of the flow a socket receives, as the packets will show it. An
 * AF_INET6 socket talking IPv4 (v4-mapped address) receives IPv4 packets. */
static __always_inline void ns_sock_flow_key(u64 sk, struct ns_flow_key *k)
{
	k->netns_ino = sock_netns_ino(sk);
	k->lport = kread_u16(sk + OFF_SKC_NUM);
	k->rport = bpf_ntohs(kread_u16(sk + OFF_SKC_DPORT));
	if (kread_u16(sk + OFF_SKC_FAMILY) == AF_INET6_) {
		u8 d[16] = {};
		bpf_probe_read_kernel(d, 16, (void *)(sk + OFF_SKC_V6_DADDR));
		u64 lo = *(u64 *)d;
		u32 mid = *(u32 *)(d + 8);
		if (!(lo == 0 && mid == bpf_htonl(0x0000ffff))) {
			k->v6 = 1;
			__builtin_memcpy(k->raddr, d, 16);
			bpf_probe_read_kernel(k->laddr, 16, (void *)(sk + OFF_SKC_V6_RCV_SADDR));
			return;
		}
	}
	bpf_probe_read_kernel(k->laddr, 4, (void *)(sk + OFF_SKC_RCV_SADDR));
	bpf_probe_read_kernel(k->raddr, 4, (void *)(sk + OFF_SKC_DADDR));
}

/* ---- tracking -------------------------------------------------------------- */

static __always_inline void ns_track(u64 sk)
{
	if (!sk)
		return;
	if (ns_tx_socks.lookup(&sk))
		return;
	int zero = 0;
	union ns_zero *z = ns_zero_tmpl.lookup(&zero);
	if (!z)
		return;
	/* Fill the rx side first: the tx entry is what says "tracked". */
	if (ns_rx_socks.update(&sk, &z->rx)) {
		ns_count(NS_COUNTER_TRACK_FAILED);
		return;
	}
	struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
	if (!rs)
		return;
	ns_sock_flow_key(sk, &rs->key);
	/* A flow ring already there (a reused 4-tuple whose close we missed) is
	 * reset: its entries belong to another connection. */
	ns_flows.update(&rs->key, &z->flow);
	if (ns_tx_socks.update(&sk, &z->tx)) {
		ns_count(NS_COUNTER_TRACK_FAILED);
		return;
	}
	ns_count(NS_COUNTER_SOCKS_MADE);
	struct ns_tx_sock *ts = ns_tx_socks.lookup(&sk);
	if (ts) {
		ts->netns_ino = rs->key.netns_ino;
		ts->ports = ((u32)kread_u16(sk + OFF_SKC_DPORT) << 16) | bpf_htons(rs->key.lport);
	}
}

/* ---- TX ---------------------------------------------------------------------- */

static __always_inline void ns_emit_tx(u64 sk, struct ns_tx_sock *s, struct ns_expect *e, struct ns_xrec *x,
				       u16 flags)
{
	struct ns_tx_event ev = {};
	ev.kind = NS_EV_TX;
	ev.flags = flags;
	ev.nr_xmit = e->nr_xmit;
	ev.end_seq = e->end_seq;
	ev.sk = sk;
	ev.msg_id = e->msg_id;
	ev.ts_expect_ns = e->ts_expect_ns;
	ev.netns_ino = s->netns_ino;
	if (x) {
		ev.ts_queue_ns = x->ts_queue_ns;
		ev.ts_xmit_ns = x->ts_xmit_ns;
		ev.skb_seq = x->seq;
		ev.skb_end_seq = x->end;
		ev.ifindex = x->ifindex;
		if (!x->ts_queue_ns)
			ev.flags |= NS_TX_F_NO_QUEUE;
		if (x->hops)
			ev.flags |= NS_TX_F_STACKED;
	}
	ns_emit(&ev, sizeof(ev));
}

static __always_inline void ns_emit_tx_done(u64 sk, struct ns_tx_sock *s, struct ns_expect *e, u8 reason,
					    u64 ts_done, u32 ifindex)
{
	struct ns_tx_done_event ev = {};
	ev.kind = NS_EV_TX_DONE;
	ev.reason = reason;
	ev.end_seq = e->end_seq;
	ev.sk = sk;
	ev.msg_id = e->msg_id;
	ev.ts_xmit_ns = e->ts_xmit_ns;
	ev.ts_done_ns = ts_done;
	ev.ifindex = ifindex;
	ev.netns_ino = s->netns_ino;
	ns_emit(&ev, sizeof(ev));
}

/* An expectation met its first handoff `x`: emit, and either report what
 * already happened to the skb or wait for it. */
static __always_inline void ns_expect_xmitted(u64 sk, struct ns_tx_sock *s, struct ns_expect *e, struct ns_xrec *x,
					      u16 flags)
{
	e->ts_xmit_ns = x->ts_xmit_ns;
	e->skb = x->skb;
	if (e->nr_xmit == 0)
		e->nr_xmit = 1;
	ns_emit_tx(sk, s, e, x, flags);
	if (x->done_reason) {
		ns_emit_tx_done(sk, s, e, x->done_reason, x->ts_done_ns, x->ifindex);
		e->state = NS_EXP_DONE;
	} else {
		e->state = NS_EXP_XMIT;
	}
}

/* The socket's handoff records covering byte `last`: counted in e->nr_xmit, the
 * oldest one's slot in s->scan_idx. Oldest record first: the first one covering
 * the last byte is the transmission, later ones re-sends. */
static __always_inline void ns_scan_xmits(struct ns_tx_sock *s, struct ns_expect *e, u32 last)
{
	u32 xh = s->xhead;
	u32 start = xh - (xh < NS_TX_XMIT_SLOTS ? xh : NS_TX_XMIT_SLOTS);
	/* No "i < records" bound: clang merges it with the constant one into a
	 * trip count the verifier cannot bound. Unused slots are zero, an empty
	 * range, and match nothing. */
	for (int i = 0; i < NS_TX_XMIT_SLOTS; i++) {
		u32 idx = (start + i) & (NS_TX_XMIT_SLOTS - 1);
		struct ns_xrec *x = &s->x[idx];
		if (ns_seq_in(last, x->seq, x->end)) {
			if (!NS_MEM(e->nr_xmit))
				NS_MEM(s->scan_idx) = idx;
			NS_MEM(e->nr_xmit) += 1;
		}
	}
}

static __always_inline void ns_tx_expect_end(u64 sk, u32 end_seq, u64 msg_id)
{
	if (!sk)
		return;
	struct ns_tx_sock *s = ns_tx_socks.lookup(&sk);
	if (!s) {
		ns_track(sk);
		s = ns_tx_socks.lookup(&sk);
		if (!s)
			return;
	}
	/* Take the next expectation slot; one still pending there is lost. */
	u32 eh = s->ehead;
	s->ehead = eh + 1;
	struct ns_expect *e = &s->e[eh & (NS_TX_EXPECT_SLOTS - 1)];
	if (e->state == NS_EXP_PENDING) {
		if (s->pending)
			s->pending--;
		ns_count(NS_COUNTER_TX_EXPECT_OVERWRITTEN);
		ns_emit_tx(sk, s, e, 0, NS_TX_F_OVERWRITTEN);
	}
	e->msg_id = msg_id;
	e->ts_expect_ns = bpf_ktime_get_ns();
	e->ts_xmit_ns = 0;
	e->skb = 0;
	e->end_seq = end_seq;
	e->nr_xmit = 0;
	e->state = NS_EXP_FREE;

	/* Already handed to the driver? */
	u32 last = end_seq - 1;
	ns_scan_xmits(s, e, last);
	/* Not on record but the socket already sent past it: the handoff was
	 * either recorded on another CPU since the scan (its record is written
	 * before snd_nxt moves: look once more; a CI run saw 1 of 12 bridged
	 * sends reported unseen) or happened where we could not see it. */
	u32 snd_nxt = 0;
	if (!e->nr_xmit) {
		snd_nxt = kread_u32(sk + NS_OFF_TCP_SND_NXT);
		if (!ns_seq_before(snd_nxt, end_seq))
			ns_scan_xmits(s, e, last);
	}
	if (e->nr_xmit) {
		ns_expect_xmitted(sk, s, e, &s->x[s->scan_idx & (NS_TX_XMIT_SLOTS - 1)], NS_TX_F_BEFORE_EXPECT);
		return;
	}
	if (!ns_seq_before(snd_nxt, end_seq)) {
		ns_count(NS_COUNTER_TX_SENT_UNSEEN);
		ns_emit_tx(sk, s, e, 0, NS_TX_F_SENT_UNSEEN);
		e->state = NS_EXP_DONE;
		return;
	}
	e->state = NS_EXP_PENDING;
	s->pending++;
}

/* ---- RX ------------------------------------------------------------------------- */

static __always_inline int ns_rx_lookup_end(u64 sk, u32 end_seq, struct ns_rx_times *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
	if (!rs) {
		out->flags = NS_RX_F_UNTRACKED | NS_RX_F_NETIF_MISSING | NS_RX_F_DR_MISSING;
		ns_track(sk);
		return -1;
	}
	u32 last = end_seq - 1;

	/* Data-ready: the earliest one after which rcv_nxt covers the end.
	 * Newest first; rcv_nxt only grows, so stop at the first that does not
	 * cover it. */
	u32 dh = rs->head;
	rs->scan_hits = 0;
	for (int i = 0; i < NS_DR_SLOTS; i++) {
		u32 idx = (dh - 1 - i) & (NS_DR_SLOTS - 1);
		struct ns_drrec *d = &rs->d[idx];
		if (!d->ts_ns || ns_seq_before(d->rcv_nxt, end_seq))
			break; /* an unused slot, or older data */
		NS_MEM(rs->scan_idx) = idx;
		NS_MEM(rs->scan_hits) += 1;
	}
	if (rs->scan_hits) {
		struct ns_drrec *d = &rs->d[rs->scan_idx & (NS_DR_SLOTS - 1)];
		out->ts_data_ready_ns = d->ts_ns;
		out->data_ready_rcv_nxt = d->rcv_nxt;
		out->flags |= NS_RX_F_DATA_READY;
		/* Every entry on record covers it and older ones were pushed out:
		 * the first data-ready may be among them. */
		if (rs->scan_hits >= NS_DR_SLOTS && dh > NS_DR_SLOTS)
			out->flags |= NS_RX_F_DR_OVERWRITTEN;
	} else {
		out->flags |= NS_RX_F_DR_MISSING;
		ns_count(NS_COUNTER_RX_DR_MISSING);
	}

	/* The segment. Arrived more than once (a retransmission), the arrival
	 * that delivered the data is the last one before the data-ready that
	 * covered it: an earlier one was dropped on the way up (tc, netfilter,
	 * socket filter, checksum), and a spurious re-send arrives after the
	 * data-ready. Without a data-ready: the first arrival. Oldest record
	 * first. */
	struct ns_flow *f = ns_flows.lookup(&rs->key);
	if (!f) {
		out->flags |= NS_RX_F_NETIF_MISSING;
		ns_count(NS_COUNTER_RX_NETIF_MISSING);
		return 0;
	}
	u64 dr_ts = out->ts_data_ready_ns;
	u32 fh = f->head;
	u32 start = fh - (fh < NS_RX_SLOTS ? fh : NS_RX_SLOTS);
	rs->scan_hits = 0;
	rs->scan_oldest_seq = f->r[start & (NS_RX_SLOTS - 1)].seq;
	for (int i = 0; i < NS_RX_SLOTS; i++) { /* unused slots have no netif time */
		u32 idx = (start + i) & (NS_RX_SLOTS - 1);
		struct ns_rxrec *r = &f->r[idx];
		if (r->ts_netif_ns && ns_seq_in(last, r->seq, r->end)) {
			if (!NS_MEM(rs->scan_hits) || (dr_ts && r->ts_netif_ns <= dr_ts))
				NS_MEM(rs->scan_idx) = idx;
			NS_MEM(rs->scan_hits) += 1;
		}
	}
	if (rs->scan_hits) {
		struct ns_rxrec *r = &f->r[rs->scan_idx & (NS_RX_SLOTS - 1)];
		out->ts_netif_ns = r->ts_netif_ns;
		out->flags |= NS_RX_F_NETIF;
		if (r->ts_nic_ns) {
			out->ts_nic_ns = r->ts_nic_ns;
			out->flags |= NS_RX_F_NIC;
		} else {
			out->flags |= NS_RX_F_NO_NAPI;
		}
		if (rs->scan_hits > 1)
			out->flags |= NS_RX_F_DUPLICATE;
	} else if (fh > NS_RX_SLOTS && ns_seq_before(last, rs->scan_oldest_seq)) {
		out->flags |= NS_RX_F_NETIF_OVERWRITTEN;
		ns_count(NS_COUNTER_RX_NETIF_OVERWRITTEN);
	} else {
		out->flags |= NS_RX_F_NETIF_MISSING;
		ns_count(NS_COUNTER_RX_NETIF_MISSING);
	}
	return 0;
}

/* ---- scheduler ------------------------------------------------------------------ */

static __always_inline void ns_thread_sched(u32 tid, struct ns_sched *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	struct ns_thread *t = ns_thread_slot(tid);
	if (!t)
		return;
	if (t->tid != tid) {
		__builtin_memset(t, 0, sizeof(*t));
		t->ts_tracked_ns = bpf_ktime_get_ns();
		t->on_cpu = 1; /* asked from the thread itself, at a syscall exit */
		t->tid = tid;
		return;
	}
	out->ts_wakeup_ns = t->ts_wakeup_ns;
	out->ts_switch_in_ns = t->ts_switch_in_ns;
	out->oncpu_ns = t->oncpu_ns;
	out->runq_ns = t->runq_ns;
	out->ts_tracked_ns = t->ts_tracked_ns;
	out->nr_switch_in = t->nr_switch_in;
	out->flags = NS_SCHED_F_TRACKED;
}

/* ---- window state ---------------------------------------------------------------- */

static __always_inline void ns_window_state(u64 sk, struct ns_window *out)
{
	out->snd_cwnd = kread_u32(sk + NS_OFF_TCP_SND_CWND);
	out->snd_ssthresh = kread_u32(sk + NS_OFF_TCP_SND_SSTHRESH);
	out->packets_out = kread_u32(sk + NS_OFF_TCP_PACKETS_OUT);
	out->retrans_out = kread_u32(sk + NS_OFF_TCP_RETRANS_OUT);
	out->snd_wnd = kread_u32(sk + NS_OFF_TCP_SND_WND);
	out->snd_una = kread_u32(sk + NS_OFF_TCP_SND_UNA);
	out->snd_nxt = kread_u32(sk + NS_OFF_TCP_SND_NXT);
	out->write_seq = kread_u32(sk + NS_OFF_TCP_WRITE_SEQ);
	out->mss_cache = kread_u32(sk + NS_OFF_TCP_MSS_CACHE);
	out->wmem_queued_bytes = (s32)kread_u32(sk + NS_OFF_SK_WMEM_QUEUED);
	out->sndbuf_bytes = (s32)kread_u32(sk + NS_OFF_SK_SNDBUF);
	out->flags = NS_WIN_F_VALID;
}

#else /* !NETSTACK_LOADED: the API without the probe */

static __always_inline void ns_track(u64 sk)
{
}

static __always_inline void ns_tx_expect_end(u64 sk, u32 end_seq, u64 msg_id)
{
}

static __always_inline int ns_rx_lookup_end(u64 sk, u32 end_seq, struct ns_rx_times *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->flags = NS_RX_F_NOT_LOADED;
	return -1;
}

static __always_inline void ns_thread_sched(u32 tid, struct ns_sched *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->flags = NS_SCHED_F_NOT_LOADED;
}

static __always_inline void ns_window_state(u64 sk, struct ns_window *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->flags = NS_WIN_F_NOT_LOADED;
}

#endif /* NETSTACK_LOADED */
#endif /* PSLAT_RINGS_BPF_H */
