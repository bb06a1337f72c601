/* netstack: the kernel network stack around the messages of traced sockets.
 *
 * The hooks here fill the rings of rings.bpf.h (read that first: it holds
 * the state, the API the ZMTP walker calls, and why per-message rings):
 *
 *   TX   net_dev_queue, net_dev_start_xmit     per skb of a tracked socket:
 *                                              qdisc entry, driver handoff
 *        consume_skb, kfree_skb,               what became of a handed-off
 *        netif_receive_skb (same skb pointer)  skb: TX completion, drop, or
 *                                              "forwarded to a peer" (veth,
 *                                              loopback: no TX completion)
 *   RX   napi_gro_receive_entry, netif_rx      per segment of a tracked flow:
 *        netif_receive_skb                     arrival at the device (NAPI
 *                                              poll, or netif_rx for devices
 *                                              without NAPI: veth, loopback),
 *                                              netif_receive time
 *        sk_data_ready                         per tracked socket: rcv_nxt
 *   clock  net_dev_start_xmit, ns_rx_arrival   event per segment that starts a
 *          (netif_receive_skb without one)     burst (NS_CLOCK_GAP_NS): one-way
 *                                              samples for the clock estimate
 *   TCP  tcp_retransmit_skb                    event per retransmission
 *        inet_sock_set_state                   life-cycle event; starts and
 *                                              ends tracking
 *   sched sched_switch, sched_wakeup(_new)     per thread asked about
 *   syscalls connect, accept, accept4          per selected process: times
 *
 * Cost: net_dev_*, netif_receive_skb, consume_skb and sched_switch fire for
 * every packet / free / context switch on the machine. Each first does one
 * hash lookup (is this socket / flow / skb / thread tracked?) and returns;
 * headers are parsed only for tracked sockets (TX) and after the netns
 * filter (RX). All raw tracepoints: no trace record is formatted.
 *
 * Stacked devices (bridge, vlan, bond in one namespace): the same skb meets
 * net_dev_start_xmit once per device and netif_receive_skb once per device
 * on the way up; TX reports each further device (the last is the driver),
 * RX keeps the first (the device it arrived on).
 *
 * Load shedding (common.bpf.h, "host-pair sampling"): sockets of a host pair
 * the agent does not sample now are not tracked from ESTABLISHED/accept on
 * (the sockcalls probe also stops tracking them), and their retransmission,
 * life-cycle and connect/accept events are counted, not emitted. The per-
 * packet hooks have no gate of their own: an untracked socket costs them one
 * failed lookup already.
 *
 * skb layouts: at net_dev_start_xmit skb->data is the L2 header and the TCP
 * header sits at skb->head + transport_header; at napi_gro_receive_entry,
 * netif_rx and netif_receive_skb the driver has pulled L2 (eth_type_trans), so skb->data
 * is the IP header (transport_header is not set yet at netif_receive_skb).
 */
#include "rings.bpf.h"

#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define TCP_ESTABLISHED_ 1
#define TCP_SYN_SENT_ 2
#define NS_STACKED_RX_NS 500000 /* see ns_netif_receive */

static __always_inline u8 ns_kread_u8(u64 addr)
{
	u8 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
	return v;
}

/* ---- skb parsing -------------------------------------------------------------- */

struct ns_tcphdr {
	u16 sport;
	u16 dport;
	u32 seq;
	u32 ack;
	u8 doff_res;
	u8 flags;
	u16 window;
};

/* A TX skb's payload sequence range, from its TCP header. 0 on success, -1
 * when unreadable, 1 when not this socket's segment: `ports` (both, as in
 * the header), when not 0, must match (after a tunnel encapsulated the skb,
 * its transport header is the outer one). */
static __always_inline int ns_tx_range(u64 skb, u32 *seq, u32 *end, u32 ports)
{
	u64 head = kread_u64(skb + NS_OFF_SKB_HEAD);
	u64 data = kread_u64(skb + NS_OFF_SKB_DATA);
	u32 len = kread_u32(skb + NS_OFF_SKB_LEN);
	u16 th = kread_u16(skb + NS_OFF_SKB_TRANSPORT_HEADER);
	struct ns_tcphdr t = {};
	if (!head || bpf_probe_read_kernel(&t, sizeof(t), (void *)(head + th)))
		return -1;
	if (ports && ports != (((u32)t.dport << 16) | t.sport))
		return 1;
	/* bytes before the payload, counted from skb->data */
	s64 hdrs = (s64)(head + th - data) + (t.doff_res >> 4) * 4;
	if (hdrs < 0 || hdrs > len)
		return -1;
	*seq = bpf_ntohl(t.seq);
	*end = *seq + (u32)(len - hdrs);
	return 0;
}

