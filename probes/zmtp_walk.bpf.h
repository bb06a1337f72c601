/* zmtp_walk.bpf.h: the in-kernel ZMTP 3 frame walker of the sockcalls probe.
 *
 * DESIGN.md "Matching", Payload: libzmq batches many messages into one send
 * or recv, so frame headers sit anywhere in a call's bytes, and frames
 * straddle calls. The walker runs at syscall exit over the bytes the call
 * moved (the user buffer still holds them then, for sends and receives),
 * keeping per connection and direction where it is in the stream: greeting,
 * frame header (possibly split across calls), frame body (bytes left), the
 * frame's index in its message and its flags. It copies out only
 *  - the greeting and every frame header,
 *  - command frames and the meta frame (frame 0: ps-lite's PBMeta), bounded,
 *  - a sample of frame 1 (ps-lite's keys, uint64): keys chosen by a hash of
 *    the key, never the first n (ps-lite keys are sorted),
 * and says where every message ended (its TCP sequence). Everything else in
 * a walked range is a frame body that user space skips. The items it writes
 * are described in events.h.
 *
 * ZMTP 3 (rfc.zeromq.org 23/37): a 64-byte greeting, then frames: a flags
 * byte (MORE 0x01, LONG 0x02, COMMAND 0x04, the rest reserved), the body
 * size in 1 octet or, with LONG, 8 octets network order, the body. A message
 * is frames up to one without MORE; a command is one frame.
 *
 * Sync: a connection whose first byte the walker sees (seq_start ==
 * ISN + 1) is walked from its greeting. One joined mid-stream is unsynced:
 * its calls carry a raw prefix until
 *  - the walker finds sync by itself (self-sync, below): a ps-lite meta
 *    header starting a chain of frames that completes two messages inside
 *    one call, or one message ending exactly at the call's end, or whose
 *    predicted headers later calls confirm (messages longer than a call); or
 *  - user space (the ps-lite parser, which resynchronises on a chain of
 *    frames) writes a sync hint: "a frame header starts at sequence S, frame
 *    i of its message"; the walker starts there when a call's range reaches
 *    S (a hint the stream has passed is dropped and counted: stale).
 * An impossible header makes the connection unsynced again (counted), and
 * the rest of that call is hunted in at once (self-sync): a stream that
 * carries garbage and then frames is followed again from the first chain
 * of frames after the garbage, in the same call, whatever the read sizes.
 *
 * Cost and the verifier: the walk is a loop of small steps (one header, or
 * one stretch of a body) over a context kept in a per-CPU array (the BPF
 * stack is 512 bytes). bcc 0.26 cannot pass a callback to bpf_loop (it does
 * not relocate function pointers), so the loop is a bounded one of
 * SOCKCALLS_WALK_STEPS steps per program, continued by tail calls of the
 * walker program to itself (the kernel allows 33 per event): a call with
 * more frames than that budget stops the walk (counted: walk_budget; the
 * connection is unsynced and the next call hunts). Programs
 * (sockcalls.bpf.c): sc_exit sets up the call (zw_begin) and tail-calls
 * zw_walk (synced) or zw_hunt_prog (unsynced, no hint); zw_hunt_prog
 * searches a window per pass and tail-calls itself, then zw_walk from the
 * sync point; zw_walk tail-calls itself while bytes remain, zw_hunt_prog
 * when it meets garbage, then zw_ends for the netstack lookups of the
 * message ends it saw (SOCKCALLS_ENDS_PER_PASS per pass).
 *
 * The verifier: it follows every path through each loop iteration, and
 * prunes a path only when its state matches one already seen. Values that
 * would differ per path (output cursor, loop results, bounds narrowed by a
 * loop's exit test) are therefore kept in the walk context, volatile, rather
 * than in registers; see the comments at those fields.
 *
 * The probe that includes it (sockcalls.bpf.c) defines where records and
 * counts go: sc_output() and sc_add() below.
 */
#ifndef PSLAT_ZMTP_WALK_BPF_H
#define PSLAT_ZMTP_WALK_BPF_H

#include "common.bpf.h"
#include "rings.bpf.h"

/* Defined by the including probe: send one record to its ring buffer
 * (returns the helper's result), add n to one of its counter slots.
 * (Prototypes: the type on its own line, so tools that list the program's
 * functions by their definitions do not count these twice.) */
static __always_inline long
sc_output(void *rec, u64 size);
static __always_inline void
sc_add(int slot, u64 n);

#define ZW_FLAG_MORE 0x01
#define ZW_FLAG_LONG 0x02
#define ZW_FLAG_COMMAND 0x04
#define ZW_FLAGS_RESERVED 0xF8
#define ZW_GREETING_BYTES 64
#define ZW_COMMAND_MAX (1 << 16) /* a longer command is garbage (as in parsers/pslite) */

#define ZW_IOV_MAX 32      /* room for iovecs; SOCKCALLS_IOV_WALK_MAX <= this */
#define ZW_PIECE_MAX 512   /* bytes copied by one step */
#define ZW_BLOCK_BYTES 512 /* keys hashed by one step (64 keys) */
#define ZW_ITEM_HDR 8      /* sizeof(struct sockcall_item) */
#define ZW_ITEM_MAX 64     /* largest fixed-size item body (struct ns_sched: 48) */
#define ZW_ENDS_MAX 256    /* message ends of one call kept for the netstack lookups */
#define ZW_DIR_TX 0
#define ZW_DIR_RX 1

/* tail-call slots of sockcalls_progs */
#define ZW_PROG_WALK 0
#define ZW_PROG_ENDS 1
#define ZW_PROG_HUNT 2
#define ZW_PROG_HUNT_END 3

/* self-sync of an unsynced call (zw_hunt_find) */
#define ZW_HUNT_WINDOW 512   /* bytes searched for candidate meta headers per hunting pass (win[] holds them) */
#define ZW_HUNT_PASSES 16    /* passes (tail calls) per call at most: ~8 KiB searched, the rest left unread */
#define ZW_HUNT_CANDIDATES 4 /* candidates followed per window */
#define ZW_HUNT_FRAMES 24    /* headers followed per candidate */
#define ZW_HUNT_MESSAGES 2   /* messages a candidate's chain must complete inside the call */
#define ZW_HUNT_CONFIRM 3    /* headers a chain across calls must predict and find before the walk starts */
/* zw_chain: what a chain of frames did */
#define ZW_CHAIN_BAD 0   /* met bytes that are no frame header (or could not tell) */
#define ZW_CHAIN_DONE 1  /* completed the messages that prove it */
#define ZW_CHAIN_AHEAD 2 /* plausible up to the call's end; its next header is at h_pos, frame h_idx */
#define ZW_CHAIN_CUT 3   /* plausible up to a header split by the call's end */
#define ZW_HUNT_TAIL 2   /* a call's last bytes, which start no candidate (3 bytes), go out raw */
#define ZW_META_FIRST_BYTE 0x08 /* PBMeta's field 1 (head, varint): ps-lite always sets it */
#define ZW_META_MIN 8
#define ZW_DATA_FRAMES_MAX 8 /* as parsers/pslite MAX_DATA_FRAMES */

#if SOCKCALLS_IOV_WALK_MAX > ZW_IOV_MAX
#error "SOCKCALLS_IOV_WALK_MAX is larger than the walker's iovec room"
#endif
#if SOCKCALLS_META_COPY_MAX > ZW_PIECE_MAX * 4 || SOCKCALLS_COMMAND_COPY_MAX > ZW_PIECE_MAX * 4
#error "copy bounds above what the walker supports"
#endif
/* keys frames are hashed in up to SOCKCALLS_KEY_SCAN_BLOCKS blocks of 64 keys */
#define ZW_SCAN_BLOCKS SOCKCALLS_KEY_SCAN_BLOCKS
#define ZW_SCAN_KEYS (SOCKCALLS_KEY_SCAN_BLOCKS * (ZW_BLOCK_BYTES / 8))

