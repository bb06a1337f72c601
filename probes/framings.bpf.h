/* framings.bpf.h: the walker's framings, registered. The fr_* functions the
 * engine (walk_engine.bpf.h) calls dispatch on the protocol; every walk
 * program passes its protocol as a constant, so the switch folds and the
 * program holds that framing's code alone. Then each protocol's walk
 * programs, at slots WK_SLOT(SOCKCALL_PROTO_*, kind) (probes/sockcalls.py
 * WALKER_PROGRAMS). docs/kernel-walker.md: how to add a framing.
 */
#ifndef PSLAT_FRAMINGS_BPF_H
#define PSLAT_FRAMINGS_BPF_H

#include "walk_engine.bpf.h"
#include "zmtp_framing.bpf.h"
#include "brpc_framing.bpf.h"

/* A connection joined mid-stream is hunted in as ZMTP until user space says
 * its protocol (a sync hint: agent/decode.py classifies it from its raw
 * prefixes). */
static __always_inline int fr_default_proto(void)
{
	return SOCKCALL_PROTO_ZMTP;
}

/* A connection's first bytes: ZMTP's greeting starts with 0xFF, baidu_std's
 * header with "PRPC"; anything else is no framing's. */
static __always_inline int fr_classify(const u8 *b, u32 n)
{
	if (n && b[0] == 0xFF)
		return SOCKCALL_PROTO_ZMTP;
	if (brpc_starts(b, n))
		return SOCKCALL_PROTO_BRPC;
	return SOCKCALL_PROTO_NONE;
}

static __always_inline u32 fr_preface_bytes(int proto)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return ZMTP_GREETING_BYTES;
	default:
		return 0;
	}
}

static __always_inline int fr_preface(struct wk_scratch *s, int proto, u64 addr, u64 avail)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return zmtp_preface(s, addr, avail);
	default:
		return 1;
	}
}

static __always_inline int fr_header(struct wk_scratch *s, int proto, u64 addr, u64 avail)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return zmtp_header(s, addr, avail);
	case SOCKCALL_PROTO_BRPC:
		return brpc_header(s, addr, avail);
	default:
		return 1;
	}
}

static __always_inline void fr_frame_end(struct wk_scratch *s, int proto)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		zmtp_frame_end(s);
		break;
	case SOCKCALL_PROTO_BRPC:
		brpc_frame_end(s);
		break;
	}
}

static __always_inline int fr_samples_keys(int proto)
{
	return proto == SOCKCALL_PROTO_ZMTP; /* brpc's keys are not sampled yet */
}

static __always_inline u32 fr_cand_bytes(int proto)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return ZMTP_CAND_BYTES;
	case SOCKCALL_PROTO_BRPC:
		return BRPC_CAND_BYTES;
	default:
		return 1;
	}
}

static __always_inline u32 fr_chain_read(int proto)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return ZMTP_CHAIN_READ;
	case SOCKCALL_PROTO_BRPC:
		return BRPC_CHAIN_READ;
	default:
		return 1;
	}
}

static __always_inline int fr_candidate(int proto, const u8 *b)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return zmtp_candidate(b);
	case SOCKCALL_PROTO_BRPC:
		return brpc_candidate(b);
	default:
		return 0;
	}
}

static __always_inline int fr_chain_frame(int proto, const u8 *h, u64 r, u32 idx, u64 *len)
{
	switch (proto) {
	case SOCKCALL_PROTO_ZMTP:
		return zmtp_chain_frame(h, r, idx, len);
	case SOCKCALL_PROTO_BRPC:
		return brpc_chain_frame(h, r, idx, len);
	default:
		return -1;
	}
}

/* ---- the programs: one set per protocol, walk_ends and walk_msgs shared ---- */

int walk_ends(void *ctx)
{
	return wk_ends_pass(ctx);
}

int walk_msgs(void *ctx)
{
	return wk_msgs_pass(ctx);
}

int zmtp_walk(void *ctx)
{
	return wk_walk_pass(ctx, SOCKCALL_PROTO_ZMTP);
}

int zmtp_hunt(void *ctx)
{
	return wk_hunt_pass(ctx, SOCKCALL_PROTO_ZMTP);
}

int zmtp_hunt_end(void *ctx)
{
	return wk_hunt_end_pass(ctx, SOCKCALL_PROTO_ZMTP);
}

int brpc_walk(void *ctx)
{
	return wk_walk_pass(ctx, SOCKCALL_PROTO_BRPC);
}

int brpc_hunt(void *ctx)
{
	return wk_hunt_pass(ctx, SOCKCALL_PROTO_BRPC);
}

int brpc_hunt_end(void *ctx)
{
	return wk_hunt_end_pass(ctx, SOCKCALL_PROTO_BRPC);
}

#endif /* PSLAT_FRAMINGS_BPF_H */