/* Network namespace of the device an skb is on. */
static __always_inline u32 ns_skb_netns(u64 skb)
{
	u64 dev = kread_u64(skb + NS_OFF_SKB_DEV);
	if (!dev)
		return 0;
	u64 net = kread_u64(dev + NS_OFF_DEV_ND_NET);
	return net ? kread_u32(net + OFF_NET_NS_INUM) : 0;
}

/* An RX skb (skb->data at the IP header): the flow key as the receiver sees
 * it and the payload range. 0 on success; 1 when not TCP / not for us. */
static __always_inline int ns_rx_parse(u64 skb, struct ns_flow_key *k, u32 *seq, u32 *end)
{
	u16 proto = kread_u16(skb + NS_OFF_SKB_PROTOCOL);
	u64 data = kread_u64(skb + NS_OFF_SKB_DATA);
	u32 l3, total;
	if (proto == bpf_htons(ETH_P_IP_)) {
		u8 ip[20];
		if (bpf_probe_read_kernel(ip, sizeof(ip), (void *)data))
			return -1;
		if ((ip[0] >> 4) != 4 || ip[9] != IPPROTO_TCP_)
			return 1;
		if (((ip[6] & 0x3f) | ip[7]) != 0) /* a fragment */
			return 1;
		l3 = (ip[0] & 0xf) * 4;
		total = ((u32)ip[2] << 8) | ip[3];
		__builtin_memcpy(k->raddr, ip + 12, 4);
		__builtin_memcpy(k->laddr, ip + 16, 4);
	} else if (proto == bpf_htons(ETH_P_IPV6_)) {
		u8 ip6[40];
		if (bpf_probe_read_kernel(ip6, sizeof(ip6), (void *)data))
			return -1;
		if (ip6[6] != IPPROTO_TCP_) /* extension headers: not followed */
			return 1;
		l3 = 40;
		total = 40 + (((u32)ip6[4] << 8) | ip6[5]);
		k->v6 = 1;
		__builtin_memcpy(k->raddr, ip6 + 8, 16);
		__builtin_memcpy(k->laddr, ip6 + 24, 16);
	} else {
		return 1;
	}
	struct ns_tcphdr t = {};
	if (bpf_probe_read_kernel(&t, sizeof(t), (void *)(data + l3)))
		return -1;
	u32 hdrs = l3 + (t.doff_res >> 4) * 4;
	if (hdrs > total)
		return -1;
	k->lport = bpf_ntohs(t.dport);
	k->rport = bpf_ntohs(t.sport);
	*seq = bpf_ntohl(t.seq);
	*end = *seq + (total - hdrs);
	return 0;
}

/* ---- clock samples ------------------------------------------------------------------ */

/* A segment that starts a burst (struct ns_clock_event): `src`/`dst` the
 * segment's source and destination. Costs one comparison per segment
 * otherwise: the previous segment's time is in the flow's / socket's ring. */
static __always_inline void ns_clock_emit(u8 rx, const struct ns_flow_key *k, int from_local, u32 seq, u64 ts)
{
	struct ns_clock_event ev = {};
	ev.kind = NS_EV_CLOCK;
	ev.rx = rx;
	ev.family = k->v6 ? AF_INET6_ : AF_INET_;
	ev.netns_ino = k->netns_ino;
	ev.ts_ns = ts;
	ev.seq = seq;
	if (from_local) {
		ev.sport = k->lport;
		ev.dport = k->rport;
		__builtin_memcpy(ev.saddr, k->laddr, 16);
		__builtin_memcpy(ev.daddr, k->raddr, 16);
	} else {
		ev.sport = k->rport;
		ev.dport = k->lport;
		__builtin_memcpy(ev.saddr, k->raddr, 16);
		__builtin_memcpy(ev.daddr, k->laddr, 16);
	}
	ns_emit(&ev, sizeof(ev));
}