enum zw_phase {
	ZW_UNSYNCED = 0, /* position in the stream unknown: raw prefixes, waiting for a hint */
	ZW_GREETING = 1, /* inside the 64-byte greeting (left: bytes to go) */
	ZW_HEADER = 2,   /* at (or inside, hdr_have > 0) a frame header */
	ZW_BODY = 3,     /* inside a frame body (left: bytes to go) */
	ZW_NOT_ZMTP = 4, /* the connection began with something else: unsynced for good, unless hinted */
	ZW_OPAQUE = 5,   /* encrypted mechanism: nothing to walk */
};

enum zw_body {
	ZW_BODY_SKIP = 0,
	ZW_BODY_COPY = 1, /* meta or command: copy up to copy_left bytes */
	ZW_BODY_KEYS = 2, /* frame 1: hash keys in the scan blocks */
};

/* User-space ABI (LP64), not kernel structs: struct iovec and the fields of
 * struct user_msghdr we read. These never change. */
struct user_iovec {
	u64 base;
	u64 len;
};
#define USER_MSGHDR_IOV_OFF 16
#define USER_MSGHDR_IOVLEN_OFF 24

struct zw_key {
	u64 sk;
	u32 dir; /* ZW_DIR_* */
	u32 _pad;
};

/* Where one direction of a connection is: kept between calls. */
struct zw_state {
	u64 left;       /* bytes to go in the frame body (or greeting) */
	u64 size;       /* the frame body's size */
	u64 acc;        /* header size bytes gathered so far; greeting: mechanism bytes */
	u64 msg_count;  /* messages ended since the walk began */
	u32 next_seq;   /* where the next call must start for the walk to go on */
	u32 frame_idx;  /* index of the current frame in its message */
	u32 copy_left;  /* COPY: bytes still to copy */
	u32 key_stride; /* KEYS: keys from one scan block to the next; 0: scan all */
	volatile u16 key_samples; /* keys sampled in this message (volatile: see zw_walk) */
	u8 phase;       /* enum zw_phase */
	u8 body;        /* enum zw_body */
	u8 flags;       /* the current frame's flags */
	u8 hdr_have;    /* header bytes read so far (flags byte included) */
	u8 key_level;   /* KEYS: sampling level (events.h, struct sockcall_keys) */
	u8 cand_score;  /* unsynced: frame headers a pending candidate predicted and found; 0: none */
	u32 cand_seq;   /* ... where it predicts the next header */
	u32 cand_idx;   /* ... and that header's frame index */
};

/* A sync hint from user space (probes/sockcalls.py set_sync_hint). */
struct zw_hint {
	u32 seq;        /* a frame header starts at this sequence number */
	u32 frame_idx;  /* the index of that frame in its message */
};

/* The walk of one call, shared by sc_exit and the tail-called programs. */
struct zw_walk {
	struct zw_state st;
	struct zw_key key;
	struct user_iovec iov[ZW_IOV_MAX];
	volatile u64 total; /* bytes the call moved */
	volatile u64 pos;   /* call offset of the next byte to walk */
	volatile u64 iov_off; /* offset of pos inside iov[iov_i] */
	u64 walk_from;  /* call offset where walking began */
	/* The output cursor is volatile: kept in the map value, never in
	 * registers, so the verifier sees a bounded unknown instead of a
	 * different constant on every path through a loop (which defeats its
	 * state pruning and blows the complexity limit). */
	volatile u64 piece_end; /* call offset after the last BYTES item (to extend it) */
	volatile u32 piece_at;  /* payload offset of that item */
	volatile u32 data_pos;  /* payload bytes used */
	u32 seq_start;
	volatile u32 niov;
	volatile u32 iov_i;
	u32 n_ends;     /* message ends of this call (the first ZW_ENDS_MAX are kept) */
	u32 ends_done;  /* of them, looked up in the netstack rings */
	u32 ends[ZW_ENDS_MAX]; /* their call offsets */
	u32 frames, messages, key_samples, truncated; /* this call, for the counters */
	volatile u8 has_piece;
	u8 stopped;     /* walking stopped (end of walkable bytes or WALK_END) */
	u8 any_end;     /* at least one message ended in this call */
	u8 stop_reason; /* SOCKCALL_STOP_*, 0 while walking */
	u8 stop_phase;
	u8 _pad;
	u16 stop_detail;
	/* u64 arrays: 8-byte aligned, so keys are read and written as words
	 * (clang splits loads it cannot prove aligned into bytes) */
	u64 win[ZW_BLOCK_BYTES / 8 + 2];  /* user bytes being looked at (greeting, keys) */
	u64 keys[ZW_BLOCK_BYTES / 8 + 2]; /* sampled keys of a scan block, packed */
	volatile u64 scan_len, scan_skip, scan_m; /* zw_keys' values across zw_hash_block */
	volatile u64 scan_mask, scan_kept;        /* zw_hash_block's results */
	volatile u32 n_cand;                    /* zw_hunt_find: candidates found */
	u32 cand[ZW_HUNT_CANDIDATES];
	volatile u64 h_pos;                     /* zw_chain: where the chain is */
	volatile u64 h_limit, h_n;              /* zw_hunt_find: bytes searched, candidates' window */
	volatile u32 h_idx, h_msgs;
	/* the hunt of this call, window by window (zw_hunt) */
	volatile u64 hunt_from;                 /* call offset where it began: 0, or where the walk lost sync */
	volatile u64 h_at;                      /* the next window's call offset */
	volatile u64 h_rej_end;                 /* bytes from hunt_from up to here were searched and rejected */
	volatile u64 h_tail_at;                 /* a candidate cut by the call's end: its bytes go out raw */
	volatile u32 h_passes;
	volatile u64 h_found;                   /* the hunt's result: the sync point, or total */
};

struct zw_scratch {
	struct sockcall_event ev;
	/* After payload[]: lets the verifier accept an item of up to
	 * ZW_ITEM_HDR + ZW_PIECE_MAX bytes at any offset below PAYLOAD_MAX. */
	u8 slack[ZW_ITEM_HDR + ZW_PIECE_MAX + ZW_ITEM_MAX];
	struct zw_walk w;
};

BPF_PERCPU_ARRAY(sockcalls_scratch, struct zw_scratch, 1);
BPF_TABLE("lru_hash", struct zw_key, struct zw_state, sockcalls_walk, SOCKCALLS_WALK_CONNS_MAX);
BPF_HASH(sockcalls_sync_hint, struct zw_key, struct zw_hint, SOCKCALLS_HINTS_MAX);
BPF_PROG_ARRAY(sockcalls_progs, 4);

static __always_inline void zw_count(int slot, u64 n)
{
	if (n)
		sc_add(slot, n);
}

static __always_inline struct zw_scratch *zw_scratch(void)
{
	int zero = 0;
	return sockcalls_scratch.lookup(&zero);
}

