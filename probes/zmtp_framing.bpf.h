/* zmtp_framing.bpf.h: ZMTP 3's framing for the walker's engine
 * (walk_engine.bpf.h), with ps-lite's copy policy.
 *
 * ZMTP 3 (rfc.zeromq.org 23/37): a 64-byte greeting, then frames: a flags
 * byte (MORE 0x01, LONG 0x02, COMMAND 0x04, the rest reserved), the body
 * size in 1 octet or, with LONG, 8 octets network order, the body. A message
 * is frames up to one without MORE; a command is one frame, between messages.
 *
 * What is copied (ps-lite): the greeting and every frame header; command
 * frames and the meta frame, bounded; the frame after it (the keys, uint64)
 * is key-sampled. Everything else is a frame body the engine skips. The meta
 * is frame 0 (MXNet's PBMeta, BytePS's RawMeta), or frame 1 where frame 0 is
 * shorter than any meta and has MORE set: a BytePS server's answers start
 * with its sender id "ps<N>" (parsers/pslite/rawmeta.py), copied as well.
 *
 * Self-sync candidates: a short header of frame 0 (flags 0x00 or 0x01, size
 * >= 8) whose body starts with PBMeta's first tag (0x08); a chain follows
 * frames without reserved or COMMAND bits, at most 8 data frames, every frame
 * 0 a candidate again. Random bytes practically never complete two messages
 * so.
 *
 * The engine calls these through framings.bpf.h's fr_* dispatch, with the
 * protocol a compile-time constant in each walk program.
 */
#ifndef PSLAT_ZMTP_FRAMING_BPF_H
#define PSLAT_ZMTP_FRAMING_BPF_H

#include "walk_engine.bpf.h"

#define ZMTP_FLAG_MORE 0x01
#define ZMTP_FLAG_LONG 0x02
#define ZMTP_FLAG_COMMAND 0x04
#define ZMTP_FLAGS_RESERVED 0xF8
#define ZMTP_GREETING_BYTES 64
#define ZMTP_COMMAND_MAX (1 << 16) /* a longer command is garbage (as in parsers/pslite) */
#define ZMTP_HEADER_MAX 9
#define ZMTP_META_FIRST_BYTE 0x08 /* PBMeta's field 1 (head, varint): ps-lite always sets it */
#define ZMTP_META_MIN 8
#define ZMTP_DATA_FRAMES_MAX 8 /* as parsers/pslite MAX_DATA_FRAMES */
#define ZMTP_CAND_BYTES 3      /* a candidate: flags, size, the meta's first byte */
#define ZMTP_CHAIN_READ 10     /* bytes a chain reads at a header: a long header and one body byte */

/* Greeting bytes: copied, and checked where they say what the stream is. */
static __always_inline int zmtp_preface(struct wk_scratch *s, u64 addr, u64 avail)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u64 g0 = ZMTP_GREETING_BYTES - st->left; /* greeting offset of addr */
	u64 n = avail < st->left ? avail : st->left;
	if (n == 0 || n > ZMTP_GREETING_BYTES || g0 >= ZMTP_GREETING_BYTES)
		return 1;
	if (bpf_probe_read_user(w->win, n, (void *)addr)) {
		wk_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 1;
	}
	int bad = 0;
	/* signature 0xFF ... 0x7F, version >= 3, mechanism (bytes 12..17) */
#pragma unroll
	for (int p = 0; p < 18; p++) {
		if (p == 0 || p == 9 || p == 10 || p >= 12) {
			if (p >= g0 && p < g0 + n) {
				u8 b = ((u8 *)w->win)[(p - g0) & (ZMTP_GREETING_BYTES - 1)];
				if (p == 0)
					bad |= b != 0xFF;
				else if (p == 9)
					bad |= b != 0x7F;
				else if (p == 10)
					bad |= b < 3;
				else
					st->acc |= (u64)b << (8 * (p - 12));
			}
		}
	}
	if (bad) {
		/* stop before these bytes: they go out raw, for user space to hunt in */
		wk_stop(s, SOCKCALL_STOP_NOT_PROTOCOL, 0);
		return 1;
	}
	wk_copy_kernel(s, w->pos, w->win, n, SOCKCALL_BYTES_GREETING);
	wk_advance(w, n);
	st->left -= n;
	if (st->left)
		return 0;
	/* "NULL" and "PLAIN" (zero padded) leave frames in clear; CURVE does not */
	if (st->acc != 0x00004C4C554EULL && st->acc != 0x004E49414C50ULL) {
		wk_stop(s, SOCKCALL_STOP_OPAQUE, 0);
		return 1;
	}
	st->phase = WK_HEADER;
	st->hdr_have = 0;
	st->frame_idx = 0;
	return 0;
}

/* A frame's body is done: the next header; a message ends at a frame without MORE. */
static __always_inline void zmtp_frame_end(struct wk_scratch *s)
{
	struct wk_state *st = &s->w.st;
	st->phase = WK_HEADER;
	if (st->flags & ZMTP_FLAG_COMMAND)
		return; /* commands stand alone, between messages */
	if (st->flags & ZMTP_FLAG_MORE) {
		st->frame_idx++;
		return;
	}
	wk_message_end(s);
}