/* Report the segment [seq, end) at `ts`: nothing of this flow for
 * NS_CLOCK_GAP_NS before it (`prev_ts`: the latest segment's time, 0 for none),
 * and at least NS_CLOCK_MIN_BYTES of payload. A smaller first segment is a
 * whole message (or the tail of one): its per-message times are already
 * these samples, so reporting it again would only cost an event per message.
 * Both ends see the same length (veth keeps the sender's GSO skb whole; a
 * NIC's TSO segments are each an MSS, above the bound). */
static __always_inline int ns_clock_sample(u64 prev_ts, u64 ts, u32 seq, u32 end)
{
#if NS_CLOCK_GAP_NS
	return (s64)(ts - prev_ts) >= NS_CLOCK_GAP_NS && end - seq >= NS_CLOCK_MIN_BYTES;
#else
	return 0;
#endif
}

/* The time on record of a flow's latest segment. */
static __always_inline u64 ns_rx_prev_ts(struct ns_flow *f)
{
	struct ns_rxrec *p = &f->r[(f->head - 1) & (NS_RX_SLOTS - 1)];
	return p->ts_nic_ns ? p->ts_nic_ns : p->ts_netif_ns;
}

/* ---- TX ----------------------------------------------------------------------------- */

int ns_dev_queue(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	u64 sk = kread_u64(skb + NS_OFF_SKB_SK);
	if (!sk || !ns_tx_socks.lookup(&sk))
		return 0;
	struct ns_skb v = {};
	v.sk = sk;
	v.ts_queue_ns = bpf_ktime_get_ns();
	/* Not over an existing record: a stacked device (vlan, bond) queues
	 * the skb again on the device below after handing it over. */
	ns_skbs.insert(&skb, &v);
	return 0;
}

/* The skb of handoff `q` reached another device: its record now says this
 * later handoff, and expectations already met get an event for it (the last
 * one for an end is the real driver's). */
static __always_inline void ns_next_device(u64 sk, struct ns_tx_sock *s, u64 skb, struct ns_skb *q, u64 ts,
					   u32 ifindex)
{
	u64 before = q->ts_xmit_ns;
	q->ts_xmit_ns = ts;
	for (int i = 0; i < NS_TX_XMIT_SLOTS; i++) {
		struct ns_xrec *x = &s->x[i];
		if (x->skb != skb || x->ts_xmit_ns != before)
			continue;
		x->ts_xmit_ns = ts;
		x->ifindex = ifindex;
		x->hops++;
		for (int j = 0; j < NS_TX_EXPECT_SLOTS; j++) {
			struct ns_expect *e = &s->e[j];
			if (e->state < NS_EXP_XMIT || e->skb != skb || e->ts_xmit_ns != before)
				continue;
			e->ts_xmit_ns = ts;
			e->state = NS_EXP_XMIT; /* what becomes of it now is this device's doing */
			ns_emit_tx(sk, s, e, x, NS_TX_F_NEXT_DEVICE);
		}
		break;
	}
}