/* splitmix64's finalizer: the key hash of parsers/pslite/keysample.py. */
static __always_inline u64 zw_key_hash(u64 x)
{
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

/* ---- output ---------------------------------------------------------------- */

/* Send what the record holds and start a new one for the same call. */
static __always_inline void zw_emit(struct zw_scratch *s, int continued)
{
	struct sockcall_event *ev = &s->ev;
	u32 n = s->w.data_pos;
	if (n > SOCKCALL_PAYLOAD_MAX)
		n = SOCKCALL_PAYLOAD_MAX;
	ev->payload_bytes = n;
	if (continued)
		ev->flags |= SOCKCALL_F_CONTINUED;
	else
		ev->flags &= ~SOCKCALL_F_CONTINUED;
	zw_count(PSLAT_COUNTER_SEEN, 1);
	u64 size = offsetof(struct sockcall_event, payload) + n;
	/* keep the bound where the verifier sees it, next to the call */
	asm volatile("" : "+r"(size));
	if (size > sizeof(struct sockcall_event))
		size = sizeof(struct sockcall_event);
	if (sc_output(ev, size))
		zw_count(PSLAT_COUNTER_LOST, 1);
	s->w.data_pos = 0;
	s->w.has_piece = 0;
}

/* Room for `need` more payload bytes, or a flush first. Returns the payload
 * offset to write at, bounded for the verifier. */
static __always_inline u32 zw_room(struct zw_scratch *s, u32 need)
{
	if (s->w.data_pos + need > SOCKCALL_PAYLOAD_MAX)
		zw_emit(s, 1);
	return s->w.data_pos & (SOCKCALL_PAYLOAD_MAX - 1);
}

/* A fixed-size item: returns where its body goes (len <= ZW_ITEM_MAX). */
static __always_inline u8 *zw_item(struct zw_scratch *s, u8 kind, u8 what, u32 len, u64 call_off)
{
	u32 at = zw_room(s, ZW_ITEM_HDR + len);
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->kind = kind;
	it->what = what;
	it->len = len;
	it->call_off = (u32)call_off;
	s->w.data_pos = at + ZW_ITEM_HDR + (len & (ZW_ITEM_MAX * 2 - 1));
	s->w.has_piece = 0;
	return &s->ev.payload[at + ZW_ITEM_HDR];
}

/* BYTES pieces are written in two steps so that a failed user read leaves
 * nothing behind: zw_piece_at() says where `len` bytes for call offset
 * `call_off` go (appending to the previous piece when it ends right there),
 * the caller copies them, zw_piece_commit() records them. */
static __always_inline u32 zw_piece_at(struct zw_scratch *s, u64 call_off, u32 len)
{
	struct zw_walk *w = &s->w;
	if (w->has_piece && w->piece_end == call_off && w->data_pos + len <= SOCKCALL_PAYLOAD_MAX)
		return w->data_pos & (SOCKCALL_PAYLOAD_MAX - 1);
	w->has_piece = 0;
	return zw_room(s, ZW_ITEM_HDR + len) + ZW_ITEM_HDR;
}

static __always_inline void zw_piece_commit(struct zw_scratch *s, u64 call_off, u32 len, u8 what)
{
	struct zw_walk *w = &s->w;
	u32 at;
	if (w->has_piece) {
		at = w->piece_at & (SOCKCALL_PAYLOAD_MAX - 1);
	} else {
		at = w->data_pos & (SOCKCALL_PAYLOAD_MAX - 1);
		struct sockcall_item *fresh = (struct sockcall_item *)&s->ev.payload[at];
		fresh->kind = SOCKCALL_ITEM_BYTES;
		fresh->what = 0;
		fresh->len = 0;
		fresh->call_off = (u32)call_off;
		w->piece_at = at;
		w->data_pos = at + ZW_ITEM_HDR;
		w->has_piece = 1;
	}
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->len += len;
	it->what |= what;
	w->data_pos += len;
	w->piece_end = call_off + len;
}

/* Copy `len` (1..ZW_PIECE_MAX) bytes of user memory at `addr`, the call's
 * bytes at `call_off`. Returns 0, or -1 when the read failed. */
static __always_inline int zw_copy_user(struct zw_scratch *s, u64 call_off, u64 addr, u64 len, u8 what)
{
	/* The empty asm keeps clang from merging the check into the caller's
	 * clamps, which the verifier cannot follow (see copy_user history). */
	asm volatile("" : "+r"(len));
	if (len == 0 || len > ZW_PIECE_MAX)
		return 0;
	u32 at = zw_piece_at(s, call_off, len);
	if (bpf_probe_read_user(&s->ev.payload[at], len, (void *)addr))
		return -1;
	zw_piece_commit(s, call_off, len, what);
	return 0;
}

/* The same from kernel memory we hold (the window). */
static __always_inline void zw_copy_kernel(struct zw_scratch *s, u64 call_off, void *src, u64 len, u8 what)
{
	asm volatile("" : "+r"(len));
	if (len == 0 || len > ZW_PIECE_MAX)
		return;
	u32 at = zw_piece_at(s, call_off, len);
	bpf_probe_read_kernel(&s->ev.payload[at], len, src);
	zw_piece_commit(s, call_off, len, what);
}

/* ---- the call's bytes ------------------------------------------------------ */

/* Read the call's iovecs (or make one of a plain buffer). */
static __always_inline void zw_load_iovs(struct zw_walk *w, u8 call, u64 ptr, u64 len, u64 total)
{
	w->iov_i = 0;
	w->iov_off = 0;
	w->niov = 0;
	u64 iov = 0, n = 0;
	switch (call) {
	case SOCKCALL_READ:
	case SOCKCALL_WRITE:
	case SOCKCALL_RECVFROM:
	case SOCKCALL_SENDTO:
		w->iov[0].base = ptr;
		w->iov[0].len = total;
		w->niov = 1;
		return;
	case SOCKCALL_READV:
	case SOCKCALL_WRITEV:
		iov = ptr;
		n = len;
		break;
	default: /* recvmsg, sendmsg: struct user_msghdr */
		bpf_probe_read_user(&iov, sizeof(iov), (void *)(ptr + USER_MSGHDR_IOV_OFF));
		bpf_probe_read_user(&n, sizeof(n), (void *)(ptr + USER_MSGHDR_IOVLEN_OFF));
		break;
	}
	if (n > SOCKCALLS_IOV_WALK_MAX)
		n = SOCKCALLS_IOV_WALK_MAX;
	if (n == 0 || n > ZW_IOV_MAX)
		return;
	if (bpf_probe_read_user(w->iov, n * sizeof(struct user_iovec), (void *)iov) == 0)
		w->niov = n;
}

/* Move the walk to call offset `off` (iovec and offset inside it). */
static __always_inline void zw_seek(struct zw_walk *w, u64 off)
{
	w->pos = off;
	w->iov_i = 0;
#pragma unroll
	for (int i = 0; i < ZW_IOV_MAX; i++) {
		if (i >= w->niov || i >= SOCKCALLS_IOV_WALK_MAX)
			break;
		u64 l = w->iov[i].len;
		if (off < l)
			break;
		off -= l;
		w->iov_i = i + 1;
	}
	w->iov_off = off;
}

/* Raw bytes [from, from + len) of the call (len <= ZW_PIECE_MAX), across
 * iovecs, for a stretch the walker does not follow. */
static __always_inline void zw_copy_raw(struct zw_scratch *s, u64 from, u64 len, u8 what)
{
	struct zw_walk *w = &s->w;
	u64 skip = from;
	for (int i = 0; i < SOCKCALLS_IOV_WALK_MAX; i++) {
		if (i >= w->niov || len == 0)
			break;
		u64 l = w->iov[i & (ZW_IOV_MAX - 1)].len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		u64 n = l - skip < len ? l - skip : len;
		if (zw_copy_user(s, from, w->iov[i & (ZW_IOV_MAX - 1)].base + skip, n, what))
			return;
		from += n;
		len -= n;
		skip = 0;
	}
}

/* ---- walk marks ------------------------------------------------------------ */

static __always_inline void zw_mark(struct zw_scratch *s, u8 kind, u8 how, u16 detail)
{
	struct sockcall_walk_mark *m =
		(struct sockcall_walk_mark *)zw_item(s, kind, 0, sizeof(struct sockcall_walk_mark), s->w.pos);
	m->frame_idx = s->w.st.frame_idx;
	m->how = how;
	m->phase = s->w.st.phase;
	m->detail = detail;
}

/* Stop following frames at the current position. The WALK_END item and
 * the raw bytes after it (for user space to hunt in) are written by
 * zw_finish, once, outside the walk's loop (the verifier's cost of a loop
 * grows with the code inside it). */
static __always_inline void zw_stop(struct zw_scratch *s, u8 reason, u16 detail)
{
	struct zw_walk *w = &s->w;
	w->stop_reason = reason;
	w->stop_detail = detail;
	w->stop_phase = w->st.phase;
	w->stopped = 1;
}

/* The WALK_END of zw_stop, its raw bytes (unless a hunt follows: it copies
 * them), its counter, the new phase. */
static __always_inline void zw_write_stop(struct zw_scratch *s, int raw)
{
	struct zw_walk *w = &s->w;
	u8 reason = w->stop_reason;
	if (!reason)
		return;
	struct sockcall_walk_mark *m =
		(struct sockcall_walk_mark *)zw_item(s, SOCKCALL_ITEM_WALK_END, 0, sizeof(struct sockcall_walk_mark), w->pos);
	m->frame_idx = w->st.frame_idx;
	m->how = reason;
	m->phase = w->stop_phase;
	m->detail = w->stop_detail;
	u8 phase = ZW_UNSYNCED;
	switch (reason) {
	case SOCKCALL_STOP_NOT_ZMTP:
		phase = ZW_NOT_ZMTP;
		zw_count(SOCKCALL_COUNTER_NOT_ZMTP, 1);
		break;
	case SOCKCALL_STOP_OPAQUE:
		phase = ZW_OPAQUE;
		break;
	case SOCKCALL_STOP_BAD_FLAGS:
	case SOCKCALL_STOP_BAD_SIZE:
	case SOCKCALL_STOP_BAD_COMMAND:
		zw_count(SOCKCALL_COUNTER_DESYNCS, 1);
		break;
	case SOCKCALL_STOP_BUDGET:
		zw_count(SOCKCALL_COUNTER_WALK_BUDGET, 1);
		zw_count(SOCKCALL_COUNTER_WALK_ABORTED, 1);
		break;
	case SOCKCALL_STOP_FAULT:
		s->ev.flags |= SOCKCALL_F_PAYLOAD_FAULT;
		/* fall through */
	default:
		zw_count(SOCKCALL_COUNTER_WALK_ABORTED, 1);
		break;
	}
	if (raw && phase != ZW_OPAQUE && w->pos < w->total) {
		u64 n = w->total - w->pos;
		zw_copy_raw(s, w->pos, n < SOCKCALLS_PREFIX_BYTES ? n : SOCKCALLS_PREFIX_BYTES, SOCKCALL_BYTES_RAW);
	}
	w->st.phase = phase;
	w->st.hdr_have = 0;
	w->st.cand_score = 0;
}

/* ---- frames ---------------------------------------------------------------- */

static __always_inline void zw_advance(struct zw_walk *w, u64 n)
{
	w->pos += n;
	w->iov_off += n;
}

/* A message ended at the current position. */
static __always_inline void zw_message_end(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	struct sockcall_msg_end *m =
		(struct sockcall_msg_end *)zw_item(s, SOCKCALL_ITEM_MSG_END, 0, sizeof(struct sockcall_msg_end), w->pos);
	m->end_seq = w->seq_start + (u32)w->pos;
	m->frames = st->frame_idx + 1;
	m->msg_index = st->msg_count;
	u32 n = w->n_ends;
	if (n < ZW_ENDS_MAX)
		w->ends[n & (ZW_ENDS_MAX - 1)] = (u32)w->pos;
	w->n_ends = n + 1;
	w->any_end = 1;
	w->messages++;
	st->msg_count++;
	st->frame_idx = 0;
	st->key_samples = 0;
}

static __always_inline void zw_frame_end(struct zw_scratch *s)
{
	struct zw_state *st = &s->w.st;
	st->phase = ZW_HEADER;
	if (st->flags & ZW_FLAG_COMMAND)
		return; /* commands stand alone, between messages */
	if (st->flags & ZW_FLAG_MORE) {
		st->frame_idx++;
		return;
	}
	zw_message_end(s);
}

/* Sampling level for a keys frame: every key of a small frame; otherwise
 * keys whose hash has `level` leading zero bits, level chosen so that 4 to 8
 * of the scanned keys are expected. Nested: a key kept at one level is kept
 * at every lower one. */
static __always_inline u8 zw_key_level(u64 scanned)
{
	if (scanned <= SOCKCALLS_KEY_SAMPLE_MAX)
		return 0;
	u8 lg = 0; /* floor(log2(scanned)) */
#pragma unroll
	for (int b = 32; b > 0; b >>= 1) {
		if (scanned >> b) {
			scanned >>= b;
			lg += b;
		}
	}
	return lg > 2 ? lg - 2 : 0;
}

/* A header is complete: check it and set up its body. Returns 1 to stop. */
static __always_inline int zw_frame_begin(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	u8 f = st->flags;
	u64 size = st->acc;
	if (size >> SOCKCALLS_FRAME_MAX_BITS) {
		zw_stop(s, SOCKCALL_STOP_BAD_SIZE, 0);
		return 1;
	}
	w->frames++;
	st->size = size;
	st->left = size;
	st->phase = ZW_BODY;
	st->body = ZW_BODY_SKIP;
	u64 bound = 0;
	if (f & ZW_FLAG_COMMAND) {
		if ((f & ZW_FLAG_MORE) || st->frame_idx || size > ZW_COMMAND_MAX) {
			zw_stop(s, SOCKCALL_STOP_BAD_COMMAND, f);
			return 1;
		}
		bound = SOCKCALLS_COMMAND_COPY_MAX;
	} else if (st->frame_idx == 0) {
		bound = SOCKCALLS_META_COPY_MAX;
	} else if (st->frame_idx == 1 && size && !(size & 7)) {
		u64 nkeys = size >> 3;
		st->body = ZW_BODY_KEYS;
		st->key_stride = nkeys > ZW_SCAN_KEYS ? (u32)(nkeys / ZW_SCAN_BLOCKS) : 0;
		st->key_level = zw_key_level(nkeys > ZW_SCAN_KEYS ? ZW_SCAN_KEYS : nkeys);
	}
	if (bound) {
		st->body = ZW_BODY_COPY;
		st->copy_left = size < bound ? size : bound;
		if (size > bound)
			w->truncated++;
	}
	if (size == 0)
		zw_frame_end(s);
	return 0;
}

/* Greeting bytes: copied, and checked where they say what the stream is. */
static __always_inline int zw_greeting(struct zw_scratch *s, u64 addr, u64 avail)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	u64 g0 = ZW_GREETING_BYTES - st->left; /* greeting offset of addr */
	u64 n = avail < st->left ? avail : st->left;
	if (n == 0 || n > ZW_GREETING_BYTES || g0 >= ZW_GREETING_BYTES)
		return 1;
	if (bpf_probe_read_user(w->win, n, (void *)addr)) {
		zw_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 1;
	}
	int bad = 0;
	/* signature 0xFF ... 0x7F, version >= 3, mechanism (bytes 12..17) */
#pragma unroll
	for (int p = 0; p < 18; p++) {
		if (p == 0 || p == 9 || p == 10 || p >= 12) {
			if (p >= g0 && p < g0 + n) {
				u8 b = ((u8 *)w->win)[(p - g0) & (ZW_GREETING_BYTES - 1)];
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
		zw_stop(s, SOCKCALL_STOP_NOT_ZMTP, 0);
		return 1;
	}
	zw_copy_kernel(s, w->pos, w->win, n, SOCKCALL_BYTES_GREETING);
	zw_advance(w, n);
	st->left -= n;
	if (st->left)
		return 0;
	/* "NULL" and "PLAIN" (zero padded) leave frames in clear; CURVE does not */
	if (st->acc != 0x00004C4C554EULL && st->acc != 0x004E49414C50ULL) {
		zw_stop(s, SOCKCALL_STOP_OPAQUE, 0);
		return 1;
	}
	st->phase = ZW_HEADER;
	st->hdr_have = 0;
	st->frame_idx = 0;
	return 0;
}

/* A frame header, or the part of it this stretch holds. */
static __always_inline int zw_header(struct zw_scratch *s, u64 addr, u64 avail)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	u8 h[16] = {};
	u64 r = avail < 9 ? avail : 9;
	if (r == 0 || bpf_probe_read_user(h, r & 15, (void *)addr)) {
		zw_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 1;
	}
	u32 first = 0; /* index in h of the first size byte */
	if (st->hdr_have == 0) {
		u8 f = h[0];
		if (f & ZW_FLAGS_RESERVED) {
			zw_stop(s, SOCKCALL_STOP_BAD_FLAGS, f);
			return 1;
		}
		st->flags = f;
		st->acc = 0;
		st->hdr_have = 1;
		first = 1;
	}
	u32 hl = (st->flags & ZW_FLAG_LONG) ? 9 : 2;
	u32 take = hl - st->hdr_have;
	if (take > r - first)
		take = r - first;
#pragma unroll
	for (int k = 0; k < 9; k++) { /* k = 0: a call that begins inside the size */
		if (k >= first && k < first + take)
			st->acc = (st->acc << 8) | h[k];
	}
	u32 used = first + take;
	/* header bytes by direct stores: no helper call per frame */
	u32 at = zw_piece_at(s, w->pos, used);
	u8 *dst = &s->ev.payload[at];
#pragma unroll
	for (int k = 0; k < 9; k++) {
		if (k < used)
			dst[k] = h[k];
	}
	zw_piece_commit(s, w->pos, used, SOCKCALL_BYTES_HEADER);
	zw_advance(w, used);
	st->hdr_have += take;
	if (st->hdr_have < hl)
		return 0; /* the rest comes with the next call */
	st->hdr_have = 0;
	return zw_frame_begin(s);
}

/* Hash the w->scan_len bytes of keys in win[]. Branch-free: a key is kept
 * iff its hash has `level` leading zero bits; kept keys are packed into
 * keys[] (every key is written, the cursor only moves past kept ones). Its
 * inputs come from memory (volatile), so every path of the walk enters the
 * loop in the same verifier state and the loop is verified once per step,
 * not once per path. */
static __always_inline void zw_hash_block(struct zw_walk *w)
{
	u64 len = w->scan_len;
	u64 shift = 63 - w->st.key_level; /* (h >> 1) >> shift == h >> (64 - level); 0 for level 0 */
	u64 mask = 0, kept = 0;
	for (int t = 0; t < ZW_BLOCK_BYTES / 8; t++) {
		if (t * 8 >= len)
			break;
		u64 key = w->win[t];
		u64 v = (zw_key_hash(key) >> 1) >> (shift & 63);
		u64 hit = (v - 1) >> 63; /* v == 0 */
		w->keys[kept & 63] = key;
		kept += hit;
		mask |= hit << t;
	}
	/* through memory: the loop leaves at any of 64 iterations with its own
	 * range of `kept`, and the code after it would be verified for each */
	w->scan_mask = mask;
	w->scan_kept = kept;
}

/* Keys of frame 1 in this stretch: hash the whole keys inside the current
 * scan block, and write the sampled ones as one KEYS item. Returns the bytes
 * the step covers. */
static __always_inline u64 zw_keys(struct zw_scratch *s, u64 addr, u64 n)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	u64 fpos = st->size - st->left; /* frame offset of addr */
	u64 hi = st->size;              /* end of the scan block holding fpos */
	if (st->key_stride) {
		/* ZW_SCAN_BLOCKS blocks of 64 keys spread evenly over the frame:
		 * the same keys for the sender and the receiver, whatever their
		 * calls' boundaries */
		u64 stride = (u64)st->key_stride << 3;
		u64 j = fpos / stride;
		if (j >= ZW_SCAN_BLOCKS)
			return n;
		u64 lo = j * stride;
		hi = lo + ZW_BLOCK_BYTES;
		if (fpos >= hi) {
			if (j + 1 >= ZW_SCAN_BLOCKS)
				return n;
			u64 next = lo + stride;
			return next - fpos < n ? next - fpos : n;
		}
	}
	u64 m = hi - fpos < n ? hi - fpos : n;
	if (m > ZW_BLOCK_BYTES)
		m = ZW_BLOCK_BYTES;
	/* whole keys inside [fpos, fpos + m): a key split across calls is not hashed */
	u64 a = (fpos + 7) & ~7ULL, b = (fpos + m) & ~7ULL;
	if (b <= a)
		return m;
	u64 skip = a - fpos, len = b - a;
	asm volatile("" : "+r"(len));
	if (skip > 7 || len > ZW_BLOCK_BYTES || len == 0)
		return m;
	if (bpf_probe_read_user(w->win, len, (void *)(addr + skip))) {
		zw_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 0;
	}
	w->scan_len = len;
	w->scan_skip = skip;
	w->scan_m = m;
	zw_hash_block(w);
	u64 mask = w->scan_mask, kept = w->scan_kept;
	len = w->scan_len & (ZW_BLOCK_BYTES * 2 - 1);
	skip = w->scan_skip & 7;
	m = w->scan_m;
	u64 room = SOCKCALLS_KEY_SAMPLE_MAX - st->key_samples;
	if (room > SOCKCALLS_KEY_SAMPLE_MAX)
		room = 0;
	u64 count = kept < room ? kept : room;
	if (count > 64)
		count = 64;
	u32 body = sizeof(struct sockcall_keys) + count * 8;
	u32 at = zw_room(s, ZW_ITEM_HDR + body);
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->kind = SOCKCALL_ITEM_KEYS;
	it->what = 0;
	it->len = body;
	it->call_off = (u32)(w->pos + skip);
	struct sockcall_keys *k = (struct sockcall_keys *)&s->ev.payload[at + ZW_ITEM_HDR];
	k->scanned_bytes = (u32)len;
	k->level = st->key_level;
	k->count = (u8)count;
	k->_pad = 0;
	k->mask = mask;
	if (count)
		bpf_probe_read_kernel(&s->ev.payload[at + ZW_ITEM_HDR + sizeof(struct sockcall_keys)],
				      (count * 8) & (ZW_BLOCK_BYTES * 2 - 1), w->keys);
	s->w.data_pos = at + ZW_ITEM_HDR + (body & (ZW_ITEM_MAX * 16 - 1));
	s->w.has_piece = 0;
	st->key_samples += count;
	w->key_samples += count;
	return m;
}

