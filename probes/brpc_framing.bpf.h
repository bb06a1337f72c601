/* brpc_framing.bpf.h: brpc's baidu_std framing for the walker's engine
 * (walk_engine.bpf.h), with the copy policy of PaddlePaddle's parameter
 * server on it.
 *
 * baidu_std (apache/brpc src/brpc/policy/baidu_rpc_protocol.cpp): no
 * preface; every message is a 12-byte header, "PRPC", the body size (u32,
 * big-endian, without the header) and the meta size (u32, big-endian, at
 * most the body size), then the body: the RpcMeta protobuf (meta size
 * bytes), the payload, the attachment. A message is one frame here.
 *
 * What is copied: every header; the first SOCKCALLS_META_COPY_MAX bytes of
 * the body at most: the RpcMeta whole (counted truncated when it is longer)
 * and BRPC_PAYLOAD_COPY bytes of the payload after it (Paddle's
 * PsRequestMessage names its command, table and key count there; a
 * PsResponseMessage its error). The rest of the body (keys, values,
 * attachments) is skipped: parsers/brpc says a message's keys were not
 * sampled when the walker skipped them.
 *
 * Self-sync candidates: a header with the magic, sizes the walker accepts
 * and an RpcMeta that starts with its request (field 1) or response (field
 * 2); a chain follows whole messages. Attachments may hold the magic; the
 * engine's chain rule (two messages in a call, one ending at its end, or
 * headers found where predicted) is what tells them apart.
 *
 * The engine calls these through framings.bpf.h's fr_* dispatch, with the
 * protocol a compile-time constant in each walk program.
 */
#ifndef PSLAT_BRPC_FRAMING_BPF_H
#define PSLAT_BRPC_FRAMING_BPF_H

#include "walk_engine.bpf.h"

#define BRPC_HEADER_BYTES 12
#define BRPC_MAGIC 0x50525043U     /* "PRPC", as a big-endian u32 */
#define BRPC_META_MAX (1 << 16)    /* a longer RpcMeta is garbage (parsers/brpc meta_max_bytes) */
#define BRPC_HUNT_BODY_MAX (1 << 30) /* a self-sync candidate with a longer body is none (parsers/brpc) */
#define BRPC_PAYLOAD_COPY 64       /* payload bytes copied after the meta */
#define BRPC_META_REQUEST 0x0A     /* RpcMeta's first byte: field 1 (request), length-delimited */
#define BRPC_META_RESPONSE 0x12    /* or field 2 (response) */
#define BRPC_CAND_BYTES 13         /* a candidate: the header and the meta's first byte */
#define BRPC_CHAIN_READ 13

static __always_inline u32 brpc_be32(const u8 *b)
{
	return ((u32)b[0] << 24) | ((u32)b[1] << 16) | ((u32)b[2] << 8) | b[3];
}

/* Sizes a header may carry: 1 to BRPC_META_MAX bytes of meta inside the body. */
static __always_inline int brpc_sizes_ok(u64 body, u64 meta)
{
	return meta && meta <= body && meta <= BRPC_META_MAX;
}

/* A stream whose first n (1..4) bytes are b: could it be baidu_std? */
static __always_inline int brpc_starts(const u8 *b, u32 n)
{
	u32 m = 0;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		if (k < n)
			m |= b[k] ^ ((BRPC_MAGIC >> (24 - 8 * k)) & 0xFF);
	}
	return n && !m;
}

/* A message is one frame: its end is the message's. */
static __always_inline void brpc_frame_end(struct wk_scratch *s)
{
	s->w.st.phase = WK_HEADER;
	wk_message_end(s);
}

/* A header is complete, its magic checked, the body and meta sizes in
 * st->acc (brpc_header): check them and set up the body. Returns 1 to stop. */
static __always_inline int brpc_frame_begin(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u64 body = st->acc >> 32, meta = st->acc & 0xFFFFFFFFULL;
	if (!brpc_sizes_ok(body, meta)) {
		wk_desync(s, SOCKCALL_STOP_BAD_SIZE, 0);
		return 1;
	}
	wk_body_begin(w, body);
	u64 bound = meta + BRPC_PAYLOAD_COPY;
	if (bound > SOCKCALLS_META_COPY_MAX)
		bound = SOCKCALLS_META_COPY_MAX;
	wk_body_prefix(w, body, bound);
	if (meta > bound)
		w->truncated++;
	return 0;
}

/* A header, or the part of it this stretch holds: all 12 bytes at once when
 * they are here (nearly always), else one byte per step (a header split
 * across calls: the magic checked byte by byte, every byte shifted through
 * st->acc, which ends up holding the two sizes). A loop over the 1..12
 * bytes a stretch may hold made brpc_walk too complex for the verifier
 * (over 1M instructions). */
static __always_inline int brpc_header(struct wk_scratch *s, u64 addr, u64 avail)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u32 have = st->hdr_have;
	if (have == 0 && avail >= BRPC_HEADER_BYTES) {
		u8 h[16] = {};
		if (bpf_probe_read_user(h, BRPC_HEADER_BYTES, (void *)addr)) {
			wk_stop(s, SOCKCALL_STOP_FAULT, 0);
			return 1;
		}
		if (brpc_be32(h) != BRPC_MAGIC) {
			/* garbage is told by its first bytes, before they are taken as a header */
			wk_desync(s, SOCKCALL_STOP_BAD_MAGIC, h[0]);
			return 1;
		}
		st->acc = ((u64)brpc_be32(h + 4) << 32) | brpc_be32(h + 8);
		wk_header_bytes(s, h, BRPC_HEADER_BYTES, BRPC_HEADER_BYTES);
		return brpc_frame_begin(s);
	}
	u8 b = 0;
	if (have >= BRPC_HEADER_BYTES || bpf_probe_read_user(&b, 1, (void *)addr)) {
		wk_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 1;
	}
	if (have < 4 && b != ((BRPC_MAGIC >> (24 - 8 * have)) & 0xFF)) {
		wk_desync(s, SOCKCALL_STOP_BAD_MAGIC, b);
		return 1;
	}
	if (have == 0)
		st->acc = 0;
	st->acc = (st->acc << 8) | b;
	wk_header_bytes(s, &b, 1, 1);
	st->hdr_have = have + 1;
	if (have + 1 < BRPC_HEADER_BYTES)
		return 0; /* the rest comes with the next bytes */
	st->hdr_have = 0;
	return brpc_frame_begin(s);
}

/* Self-sync: could a message start at b[0] (BRPC_CAND_BYTES readable)? */
static __always_inline int brpc_candidate(const u8 *b)
{
	if (b[0] != 'P' || b[1] != 'R' || b[2] != 'P' || b[3] != 'C')
		return 0;
	u64 body = brpc_be32(b + 4), meta = brpc_be32(b + 8);
	return brpc_sizes_ok(body, meta) && body <= BRPC_HUNT_BODY_MAX &&
	       (b[12] == BRPC_META_REQUEST || b[12] == BRPC_META_RESPONSE);
}

/* Self-sync: the header at h (r bytes read) in a chain: -1 (none) or 1 (a
 * message, ending *len bytes on); a message is one frame, whatever idx. */
static __always_inline int brpc_chain_frame(const u8 *h, u64 r, u32 idx, u64 *len)
{
	if (r < BRPC_CHAIN_READ || !brpc_candidate(h))
		return -1;
	*len = BRPC_HEADER_BYTES + (u64)brpc_be32(h + 4);
	return 1;
}

#endif /* PSLAT_BRPC_FRAMING_BPF_H */