int ns_start_xmit(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	u64 sk = kread_u64(skb + NS_OFF_SKB_SK);
	if (!sk)
		return 0;
	struct ns_tx_sock *s = ns_tx_socks.lookup(&sk);
	if (!s)
		return 0;
	u64 ts = bpf_ktime_get_ns();
	u32 seq, end;
	int parsed = ns_tx_range(skb, &seq, &end, s->ports);
	if (parsed) {
		if (parsed < 0)
			ns_count(NS_COUNTER_SKB_UNPARSED);
		return 0;
	}
	if (seq == end)
		return 0; /* no payload: a pure ACK (or a bare SYN/FIN) ends no message */
	u64 ts_queue = 0;
	struct ns_skb *q = ns_skbs.lookup(&skb);
	if (q && q->ts_xmit_ns) {
		/* Handed to a device already and not freed since: a stacked device
		 * (vlan, bond, bridge) passes it to the next one. */
		ns_next_device(sk, s, skb, q, ts, kread_u32(ctx->args[1] + NS_OFF_DEV_IFINDEX));
		return 0;
	}
	if (!q && s->gso_ts_queue_ns && ns_seq_in(seq, s->gso_seq, s->gso_end))
		ts_queue = s->gso_ts_queue_ns; /* a segment of a software-segmented GSO skb */
	if (q) {
		ts_queue = q->ts_queue_ns;
#if NS_TX_COMPLETION
		q->ts_xmit_ns = ts;
#else
		ns_skbs.delete(&skb);
#endif
	}
#if NS_TX_COMPLETION
	else {
		struct ns_skb v = {};
		v.sk = sk;
		v.ts_xmit_ns = ts;
		ns_skbs.update(&skb, &v);
	}
#endif
	u32 xh = s->xhead;
	u64 prev_xmit = s->x[(xh - 1) & (NS_TX_XMIT_SLOTS - 1)].ts_xmit_ns;
	s->xhead = xh + 1;
	struct ns_xrec *x = &s->x[xh & (NS_TX_XMIT_SLOTS - 1)];
	x->skb = skb;
	x->ts_queue_ns = ts_queue;
	x->ts_xmit_ns = ts;
	x->seq = seq;
	x->end = end;
	x->ifindex = kread_u32(ctx->args[1] + NS_OFF_DEV_IFINDEX);
	x->done_reason = 0;
	x->hops = 0;
	x->ts_done_ns = 0;

	/* Expectations to look at: pending ones, or any when this skb re-sends
	 * data sent before. */
	int resend = s->have_max && ns_seq_before(seq, s->max_end);
	if (!s->have_max || ns_seq_before(s->max_end, end)) {
		s->max_end = end;
		s->have_max = 1;
	}
	if (!resend && ns_clock_sample(prev_xmit, ts, seq, end)) {
		/* the socket's receive flow key: the same addresses as the packets
		 * (v4-mapped sockets send IPv4), local = this end, the source */
		struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
		if (rs)
			ns_clock_emit(0, &rs->key, 1, seq, ts);
	}
	if (!s->pending && !resend)
		return 0;
	for (int i = 0; i < NS_TX_EXPECT_SLOTS; i++) {
		struct ns_expect *e = &s->e[i];
		if (e->state == NS_EXP_FREE || !ns_seq_in(e->end_seq - 1, seq, end))
			continue;
		if (e->state == NS_EXP_PENDING) {
			if (s->pending)
				s->pending--;
			e->nr_xmit = 1;
			ns_expect_xmitted(sk, s, e, x, 0);
		} else {
			e->nr_xmit++;
			ns_emit_tx(sk, s, e, x, NS_TX_F_RETRANS);
		}
	}
	return 0;
}

/* What became of a handed-off skb of a tracked socket. */
static __always_inline void ns_skb_done(u64 skb, struct ns_skb *rec, u8 reason, u64 ts_done)
{
	u64 sk = rec->sk;
	u64 ts_xmit = rec->ts_xmit_ns;
	u64 ts_queue = rec->ts_queue_ns;
	ns_skbs.delete(&skb);
	struct ns_tx_sock *s = ns_tx_socks.lookup(&sk);
	if (!s)
		return;
	if (!ts_xmit) {
		/* Freed before the driver saw it. Consumed (not dropped) there: TCP
		 * always builds GSO skbs, and a device without TSO gets them
		 * segmented in software, the original consumed before its segments
		 * are handed over. Dropped: the re-send will be seen. */
		u32 seq, end;
		if (reason == NS_TXC_COMPLETED && ts_queue && !ns_tx_range(skb, &seq, &end, s->ports)) {
			s->gso_seq = seq;
			s->gso_end = end;
			s->gso_ts_queue_ns = ts_queue;
		}
		return;
	}
	u32 ifindex = 0;
	for (int i = 0; i < NS_TX_XMIT_SLOTS; i++) {
		struct ns_xrec *x = &s->x[i];
		if (x->skb == skb && x->ts_xmit_ns == ts_xmit) {
			x->done_reason = reason;
			x->ts_done_ns = ts_done;
			ifindex = x->ifindex;
			break;
		}
	}
	for (int i = 0; i < NS_TX_EXPECT_SLOTS; i++) {
		struct ns_expect *e = &s->e[i];
		if (e->state == NS_EXP_XMIT && e->skb == skb && e->ts_xmit_ns == ts_xmit) {
			ns_emit_tx_done(sk, s, e, reason, ts_done, ifindex);
			e->state = NS_EXP_DONE;
		}
	}
}

#if NS_TX_COMPLETION
int ns_consume_skb(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	struct ns_skb *rec = ns_skbs.lookup(&skb);
	if (rec)
		ns_skb_done(skb, rec, NS_TXC_COMPLETED, bpf_ktime_get_ns());
	return 0;
}

int ns_kfree_skb(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	struct ns_skb *rec = ns_skbs.lookup(&skb);
	if (rec)
		ns_skb_done(skb, rec, NS_TXC_DROPPED, bpf_ktime_get_ns());
	return 0;
}
#endif