/* A stretch of a frame body. */
static __always_inline int zw_body(struct zw_scratch *s, u64 addr, u64 avail)
{
	struct zw_walk *w = &s->w;
	struct zw_state *st = &w->st;
	u64 n = avail < st->left ? avail : st->left;
	if (st->body == ZW_BODY_COPY && st->copy_left) {
		u64 c = n < st->copy_left ? n : st->copy_left;
		if (c > ZW_PIECE_MAX)
			c = ZW_PIECE_MAX;
		if (zw_copy_user(s, w->pos, addr, c, SOCKCALL_BYTES_BODY)) {
			zw_stop(s, SOCKCALL_STOP_FAULT, 0);
			return 1;
		}
		st->copy_left -= c;
		n = c;
	} else if (st->body == ZW_BODY_KEYS) {
		n = zw_keys(s, addr, n);
		if (w->stopped)
			return 1;
	}
	zw_advance(w, n);
	st->left -= n;
	if (!st->left)
		zw_frame_end(s);
	return 0;
}

/* Where the next bytes are: their address and how many are contiguous
 * (returns 0), or 1 when the walk cannot go on. */
static __always_inline int zw_next(struct zw_scratch *s, u64 *addr, u64 *avail)
{
	struct zw_walk *w = &s->w;
	if (w->stopped || w->pos >= w->total)
		return 1;
	u32 i = w->iov_i;
	if (i >= w->niov || i >= ZW_IOV_MAX) {
		zw_stop(s, SOCKCALL_STOP_IOV, 0);
		return 1;
	}
	struct user_iovec *v = &w->iov[i & (ZW_IOV_MAX - 1)];
	if (w->iov_off >= v->len) {
		w->iov_i = i + 1;
		w->iov_off = 0;
		*avail = 0;
		return 0;
	}
	u64 n = v->len - w->iov_off;
	if (n > w->total - w->pos)
		n = w->total - w->pos;
	*addr = v->base + w->iov_off;
	*avail = n;
	return 0;
}