/* A header is complete (flags in st->flags, size in st->acc): check it and
 * set up its body. Returns 1 to stop. */
static __always_inline int zmtp_frame_begin(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u8 f = st->flags;
	u64 size = st->acc;
	if (size >> SOCKCALLS_FRAME_MAX_BITS) {
		wk_desync(s, SOCKCALL_STOP_BAD_SIZE, 0);
		return 1;
	}
	wk_body_begin(w, size);
	u64 bound = 0;
	if (f & ZMTP_FLAG_COMMAND) {
		if ((f & ZMTP_FLAG_MORE) || st->frame_idx || size > ZMTP_COMMAND_MAX) {
			wk_desync(s, SOCKCALL_STOP_BAD_COMMAND, f);
			return 1;
		}
		bound = SOCKCALLS_COMMAND_COPY_MAX;
	} else if (st->frame_idx == 0) {
		bound = SOCKCALLS_META_COPY_MAX;
		st->msg_aux = (f & ZMTP_FLAG_MORE) && size < ZMTP_META_MIN; /* a sender id: the meta is next */
	} else if (st->frame_idx == st->msg_aux) {
		bound = SOCKCALLS_META_COPY_MAX;
	} else if (st->frame_idx == 1u + st->msg_aux && size && !(size & 7)) {
		wk_body_keys(st, size >> 3);
	}
	wk_body_copy(w, size, bound);
	if (size == 0)
		zmtp_frame_end(s);
	return 0;
}

/* A frame header, or the part of it this stretch holds. */
static __always_inline int zmtp_header(struct wk_scratch *s, u64 addr, u64 avail)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u8 h[16] = {};
	u64 r = avail < ZMTP_HEADER_MAX ? avail : ZMTP_HEADER_MAX;
	if (r == 0 || bpf_probe_read_user(h, r & 15, (void *)addr)) {
		wk_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 1;
	}
	u32 first = 0; /* index in h of the first size byte */
	if (st->hdr_have == 0) {
		u8 f = h[0];
		if (f & ZMTP_FLAGS_RESERVED) {
			wk_desync(s, SOCKCALL_STOP_BAD_FLAGS, f);
			return 1;
		}
		st->flags = f;
		st->acc = 0;
		st->hdr_have = 1;
		first = 1;
	}
	u32 hl = (st->flags & ZMTP_FLAG_LONG) ? 9 : 2;
	u32 take = hl - st->hdr_have;
	if (take > r - first)
		take = r - first;
#pragma unroll
	for (int k = 0; k < ZMTP_HEADER_MAX; k++) { /* k = 0: a call that begins inside the size */
		if (k >= first && k < first + take)
			st->acc = (st->acc << 8) | h[k];
	}
	wk_header_bytes(s, h, first + take, ZMTP_HEADER_MAX);
	st->hdr_have += take;
	if (st->hdr_have < hl)
		return 0; /* the rest comes with the next call */
	st->hdr_have = 0;
	return zmtp_frame_begin(s);
}

/* Self-sync: could a message start at b[0] (ZMTP_CAND_BYTES readable)? */
static __always_inline int zmtp_candidate(const u8 *b)
{
	return b[0] <= ZMTP_FLAG_MORE && b[1] >= ZMTP_META_MIN && b[2] == ZMTP_META_FIRST_BYTE;
}

/* Self-sync: the header at h (r bytes read, r >= ZMTP_CAND_BYTES), frame
 * idx of its message, in a chain. Returns -1 (no frame header), 0 (a frame
 * of the message, more follow) or 1 (the message's last frame); *len: the
 * bytes up to the next header. */
static __always_inline int zmtp_chain_frame(const u8 *h, u64 r, u32 idx, u64 *len)
{
	u8 f = h[0];
	if (f & ~(ZMTP_FLAG_MORE | ZMTP_FLAG_LONG))
		return -1;
	u64 size = h[1], hl = 2;
	if (f & ZMTP_FLAG_LONG) {
		if (r < 9)
			return -1;
		size = ((u64)h[1] << 56) | ((u64)h[2] << 48) | ((u64)h[3] << 40) | ((u64)h[4] << 32) |
		       ((u64)h[5] << 24) | ((u64)h[6] << 16) | ((u64)h[7] << 8) | h[8];
		hl = 9;
	}
	if (idx == 0) {
		if ((f & ZMTP_FLAG_LONG) || size < ZMTP_META_MIN || h[2] != ZMTP_META_FIRST_BYTE)
			return -1;
	} else if (idx > ZMTP_DATA_FRAMES_MAX) {
		return -1;
	}
	if (size >> SOCKCALLS_FRAME_MAX_BITS)
		return -1;
	*len = hl + size;
	return (f & ZMTP_FLAG_MORE) ? 0 : 1;
}

#endif /* PSLAT_ZMTP_FRAMING_BPF_H */