/* ---- RX -------------------------------------------------------------------------------- */

/* The tracked flow an RX skb belongs to, or 0. */
static __always_inline struct ns_flow *ns_rx_flow(u64 skb, struct ns_flow_key *k, u32 *seq, u32 *end)
{
	k->netns_ino = ns_skb_netns(skb);
#if FILTER_NETNS
	if (!filter_netns.lookup(&k->netns_ino))
		return 0;
#endif
	int r = ns_rx_parse(skb, k, seq, end);
	if (r) {
		if (r < 0)
			ns_count(NS_COUNTER_SKB_UNPARSED);
		return 0;
	}
	if (*seq == *end)
		return 0;
	return ns_flows.lookup(k);
}

/* An skb we saw handed to a driver, now on a receive path: that device
 * passes skbs to a peer (veth, loopback) and has no TX completion. Checked
 * at the first receive hook the skb meets: GRO may merge it into another
 * skb and free it without a tracepoint. */
static __always_inline void ns_rx_forwarded(u64 skb)
{
#if NS_TX_COMPLETION
	struct ns_skb *sent = ns_skbs.lookup(&skb);
	if (sent)
		ns_skb_done(skb, sent, NS_TXC_FORWARDED, 0);
#endif
}

/* A segment arriving at a device: the NAPI poll's GRO entry, or netif_rx on
 * devices without NAPI (veth without GRO/XDP, loopback: the peer's xmit calls
 * it, so it is where the frame left the wire). Its netif_receive_skb comes
 * later, from the softirq's backlog: that wait is the receiving host's, not
 * the wire's. */
int ns_rx_arrival(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	ns_rx_forwarded(skb);
	u32 seq, end;
	struct ns_flow_key k = {};
	struct ns_flow *f = ns_rx_flow(skb, &k, &seq, &end);
	if (!f)
		return 0;
	u64 ts = bpf_ktime_get_ns();
	if (ns_clock_sample(ns_rx_prev_ts(f), ts, seq, end))
		ns_clock_emit(1, &k, 0, seq, ts);
	u32 h = f->head;
	f->head = h + 1;
	struct ns_rxrec *r = &f->r[h & (NS_RX_SLOTS - 1)];
	r->ts_nic_ns = ts;
	r->ts_netif_ns = 0;
	r->seq = seq;
	r->end = end;
	f->gro_held++; /* records waiting for their netif_receive_skb (GRO or the backlog holds them) */
	return 0;
}

int ns_netif_receive(struct bpf_raw_tracepoint_args *ctx)
{
	u64 skb = ctx->args[0];
	u64 ts = bpf_ktime_get_ns();
	ns_rx_forwarded(skb);
	u32 seq, end;
	struct ns_flow_key k = {};
	struct ns_flow *f = ns_rx_flow(skb, &k, &seq, &end);
	if (!f)
		return 0;
	/* The same skb again at once: an upper device (bridge, vlan, macvlan)
	 * passing it up, within the same softirq. Its first netif_receive_skb,
	 * on the device it arrived on, is the one on record. (A retransmission
	 * may reuse a freed skb's address, but comes milliseconds later.) */
	if (f->last_skb == skb && f->last_seq == seq && ts - f->last_ts_ns < NS_STACKED_RX_NS)
		return 0;
	f->last_skb = skb;
	f->last_seq = seq;
	f->last_ts_ns = ts;
	/* Segments NAPI saw (GRO may have merged several into this skb) get
	 * their netif time; without NAPI records the skb is one record. The
	 * count of held records lives in the map, not in a register, so the
	 * verifier sees one state per iteration. */
	u32 held = f->gro_held;
	if (held) {
		/* Without GRO the backlog hands skbs up in arrival order: the
		 * oldest held record is this skb's; the scan is for merges. */
		struct ns_rxrec *o = &f->r[(f->head - held) & (NS_RX_SLOTS - 1)];
		if (o->ts_nic_ns && !o->ts_netif_ns && o->seq == seq && o->end == end) {
			o->ts_netif_ns = ts;
			f->gro_held = held - 1;
			return 0;
		}
		for (int i = 0; i < NS_RX_SLOTS; i++) {
			struct ns_rxrec *r = &f->r[i];
			if (r->ts_nic_ns && !r->ts_netif_ns && ns_seq_in(r->seq, seq, end)) {
				r->ts_netif_ns = ts;
				if (f->gro_held)
					f->gro_held--;
			}
		}
		if (f->gro_held != held)
			return 0;
	}
	/* a segment no arrival hook saw (the device has neither NAPI nor netif_rx) */
	if (ns_clock_sample(ns_rx_prev_ts(f), ts, seq, end))
		ns_clock_emit(1, &k, 0, seq, ts);
	u32 h = f->head;
	f->head = h + 1;
	struct ns_rxrec *r = &f->r[h & (NS_RX_SLOTS - 1)];
	r->ts_nic_ns = 0;
	r->ts_netif_ns = ts;
	r->seq = seq;
	r->end = end;
	return 0;
}