/* One step of the walk in frames. Returns 1 when there is nothing more to do. */
static __always_inline int zw_step(struct zw_scratch *s)
{
	u64 addr = 0, avail = 0;
	if (zw_next(s, &addr, &avail))
		return 1;
	if (!avail)
		return 0;
	switch (s->w.st.phase) {
	case ZW_HEADER:
		return zw_header(s, addr, avail);
	case ZW_BODY:
		return zw_body(s, addr, avail);
	default:
		return 1;
	}
}

/* The greeting: at most the connection's first call or two, so outside the
 * loop of zw_step (two stretches: the greeting may cross an iovec). */
static __always_inline void zw_greeting_steps(struct zw_scratch *s)
{
#pragma unroll
	for (int i = 0; i < 2; i++) {
		u64 addr = 0, avail = 0;
		if (s->w.st.phase != ZW_GREETING || zw_next(s, &addr, &avail))
			return;
		if (avail && zw_greeting(s, addr, avail))
			return;
	}
}

/* ---- per call ------------------------------------------------------------- */

static __always_inline int zw_synced(u8 phase)
{
	return phase == ZW_GREETING || phase == ZW_HEADER || phase == ZW_BODY;
}

#define ZW_GO 1   /* walk: tail-call the walker */
#define ZW_DONE 0 /* nothing to walk: finish now */
#define ZW_HUNT 2 /* unsynced: tail-call zw_hunt to look for a sync point */

/* Start walking an unsynced call at call offset `at`, a frame header. */
static __always_inline void zw_start_at(struct zw_scratch *s, u64 at, u8 how)
{
	struct zw_walk *w = &s->w;
	zw_seek(w, at);
	w->walk_from = at;
	w->st.phase = ZW_HEADER;
	w->st.hdr_have = 0;
	w->st.key_samples = 0;
	zw_mark(s, SOCKCALL_ITEM_WALK_START, how, 0);
}

/* Set up the walk of a call that moved `total` bytes starting at sequence
 * seq_start: the connection's state, continuity, sync hints. Writes the
 * items of the unsynced part. */
static __always_inline int zw_begin(struct zw_scratch *s, u64 sk, u8 call, u32 dir, u64 ptr, u64 len,
				    u64 total, u32 isn_next, int isn_known)
{
	struct zw_walk *w = &s->w;
	struct sockcall_event *ev = &s->ev;
	w->data_pos = 0;
	w->has_piece = 0;
	w->stopped = 0;
	w->stop_reason = 0;
	w->any_end = 0;
	w->n_ends = 0;
	w->ends_done = 0;
	w->frames = w->messages = w->key_samples = w->truncated = 0;
	w->hunt_from = w->h_at = w->h_rej_end = 0;
	w->h_tail_at = total;
	w->h_passes = 0;
	w->total = total;
	w->pos = 0;
	w->walk_from = 0;
	w->seq_start = ev->seq_start;
	w->key.sk = sk;
	w->key.dir = dir;
	w->key._pad = 0;
	zw_load_iovs(w, call, ptr, len, total);

	struct zw_state *known = sockcalls_walk.lookup(&w->key);
	if (known) {
		w->st = *known;
		if (zw_synced(w->st.phase) && w->st.next_seq != w->seq_start) {
			zw_mark(s, SOCKCALL_ITEM_WALK_END, SOCKCALL_STOP_STREAM_GAP, 0);
			zw_count(SOCKCALL_COUNTER_STREAM_GAPS, 1);
			w->st.phase = ZW_UNSYNCED;
			w->st.hdr_have = 0;
		}
	} else {
		__builtin_memset(&w->st, 0, sizeof(w->st));
		w->st.phase = ZW_UNSYNCED;
		if (isn_known && w->seq_start == isn_next) {
			w->st.phase = ZW_GREETING;
			w->st.left = ZW_GREETING_BYTES;
		}
	}
	w->st.next_seq = w->seq_start + (u32)total;
	u8 phase = w->st.phase;
	if (zw_synced(phase)) {
		zw_mark(s, SOCKCALL_ITEM_WALK_START,
			phase == ZW_GREETING && w->st.left == ZW_GREETING_BYTES ? SOCKCALL_WALK_GREETING
										  : SOCKCALL_WALK_CONTINUE,
			0);
		return ZW_GO;
	}
	if (phase == ZW_OPAQUE)
		return ZW_DONE;
	/* Unsynced: a hint that this call reaches starts the walk there. */
	struct zw_hint *h = sockcalls_sync_hint.lookup(&w->key);
	u64 at = total;
	if (h) {
		s32 d = (s32)(h->seq - w->seq_start);
		if (d < 0) {
			sockcalls_sync_hint.delete(&w->key);
			zw_count(SOCKCALL_COUNTER_HINTS_STALE, 1);
		} else if ((u64)d < total) {
			at = (u64)d;
			w->st.frame_idx = h->frame_idx;
			sockcalls_sync_hint.delete(&w->key);
			zw_count(SOCKCALL_COUNTER_HINTS_APPLIED, 1);
		}
	}
	if (at >= total && phase == ZW_UNSYNCED)
		return ZW_HUNT; /* not for NOT_ZMTP: other protocols are not hunted in */
	zw_copy_raw(s, 0, at < SOCKCALLS_PREFIX_BYTES ? at : SOCKCALLS_PREFIX_BYTES, SOCKCALL_BYTES_PREFIX);
	if (at >= total)
		return ZW_DONE;
	zw_start_at(s, at, SOCKCALL_WALK_HINT);
	return ZW_GO;
}

/* ---- self-sync ------------------------------------------------------------
 * An unsynced call may show where frames are by itself: in a busy stream of
 * small messages, by the time user space has found sync the stream has moved
 * on and its hint is stale. Candidates: a short header of frame 0 (flags
 * 0x00 or 0x01, size >= 8) whose body starts with PBMeta's first tag (0x08),
 * searched for window by window (ZW_HUNT_WINDOW bytes a pass, at most
 * ZW_HUNT_PASSES passes a call) from the call's start, or from where the
 * walk met garbage; the bytes searched before the sync point are reported
 * (HUNTED item, past the raw prefix: user space counts them unparsed). One is taken when the chain of
 * frames from it (flags without reserved or COMMAND bits, at most 8 data
 * frames, every frame 0 a candidate again) completes ZW_HUNT_MESSAGES
 * messages inside the call, or completes one exactly at the call's end (a
 * call per message, as paced traffic sends and receives): random bytes
 * practically never do. A chain that runs past the call's end (a message
 * longer than a call) becomes a pending candidate: it predicts the sequence
 * of the next header, and later calls check the bytes there; after
 * ZW_HUNT_CONFIRM headers found where predicted, the walk starts at the last
 * one. (A user-space hint would do the same from outside, but by the time it
 * arrives the stream has passed a large frame's end.) Only the call's first
 * iovec is searched. */