int ns_data_ready(struct bpf_raw_tracepoint_args *ctx)
{
	u64 sk = ctx->args[0];
	struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
	if (!rs)
		return 0;
	u32 rcv_nxt = kread_u32(sk + NS_OFF_TCP_RCV_NXT);
	u32 h = rs->head;
	/* Several wake-ups for the same data: the first is when it was ready. */
	if (h && rs->d[(h - 1) & (NS_DR_SLOTS - 1)].rcv_nxt == rcv_nxt)
		return 0;
	rs->head = h + 1;
	struct ns_drrec *d = &rs->d[h & (NS_DR_SLOTS - 1)];
	d->ts_ns = bpf_ktime_get_ns();
	d->rcv_nxt = rcv_nxt;
	return 0;
}

/* ---- TCP ---------------------------------------------------------------------------------- */

int ns_retransmit(struct bpf_raw_tracepoint_args *ctx)
{
	u64 sk = ctx->args[0];
	if (!ns_tx_socks.lookup(&sk))
		return 0;
	if (!pslat_sock_sampled(sk)) {
		pslat_count_shed(PSLAT_SHED_NETSTACK);
		return 0;
	}
	u64 skb = ctx->args[1];
	struct ns_retrans_event ev = {};
	ev.kind = NS_EV_RETRANS;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.sk = sk;
	ev.state = ns_kread_u8(sk + NS_OFF_SKC_STATE);
	ev.seq = kread_u32(skb + NS_OFF_SKB_CB + NS_OFF_TCB_SEQ);
	ev.end_seq = kread_u32(skb + NS_OFF_SKB_CB + NS_OFF_TCB_END_SEQ);
	ev.err = (s32)ctx->args[2];
	ev.netns_ino = sock_netns_ino(sk);
	FILL_TUPLE(&ev, sk);
	ns_emit(&ev, sizeof(ev));
	return 0;
}

/* Which process a socket belongs to, for selecting life-cycle events when a
 * process filter is on: the connecting process (connect() entry) or the one
 * accepting on the listener (accept() entry), by (netns, port). */
struct ns_listen_key {
	u32 netns_ino;
	u32 port;
};
BPF_TABLE("lru_hash", u64, u32, ns_owners, NS_SOCKS_MAX);
BPF_TABLE("lru_hash", struct ns_listen_key, u32, ns_listeners, 1024);

/* A life-cycle change is traced when the socket is tracked, or passes the
 * netns/port filters and (with a process filter) belongs to a selected
 * process. *tgid: the owner when known, else 0. */
static __always_inline int ns_conn_selected(u64 sk, u32 *tgid)
{
	u32 *owner = ns_owners.lookup(&sk);
	if (owner) {
		*tgid = *owner;
	} else {
		struct ns_listen_key lk = {};
		lk.netns_ino = sock_netns_ino(sk);
		lk.port = kread_u16(sk + OFF_SKC_NUM);
		u32 *l = ns_listeners.lookup(&lk);
		if (l)
			*tgid = *l;
	}
	if (ns_tx_socks.lookup(&sk) != 0)
		return 1;
	if (!sock_selected(sk))
		return 0;
#if FILTER_TGIDS || FILTER_COMMS
	return *tgid != 0;
#else
	return 1;
#endif
}

/* Expectations still waiting when their socket closes: their segments will
 * never reach a driver. */
static __always_inline void ns_flush_closed(u64 sk)
{
	struct ns_tx_sock *s = ns_tx_socks.lookup(&sk);
	if (!s)
		return;
	if (s->pending) {
		for (int i = 0; i < NS_TX_EXPECT_SLOTS; i++) {
			struct ns_expect *e = &s->e[i];
			if (e->state == NS_EXP_PENDING) {
				ns_emit_tx(sk, s, e, 0, NS_TX_F_CLOSED);
				e->state = NS_EXP_DONE;
			}
		}
	}
	if (ns_tx_socks.delete(&sk) == 0)
		ns_count(NS_COUNTER_SOCKS_REMOVED);
	struct ns_rx_sock *rs = ns_rx_socks.lookup(&sk);
	if (rs) {
		ns_flows.delete(&rs->key);
		ns_rx_socks.delete(&sk);
	}
}

int ns_set_state(struct bpf_raw_tracepoint_args *ctx)
{
	u64 sk = ctx->args[0];
	if (kread_u16(sk + OFF_SK_PROTOCOL) != IPPROTO_TCP_)
		return 0;
	u32 tgid = 0;
	if (!ns_conn_selected(sk, &tgid))
		return 0;
	int newstate = (int)ctx->args[2];
	if (!pslat_sock_sampled(sk)) {
		pslat_count_shed(PSLAT_SHED_NETSTACK);
		if (newstate == NS_TCP_CLOSE) {
			ns_flush_closed(sk);
			ns_owners.delete(&sk);
		}
		return 0;
	}
	struct ns_conn_event ev = {};
	ev.kind = NS_EV_CONN;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.sk = sk;
	ev.oldstate = (u8)ctx->args[1];
	ev.newstate = (u8)newstate;
	ev.tgid = tgid;
	if (tgid)
		ev.flags |= NS_CONN_F_TGID;
	ev.netns_ino = sock_netns_ino(sk);
	ev.sk_cookie = kread_u64(sk + OFF_SKC_COOKIE);
	FILL_TUPLE(&ev, sk);
	if (newstate == TCP_ESTABLISHED_) {
		/* Nothing sent or received yet: both ISNs are one before. */
		ev.isn_local = kread_u32(sk + NS_OFF_TCP_SND_UNA) - 1;
		ev.isn_remote = kread_u32(sk + NS_OFF_TCP_RCV_NXT) - 1;
		ev.flags |= NS_CONN_F_ISN;
		ns_track(sk);
	}
	ns_emit(&ev, sizeof(ev));
	if (newstate == NS_TCP_CLOSE) {
		ns_flush_closed(sk);
		ns_owners.delete(&sk);
	}
	return 0;
}

/* ---- scheduler --------------------------------------------------------------------------- */

/* sched_switch(preempt, prev, next, prev_state): runs as prev. */
int ns_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
	u32 prev = (u32)bpf_get_current_pid_tgid();
	u32 next = kread_u32(ctx->args[2] + NS_OFF_TASK_PID);
	u64 ts = 0;
	struct ns_thread *t = prev ? ns_thread_of(prev) : 0;
	if (t) {
		ts = bpf_ktime_get_ns();
		if (t->on_cpu && t->ts_switch_in_ns)
			t->oncpu_ns += ts - t->ts_switch_in_ns;
		t->on_cpu = 0;
		/* Preempted or yielding: still runnable, now waiting in the run queue. */
		t->ts_runnable_ns = (ctx->args[0] || (u32)ctx->args[3] == 0) ? ts : 0;
	}
	struct ns_thread *n = next ? ns_thread_of(next) : 0;
	if (n) {
		if (!ts)
			ts = bpf_ktime_get_ns();
		if (n->ts_runnable_ns)
			n->runq_ns += ts - n->ts_runnable_ns;
		n->ts_runnable_ns = 0;
		n->ts_switch_in_ns = ts;
		n->nr_switch_in++;
		n->on_cpu = 1;
	}
	return 0;
}

static __always_inline int ns_wakeup(u64 task)
{
	u32 tid = kread_u32(task + NS_OFF_TASK_PID);
	struct ns_thread *t = tid ? ns_thread_of(tid) : 0;
	if (!t)
		return 0;
	u64 ts = bpf_ktime_get_ns();
	t->ts_wakeup_ns = ts;
	if (!t->on_cpu && !t->ts_runnable_ns)
		t->ts_runnable_ns = ts;
	return 0;
}

int ns_sched_wakeup(struct bpf_raw_tracepoint_args *ctx)
{
	return ns_wakeup(ctx->args[0]);
}

int ns_sched_wakeup_new(struct bpf_raw_tracepoint_args *ctx)
{
	return ns_wakeup(ctx->args[0]);
}

/* ---- connect / accept ---------------------------------------------------------------------- */