/* Follow the chain of frames from call offset p (a header of frame idx0 of
 * its message) up to w->h_limit: ZW_CHAIN_*. Its position, frame index and
 * message count live in the walk context (volatile): registers would carry a
 * different value on every path and defeat the verifier's pruning. */
static __always_inline int zw_chain(struct zw_walk *w, u64 base, u64 p, u32 idx0)
{
	w->h_pos = p;
	w->h_idx = idx0;
	w->h_msgs = 0;
	for (int k = 0; k < ZW_HUNT_FRAMES; k++) {
		u64 pos = w->h_pos;
		u64 limit = w->h_limit;
		if (pos >= limit)
			/* the next header is in a later call (only when the iovec
			 * searched holds the whole call: else it may be in this one) */
			return limit == w->total ? ZW_CHAIN_AHEAD : ZW_CHAIN_BAD;
		if (pos + 3 > limit)
			return limit == w->total ? ZW_CHAIN_CUT : ZW_CHAIN_BAD; /* cannot tell */
		u8 h[16] = {};
		u64 r = limit - pos;
		if (r > 10)
			r = 10;
		if (bpf_probe_read_user(h, r & 15, (void *)(base + pos)))
			return ZW_CHAIN_BAD;
		u8 f = h[0];
		if (f & ~(ZW_FLAG_MORE | ZW_FLAG_LONG))
			return ZW_CHAIN_BAD;
		u64 size = h[1], hl = 2;
		if (f & ZW_FLAG_LONG) {
			if (r < 9)
				return ZW_CHAIN_BAD;
			size = ((u64)h[1] << 56) | ((u64)h[2] << 48) | ((u64)h[3] << 40) | ((u64)h[4] << 32) |
			       ((u64)h[5] << 24) | ((u64)h[6] << 16) | ((u64)h[7] << 8) | h[8];
			hl = 9;
		}
		u32 idx = w->h_idx;
		if (idx == 0) {
			if ((f & ZW_FLAG_LONG) || size < ZW_META_MIN || h[2] != ZW_META_FIRST_BYTE)
				return ZW_CHAIN_BAD;
		} else if (idx > ZW_DATA_FRAMES_MAX) {
			return ZW_CHAIN_BAD;
		}
		if (size >> SOCKCALLS_FRAME_MAX_BITS)
			return ZW_CHAIN_BAD;
		w->h_pos = pos + hl + size;
		if (f & ZW_FLAG_MORE) {
			w->h_idx = idx + 1;
		} else {
			w->h_idx = 0;
			w->h_msgs += 1;
			/* two messages; or one that ends exactly where the call ends
			 * (paced traffic: a call per message) */
			if (w->h_msgs >= ZW_HUNT_MESSAGES || w->h_pos == limit)
				return ZW_CHAIN_DONE;
		}
	}
	return ZW_CHAIN_BAD;
}

/* A chain that ran past the call's end becomes (or stays) the pending
 * candidate: where it predicts the next header. */
static __always_inline void zw_pend(struct zw_walk *w, u8 score)
{
	w->st.cand_seq = w->seq_start + (u32)w->h_pos;
	w->st.cand_idx = w->h_idx;
	w->st.cand_score = score;
}

/* One window of the hunt, [h_at, h_at + ZW_HUNT_WINDOW) of the call's first
 * iovec: the call offset where the call can be walked from, or w->total.
 * Moves h_at to the next window (h_limit: nothing left to search) and
 * h_rej_end past what it searched and rejected. Bounds go through the
 * (volatile) walk context: a loop that breaks on a comparison with a
 * register narrows that register differently at every exit, and the
 * verifier would follow each exit separately. */
static __always_inline u64 zw_hunt_find(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
	w->h_limit = 0;
	if (w->niov == 0)
		return w->total;
	u64 limit = w->iov[0].len < w->total ? w->iov[0].len : w->total;
	w->h_limit = limit;
	u64 from = w->h_at;
	if (from >= limit)
		return w->total;
	u64 n = limit - from < ZW_HUNT_WINDOW ? limit - from : ZW_HUNT_WINDOW;
	/* the window's last two bytes start no candidate (3 bytes each): the next window starts there */
	w->h_at = from + n < limit ? from + n - 2 : limit;
	asm volatile("" : "+r"(n));
	if (n < 3 || n > ZW_HUNT_WINDOW || bpf_probe_read_user(w->win, n, (void *)(w->iov[0].base + from))) {
		w->h_at = limit;
		return w->total;
	}
	w->h_n = n;
	u8 *b = (u8 *)w->win;
	w->n_cand = 0;
	for (int j = 0; j < ZW_HUNT_WINDOW - 2; j++) {
		if (j + 2 >= w->h_n)
			break;
		if (b[j] <= ZW_FLAG_MORE && b[j + 1] >= ZW_META_MIN && b[j + 2] == ZW_META_FIRST_BYTE) {
			u32 c = w->n_cand;
			if (c < ZW_HUNT_CANDIDATES) {
				w->cand[c & (ZW_HUNT_CANDIDATES - 1)] = from + j;
				w->n_cand = c + 1;
			}
		}
	}
	/* A candidate pending from earlier calls: is its predicted header here?
	 * (once per call, from its first byte: a desync inside the call cleared it) */
	u8 score = w->st.cand_score;
	if (score) {
		s32 d = (s32)(w->st.cand_seq - w->seq_start);
		if (d < 0) {
			w->st.cand_score = 0; /* calls in between were not seen */
		} else if ((u64)d >= w->total) {
			w->h_at = limit; /* a long frame: still ahead; its body is no garbage */
			return w->total;
		} else {
			int r = zw_chain(w, w->iov[0].base, (u64)d, w->st.cand_idx);
			if (r == ZW_CHAIN_BAD || r == ZW_CHAIN_CUT) {
				w->st.cand_score = 0;
			} else if (r == ZW_CHAIN_DONE || score + 1 >= ZW_HUNT_CONFIRM) {
				w->st.frame_idx = w->st.cand_idx;
				w->st.cand_score = 0;
				return (u64)d;
			} else {
				zw_pend(w, score + 1);
				w->h_at = limit;
				return w->total;
			}
		}
	}
	for (int c = 0; c < ZW_HUNT_CANDIDATES; c++) {
		if (c >= w->n_cand)
			break;
		u64 p = w->cand[c & (ZW_HUNT_CANDIDATES - 1)];
		int r = zw_chain(w, w->iov[0].base, p, 0);
		if (r == ZW_CHAIN_DONE) {
			w->st.frame_idx = 0;
			w->st.cand_score = 0;
			return p;
		}
		if (r == ZW_CHAIN_AHEAD && !w->st.cand_score) {
			/* plausible up to the call's end: a message, not garbage, from p on */
			zw_pend(w, 1);
			w->h_rej_end = p;
			w->h_tail_at = p;
			w->h_at = limit;
			return w->total;
		}
		if (r == ZW_CHAIN_CUT && p < w->h_tail_at)
			w->h_tail_at = p; /* may be a message whose rest the next call holds */
	}
	w->h_rej_end = w->h_at;
	return w->total;
}

/* The hunt is over: the raw bytes where it began (for user space), what it
 * searched and rejected beyond them (a HUNTED item: user space counts it
 * unparsed, not unread), and the walk from the sync point `at` if there is
 * one. Returns ZW_GO or ZW_DONE. */
static __always_inline int zw_hunt_end(struct zw_scratch *s, u64 at)
{
	struct zw_walk *w = &s->w;
	u64 from = w->hunt_from;
	u64 total = w->total;
	u64 end = at < total ? at : total;
	u64 rej = at < total ? at : w->h_rej_end;
	u64 pre = end - from < SOCKCALLS_PREFIX_BYTES ? end - from : SOCKCALLS_PREFIX_BYTES;
	if (end > from)
		zw_copy_raw(s, from, pre, from ? SOCKCALL_BYTES_RAW : SOCKCALL_BYTES_PREFIX);
	if (at >= total && rej > from) {
		/* No sync, something rejected: the call's end may hold the start of
		 * a message the next call completes (a candidate pending or cut by
		 * the call's end, or a header in its last bytes). Those bytes go out
		 * raw, not as hunted: user space joins them to the next call's
		 * prefix and parses that message. */
		u64 t = w->h_tail_at;
		if (total > ZW_HUNT_TAIL && t > total - ZW_HUNT_TAIL)
			t = total - ZW_HUNT_TAIL;
		if (t < from + pre)
			t = from + pre;
		u64 n = total - t < SOCKCALLS_PREFIX_BYTES ? total - t : SOCKCALLS_PREFIX_BYTES;
		/* only the first iovec is hunted in (one read, no loop over iovecs here: the verifier) */
		if (t < total && t + n <= w->h_limit)
			zw_copy_user(s, t, w->iov[0].base + t, n, SOCKCALL_BYTES_RAW);
		if (rej > t)
			rej = t;
	}
	/* the raw prefix is not part of it: user space judges those bytes itself */
	from += pre;
	if (rej > from && rej <= total) {
		struct sockcall_hunted *h =
			(struct sockcall_hunted *)zw_item(s, SOCKCALL_ITEM_HUNTED, 0, sizeof(struct sockcall_hunted), from);
		h->bytes = (u32)(rej - from);
		h->_pad = 0;
		zw_count(SOCKCALL_COUNTER_HUNTED_BYTES, rej - from);
	}
	if (at >= total)
		return ZW_DONE;
	zw_start_at(s, at, SOCKCALL_WALK_SELF);
	zw_count(SOCKCALL_COUNTER_SELF_SYNCS, 1);
	return ZW_GO;
}

/* One pass of the hunt of an unsynced call (or of the rest of a call whose
 * walk lost sync): ZW_HUNT (search the next window: tail-call the hunt
 * again) or ZW_DONE (h_found says where it ended: zw_hunt_end, in a program
 * of its own, for the verifier's budget). */
static __always_inline int zw_hunt(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
	u64 at = zw_hunt_find(s);
	w->h_found = at;
	if (at >= w->total && w->h_at < w->h_limit && w->h_passes + 1 < ZW_HUNT_PASSES) {
		w->h_passes += 1;
		return ZW_HUNT;
	}
	return ZW_DONE;
}

/* The walk stopped at a header that cannot be one (garbage) with bytes of
 * the call left: the rest of the call is hunted in, so a stream that
 * carries garbage and then frames again is followed from the first chain
 * of frames after it, not from the next call on. Returns 1 when a hunt is
 * set up (the caller tail-calls it). */
static __always_inline int zw_lost_sync(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
	u8 r = w->stop_reason;
	if (r != SOCKCALL_STOP_BAD_FLAGS && r != SOCKCALL_STOP_BAD_SIZE && r != SOCKCALL_STOP_BAD_COMMAND)
		return 0;
	if (w->pos >= w->total)
		return 0;
	zw_write_stop(s, 0);
	w->stopped = 0;
	w->stop_reason = 0;
	zw_count(SOCKCALL_COUNTER_WALK_BYTES, w->pos - w->walk_from);
	w->walk_from = w->pos;
	w->hunt_from = w->h_at = w->h_rej_end = w->pos;
	w->h_tail_at = w->total;
	w->h_passes = 0;
	return 1;
}

/* Netstack lookups (rings.bpf.h) for the next SOCKCALLS_ENDS_PER_PASS
 * message ends of the call: a send registers each end, a receive asks for
 * its stage times (an RX_TIMES item). Returns 1 while ends remain. One loop
 * per direction, each verified with only its own lookup inside (a lookup
 * costs the verifier tens of thousands of instructions). */
static __always_inline int zw_ends_lookup(struct zw_scratch *s)
{
#ifdef NETSTACK_LOADED
	struct zw_walk *w = &s->w;
	u32 n = w->n_ends < ZW_ENDS_MAX ? w->n_ends : ZW_ENDS_MAX;
	u32 done = w->ends_done;
	if (w->key.dir == ZW_DIR_TX) {
		/* msg_id: the message's index on this direction of the connection,
		 * as in its MSG_END item */
		u64 first = w->st.msg_count - w->n_ends;
		for (int i = 0; i < SOCKCALLS_ENDS_PER_PASS; i++) {
			u32 e = done + i;
			if (e >= n)
				break;
			ns_tx_expect_end(w->key.sk, w->seq_start + w->ends[e & (ZW_ENDS_MAX - 1)], first + e);
		}
	} else {
		for (int i = 0; i < SOCKCALLS_ENDS_PER_PASS; i++) {
			u32 e = done + i;
			if (e >= n)
				break;
			u32 off = w->ends[e & (ZW_ENDS_MAX - 1)];
			struct ns_rx_times *t = (struct ns_rx_times *)zw_item(
				s, SOCKCALL_ITEM_RX_TIMES, 0, sizeof(struct ns_rx_times), off);
			ns_rx_lookup_end(w->key.sk, w->seq_start + off, t);
		}
	}
	done += SOCKCALLS_ENDS_PER_PASS;
	w->ends_done = done;
	return done < n;
#else
	return 0;
#endif
}

/* The call is walked (and zw_write_stop done): per-call netstack state, counters, connection state,
 * the last record. */
static __always_inline void zw_finish(struct zw_scratch *s)
{
	struct zw_walk *w = &s->w;
#ifdef NETSTACK_LOADED
	if (w->any_end) {
		if (w->key.dir == ZW_DIR_TX)
			ns_window_state(w->key.sk, (struct ns_window *)zw_item(s, SOCKCALL_ITEM_WINDOW, 0,
									      sizeof(struct ns_window), w->total));
		else
			ns_thread_sched(s->ev.tid, (struct ns_sched *)zw_item(s, SOCKCALL_ITEM_SCHED, 0,
									     sizeof(struct ns_sched), w->total));
	}
#endif
	zw_count(SOCKCALL_COUNTER_WALK_BYTES, w->pos - w->walk_from);
	zw_count(SOCKCALL_COUNTER_FRAMES, w->frames);
	zw_count(SOCKCALL_COUNTER_MESSAGES, w->messages);
	zw_count(SOCKCALL_COUNTER_KEY_SAMPLES, w->key_samples);
	zw_count(SOCKCALL_COUNTER_TRUNCATED, w->truncated);
	struct zw_state *known = sockcalls_walk.lookup(&w->key);
	if (known)
		*known = w->st;
	else if (sockcalls_walk.insert(&w->key, &w->st) == 0)
		zw_count(SOCKCALL_COUNTER_WALKS_MADE, 1);
	else /* made meanwhile on another CPU */
		sockcalls_walk.update(&w->key, &w->st);
	zw_emit(s, 0);
}

#endif /* PSLAT_ZMTP_WALK_BPF_H */