struct ns_call {
	u64 ts_enter_ns;
	u64 sk;
	u32 fd;
	s32 syscall_nr;
	u8 call;
};
#define NS_CALLS_MAX 4096 /* connect/accept calls in flight at once */
BPF_TABLE("lru_hash", u64, struct ns_call, ns_calls, NS_CALLS_MAX);

static __always_inline int ns_call_enter(void *ctx, u8 call, u64 fd)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!process_selected(tgid) || fd > 0x7fffffff)
		return 0;
	u64 ts = bpf_ktime_get_ns();
	u64 sk = fd_to_tcp_sock((u32)fd);
	if (!sk)
		return 0;
	struct ns_call c = {};
	c.ts_enter_ns = ts;
	c.sk = sk;
	c.fd = (u32)fd;
	c.syscall_nr = TP_S32(ctx, NS_TP_SYSCALL_NR);
	c.call = call;
	ns_calls.update(&id, &c);
	if (call == NS_CALL_CONNECT) {
		/* before SYN_SENT, which happens inside connect() */
		ns_owners.update(&sk, &tgid);
	} else {
		struct ns_listen_key lk = {};
		lk.netns_ino = sock_netns_ino(sk);
		lk.port = kread_u16(sk + OFF_SKC_NUM);
		ns_listeners.update(&lk, &tgid);
	}
	return 0;
}

int ns_enter_connect(void *ctx)
{
	return ns_call_enter(ctx, NS_CALL_CONNECT, TP_U64(ctx, NS_TP_CONNECT_FD));
}

int ns_enter_accept(void *ctx)
{
	return ns_call_enter(ctx, NS_CALL_ACCEPT, TP_U64(ctx, NS_TP_ACCEPT_FD));
}

int ns_enter_accept4(void *ctx)
{
	return ns_call_enter(ctx, NS_CALL_ACCEPT, TP_U64(ctx, NS_TP_ACCEPT4_FD));
}

static __always_inline int ns_call_exit(void *ctx, u8 call)
{
	u64 id = bpf_get_current_pid_tgid();
	struct ns_call *c = ns_calls.lookup(&id);
	struct ns_call in = {};
	if (c && c->syscall_nr == TP_S32(ctx, NS_TP_SYSCALL_NR)) {
		in = *c;
		ns_calls.delete(&id);
	} else if (call == NS_CALL_ACCEPT && process_selected(id >> 32)) {
		/* Blocked in accept() since before the probe attached (a server
		 * waiting for its first client): the exit alone says which socket
		 * it got and when; the entry time is unknown (0). */
		in.call = call;
		in.fd = (u32)-1;
	} else {
		return 0;
	}
	struct ns_call_event ev = {};
	ev.kind = NS_EV_CALL;
	ev.ts_exit_ns = bpf_ktime_get_ns();
	ev.ts_enter_ns = in.ts_enter_ns;
	ev.call = in.call;
	ev.ret = TP_S64(ctx, NS_TP_EXIT_RET);
	ev.tgid = id >> 32;
	ev.tid = (u32)id;
	ev.fd = in.fd;
	u64 sk = in.sk;
	if (call == NS_CALL_ACCEPT) {
		sk = ev.ret >= 0 ? fd_to_tcp_sock((u32)ev.ret) : 0;
		if (!sk)
			return 0;
		ns_owners.update(&sk, &ev.tgid);
	}
	if (sk) {
		if (!sock_selected(sk))
			return 0;
		ev.sk = sk;
		ev.netns_ino = sock_netns_ino(sk);
		FILL_TUPLE(&ev, sk);
		int sampled = pslat_addrs_sampled(ev.family, ev.saddr, ev.daddr);
		if (call == NS_CALL_ACCEPT) {
			/* later children of this listener belong to this process */
			struct ns_listen_key lk = {};
			lk.netns_ino = ev.netns_ino;
			lk.port = ev.sport;
			ns_listeners.update(&lk, &ev.tgid);
			if (sampled)
				ns_track(sk);
		}
		if (!sampled) {
			pslat_count_shed(PSLAT_SHED_NETSTACK);
			return 0;
		}
	}
	bpf_get_current_comm(&ev.comm, sizeof(ev.comm));
	ns_emit(&ev, sizeof(ev));
	return 0;
}

int ns_exit_connect(void *ctx)
{
	return ns_call_exit(ctx, NS_CALL_CONNECT);
}

int ns_exit_accept(void *ctx)
{
	return ns_call_exit(ctx, NS_CALL_ACCEPT);
}
