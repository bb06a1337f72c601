/* walk_engine.bpf.h: the sockcalls probe's in-kernel stream walker, the
 * engine: it knows no protocol. A framing (zmtp_framing.bpf.h, ...) says
 * what a protocol's bytes are; framings.bpf.h dispatches to them and defines
 * one set of walk programs per protocol. docs/kernel-walker.md says how to
 * add one.
 *
 * DESIGN.md "Matching", Payload: frameworks batch many messages into one send
 * or recv, so headers sit anywhere in a call's bytes, and frames straddle
 * calls. The walker runs at syscall exit over the bytes the call moved (the
 * user buffer still holds them then, for sends and receives), keeping per
 * connection and direction where it is in the stream: a preface, a header
 * (possibly split across calls), a body (bytes left), the frame's index in
 * its message and the framing's notes. It copies out only what the framing
 * asks for (headers, bounded bodies, a hash-chosen sample of uint64 keys:
 * never the first n: parameter servers send keys sorted) and says where every message
 * ended (its TCP sequence). Everything else in a walked range is inside a
 * body that user space skips. The items it writes are described in events.h.
 *
 * Sync: a connection whose first byte the walker sees (seq_start ==
 * ISN + 1) is walked from its first byte. One joined mid-stream is unsynced:
 * its calls carry a raw prefix until
 *  - the walker finds sync by itself (self-sync, below): a framing's message
 *    start candidate beginning a chain of frames that completes two messages
 *    inside one call, or one message ending exactly at the call's end, or
 *    whose predicted headers later calls confirm (messages longer than a
 *    call); or
 *  - user space (the protocol's parser, which resynchronises on a chain of
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
 * walk program to itself (the kernel allows 33 per event, shared by every
 * program of the chain): a call with more frames than that budget stops the
 * walk (counted: walk_budget; the connection is unsynced and the next call
 * hunts). Programs, per protocol P (framings.bpf.h; slots WK_SLOT(P, kind)
 * of sockcalls_progs): sc_exit sets up the call (wk_begin) and tail-calls
 * P_walk (synced) or P_hunt (unsynced, no hint); P_hunt searches a window
 * per pass and tail-calls itself, then P_hunt_end, which tail-calls P_walk
 * from the sync point; P_walk tail-calls itself while bytes remain, P_hunt
 * when it meets garbage, then walk_ends (shared) for the netstack lookups of
 * the message ends it saw (SOCKCALLS_ENDS_PER_PASS per pass). Each program is
 * compiled with its protocol as a constant (the fr_* dispatch folds to that
 * framing's code alone) and verified separately.
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
#ifndef PSLAT_WALK_ENGINE_BPF_H
#define PSLAT_WALK_ENGINE_BPF_H

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

struct wk_scratch;
struct wk_walk;
/* The framing interface (framings.bpf.h): `proto` is SOCKCALL_PROTO_*, a
 * compile-time constant in every caller, so each walk program holds one
 * framing's code. A framing with no preface says 0 bytes. */
static __always_inline int
fr_default_proto(void);                 /* the hunter of a connection joined mid-stream, not classified yet */
static __always_inline int
fr_classify(const u8 *b, u32 n);        /* the framing of a stream whose first n (<= 4) bytes are b; NONE: no framing's */
static __always_inline u32
fr_preface_bytes(int proto);             /* bytes of the preface a connection starts with */
static __always_inline int
fr_preface(struct wk_scratch *s, int proto, u64 addr, u64 avail); /* preface bytes at the cursor; 1: stop */
static __always_inline int
fr_header(struct wk_scratch *s, int proto, u64 addr, u64 avail);  /* (part of) a header at the cursor; 1: stop */
static __always_inline void
fr_frame_end(struct wk_scratch *s, int proto);                    /* a body is done: next header, message end */
static __always_inline int
fr_samples_keys(int proto);             /* does the framing key-sample bodies (wk_body_keys)? */
static __always_inline u32
fr_cand_bytes(int proto);               /* bytes a self-sync candidate needs */
static __always_inline u32
fr_chain_read(int proto);               /* bytes a chain reads at each header (<= 16) */
static __always_inline int
fr_candidate(int proto, const u8 *b);   /* could a message start at b? */
static __always_inline int
fr_chain_frame(int proto, const u8 *h, u64 r, u32 idx, u64 *len); /* -1 bad, 0 more frames, 1 message end */

#define WK_IOV_MAX 32      /* room for iovecs: a window of SOCKCALLS_IOV_WINDOW <= this */
#define WK_PIECE_MAX 512   /* bytes copied by one step */
#define WK_BLOCK_BYTES 512 /* keys hashed by one step (64 keys) */
#define WK_ITEM_HDR 8      /* sizeof(struct sockcall_item) */
#define WK_ITEM_MAX 64     /* largest fixed-size item body (struct ns_sched: 48) */
#define WK_ENDS_MAX 256    /* message ends of one call kept for the netstack lookups */
#define WK_FROM_CUT 0xFFFF /* msg_from: the message's items began in a record of the call already sent */
#define WK_DIR_TX 0
#define WK_DIR_RX 1

/* Tail-call slots of sockcalls_progs: the shared netstack lookups at 0, the
 * programs of protocol P (SOCKCALL_PROTO_*, from 1) at WK_SLOT(P, kind). */
#define WK_SLOT_ENDS 0
#define WK_SLOT_MSGS 1 /* the message records (SOCKCALLS_MSG_RECORDS), shared too */
#define WK_PROG_WALK 0
#define WK_PROG_HUNT 1
#define WK_PROG_HUNT_END 2
#define WK_SLOT(proto, kind) ((proto) * 4 + (kind))
#define WK_SLOTS WK_SLOT(SOCKCALL_PROTO_MAX + 1, 0)

/* self-sync of an unsynced call (wk_hunt_find) */
#define WK_HUNT_WINDOW 512   /* bytes searched for candidates per hunting pass (win[] holds them) */
#define WK_HUNT_PASSES 16    /* passes (tail calls) per call at most: ~8 KiB searched, the rest left unread */
#define WK_HUNT_CANDIDATES 4 /* candidates followed per window */
#define WK_HUNT_FRAMES 24    /* headers followed per candidate */
#define WK_HUNT_MESSAGES 2   /* messages a candidate's chain must complete inside the call */
#define WK_HUNT_CONFIRM 3    /* headers a chain across calls must predict and find before the walk starts */
/* wk_chain: what a chain of frames did */
#define WK_CHAIN_BAD 0   /* met bytes that are no frame header (or could not tell) */
#define WK_CHAIN_DONE 1  /* completed the messages that prove it */
#define WK_CHAIN_AHEAD 2 /* plausible up to the call's end; its next header is at h_pos, frame h_idx */
#define WK_CHAIN_CUT 3   /* plausible up to a header split by the call's end */

#if SOCKCALLS_IOV_WINDOW > WK_IOV_MAX
#error "SOCKCALLS_IOV_WINDOW is larger than the walker's iovec room"
#endif
#if SOCKCALLS_META_COPY_MAX > WK_PIECE_MAX * 4 || SOCKCALLS_COMMAND_COPY_MAX > WK_PIECE_MAX * 4
#error "copy bounds above what the walker supports"
#endif
/* keys frames are hashed in up to SOCKCALLS_KEY_SCAN_BLOCKS blocks of 64 keys */
#define WK_SCAN_BLOCKS SOCKCALLS_KEY_SCAN_BLOCKS
#define WK_SCAN_KEYS (SOCKCALLS_KEY_SCAN_BLOCKS * (WK_BLOCK_BYTES / 8))

enum wk_phase {
	WK_UNSYNCED = 0, /* position in the stream unknown: raw prefixes, waiting for a hint */
	WK_PREFACE = 1,  /* inside the connection's preface (left: bytes to go) */
	WK_HEADER = 2,   /* at (or inside, hdr_have > 0) a frame header */
	WK_BODY = 3,     /* inside a frame body (left: bytes to go) */
	WK_NOT_PROTO = 4, /* the connection began with something else: unsynced for good, unless hinted */
	WK_OPAQUE = 5,   /* the preface says the frames are encrypted: nothing to walk */
};

enum wk_body {
	WK_BODY_SKIP = 0,
	WK_BODY_COPY = 1, /* copy up to copy_left bytes (wk_body_copy) */
	WK_BODY_KEYS = 2, /* uint64 keys: hash them in the scan blocks (wk_body_keys) */
};

/* User-space ABI (LP64), not kernel structs: struct iovec and the fields of
 * struct user_msghdr we read. These never change. */
struct user_iovec {
	u64 base;
	u64 len;
};
#define USER_MSGHDR_IOV_OFF 16
#define USER_MSGHDR_IOVLEN_OFF 24

struct wk_key {
	u64 sk;
	u32 dir; /* WK_DIR_* */
	u32 _pad;
};

/* Where one direction of a connection is: kept between calls. */
struct wk_state {
	u64 left;       /* bytes to go in the frame body (or preface) */
	u64 size;       /* the frame body's size */
	u64 acc;        /* the framing's: e.g. header size bytes gathered so far, preface bytes it checks */
	u64 msg_count;  /* messages ended since the walk began */
	u32 next_seq;   /* where the next call must start for the walk to go on */
	u32 frame_idx;  /* index of the current frame in its message */
	u32 copy_left;  /* COPY: bytes still to copy */
	u32 key_stride; /* KEYS: keys from one scan block to the next; 0: scan all */
	volatile u16 key_samples; /* keys sampled in this message (volatile: see wk_walk) */
	u8 phase;       /* enum wk_phase */
	u8 body;        /* enum wk_body */
	u8 flags;       /* the framing's: e.g. the current frame's flags */
	u8 hdr_have;    /* header bytes read so far */
	u8 key_level;   /* KEYS: sampling level (events.h, struct sockcall_keys) */
	u8 cand_score;  /* unsynced: frame headers a pending candidate predicted and found; 0: none */
	u32 cand_seq;   /* ... where it predicts the next header */
	u32 cand_idx;   /* ... and that header's frame index */
	u8 proto;       /* SOCKCALL_PROTO_*: the framing this direction is walked with */
	u8 msg_aux;     /* the framing's, per message, set at its frame 0 (0 where the walk
	                 * joins a message past it): e.g. where the message's meta frame is */
	u8 _pad[6];
};

/* A sync hint from user space (probes/sockcalls.py set_sync_hint). */
struct wk_hint {
	u32 seq;        /* a frame header starts at this sequence number */
	u16 frame_idx;  /* the index of that frame in its message */
	u8 proto;       /* SOCKCALL_PROTO_*: the framing user space found the stream in (NONE: keep the walker's) */
	u8 flags;       /* WK_HINT_* */
};
/* User space found the direction in no protocol the walker frames (a stream
 * joined mid-stream that its parsers did not recognise): count its calls
 * only from now on, as a connection whose first bytes were no framing's. */
#define WK_HINT_COUNT_ONLY 1

/* The walk of one call, shared by sc_exit and the tail-called programs. */
struct wk_walk {
	struct wk_state st;
	struct wk_key key;
	/* The call's iovecs are read a window at a time (SOCKCALLS_IOV_WINDOW; a
	 * step reads the next one): iov[0..niov) are the call's iovecs
	 * iov_first.., the first of them at call offset win_off. */
	struct user_iovec iov[WK_IOV_MAX];
	u64 iov_ptr;        /* the call's iovec array (user memory) */
	volatile u64 win_off;
	volatile u32 iov_first;
	volatile u32 iov_count; /* the call's iovecs, up to SOCKCALLS_IOV_WALK_MAX */
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
	u32 n_ends;     /* message ends of this call (the first WK_ENDS_MAX are kept) */
	u32 ends_done;  /* of them, looked up in the netstack rings */
	u32 ends[WK_ENDS_MAX]; /* their call offsets */
	/* The message records (SOCKCALLS_MSG_RECORDS): each end's slice of the
	 * payload, [from, to) as from | to << 16 (from WK_FROM_CUT: it began in a
	 * record already sent), and which record of the call its end is in
	 * (flushes then: a later flush sent it). */
	u32 end_span[WK_ENDS_MAX];
	u8 end_gen[WK_ENDS_MAX];
	u32 msg_from;          /* payload offset where the next message's items begin */
	u32 msg_from_gen;      /* flushes when msg_from was set */
	u32 flushes;           /* records of this call sent so far (wk_emit, continued) */
	u32 rx_base;           /* payload offset of the first end's RX_TIMES item (walk_ends) */
	u32 rx_gen;            /* flushes when walk_ends began */
	u32 msgs_done;         /* ends that have had their record (or were given up) */
	u32 msgs_out;          /* records sent for this call */
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
	u64 win[WK_BLOCK_BYTES / 8 + 2];  /* user bytes being looked at (preface, hunt window, keys) */
	u64 keys[WK_BLOCK_BYTES / 8 + 2]; /* sampled keys of a scan block, packed */
	volatile u64 scan_len, scan_skip, scan_m; /* wk_keys' values across wk_hash_block */
	volatile u64 scan_mask, scan_kept;        /* wk_hash_block's results */
	volatile u32 n_cand;                    /* wk_hunt_find: candidates found */
	u32 cand[WK_HUNT_CANDIDATES];
	volatile u64 h_pos;                     /* wk_chain: where the chain is */
	volatile u64 h_limit, h_n;              /* wk_hunt_find: bytes searched, candidates' window */
	volatile u32 h_idx, h_msgs;
	/* the hunt of this call, window by window (wk_hunt) */
	volatile u64 hunt_from;                 /* call offset where it began: 0, or where the walk lost sync */
	volatile u64 h_at;                      /* the next window's call offset */
	volatile u64 h_rej_end;                 /* bytes from hunt_from up to here were searched and rejected */
	volatile u64 h_tail_at;                 /* a candidate cut by the call's end: its bytes go out raw */
	volatile u32 h_passes;
	volatile u64 h_found;                   /* the hunt's result: the sync point, or total */
};

struct wk_scratch {
	struct sockcall_event ev;
	/* After payload[]: lets the verifier accept an item of up to
	 * WK_ITEM_HDR + WK_PIECE_MAX bytes at any offset below PAYLOAD_MAX. */
	u8 slack[WK_ITEM_HDR + WK_PIECE_MAX + WK_ITEM_MAX];
	struct wk_walk w;
};

BPF_PERCPU_ARRAY(sockcalls_scratch, struct wk_scratch, 1);
BPF_TABLE("lru_hash", struct wk_key, struct wk_state, sockcalls_walk, SOCKCALLS_WALK_CONNS_MAX);
/* LRU: a hint for a connection that closed before its next call is never
 * taken; with a plain hash such hints would fill the map for good. */
BPF_TABLE("lru_hash", struct wk_key, struct wk_hint, sockcalls_sync_hint, SOCKCALLS_HINTS_MAX);
BPF_PROG_ARRAY(sockcalls_progs, WK_SLOTS);
#if SOCKCALLS_MSG_RECORDS
BPF_RINGBUF_OUTPUT(sockcalls_msgs, SOCKCALLS_MSG_RING_PAGES);
#endif

static __always_inline void wk_count(int slot, u64 n)
{
	if (n)
		sc_add(slot, n);
}

static __always_inline struct wk_scratch *wk_scratch(void)
{
	int zero = 0;
	return sockcalls_scratch.lookup(&zero);
}

/* splitmix64's finalizer: the key hash of parsers/keysample.py. */
static __always_inline u64 wk_key_hash(u64 x)
{
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

/* ---- output ---------------------------------------------------------------- */

/* Send what the record holds and start a new one for the same call. */
static __always_inline void wk_emit(struct wk_scratch *s, int continued)
{
	struct sockcall_event *ev = &s->ev;
	u32 n = s->w.data_pos;
	if (n > SOCKCALL_PAYLOAD_MAX)
		n = SOCKCALL_PAYLOAD_MAX;
	ev->payload_bytes = n;
	if (continued) {
		ev->flags |= SOCKCALL_F_CONTINUED;
#if SOCKCALLS_MSG_RECORDS
		s->w.flushes++;
#endif
	} else {
		ev->flags &= ~SOCKCALL_F_CONTINUED;
	}
	wk_count(PSLAT_COUNTER_SEEN, 1);
	u64 size = offsetof(struct sockcall_event, payload) + n;
	/* keep the bound where the verifier sees it, next to the call */
	asm volatile("" : "+r"(size));
	if (size > sizeof(struct sockcall_event))
		size = sizeof(struct sockcall_event);
	if (sc_output(ev, size))
		wk_count(PSLAT_COUNTER_LOST, 1);
	s->w.data_pos = 0;
	s->w.has_piece = 0;
}

/* Room for `need` more payload bytes, or a flush first. Returns the payload
 * offset to write at, bounded for the verifier. */
static __always_inline u32 wk_room(struct wk_scratch *s, u32 need)
{
	if (s->w.data_pos + need > SOCKCALL_PAYLOAD_MAX)
		wk_emit(s, 1);
	return s->w.data_pos & (SOCKCALL_PAYLOAD_MAX - 1);
}

/* A fixed-size item: returns where its body goes (len <= WK_ITEM_MAX). */
static __always_inline u8 *wk_item(struct wk_scratch *s, u8 kind, u8 what, u32 len, u64 call_off)
{
	u32 at = wk_room(s, WK_ITEM_HDR + len);
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->kind = kind;
	it->what = what;
	it->len = len;
	it->call_off = (u32)call_off;
	s->w.data_pos = at + WK_ITEM_HDR + (len & (WK_ITEM_MAX * 2 - 1));
	s->w.has_piece = 0;
	return &s->ev.payload[at + WK_ITEM_HDR];
}

/* BYTES pieces are written in two steps so that a failed user read leaves
 * nothing behind: wk_piece_at() says where `len` bytes for call offset
 * `call_off` go (appending to the previous piece when it ends right there),
 * the caller copies them, wk_piece_commit() records them. */
static __always_inline u32 wk_piece_at(struct wk_scratch *s, u64 call_off, u32 len)
{
	struct wk_walk *w = &s->w;
	if (w->has_piece && w->piece_end == call_off && w->data_pos + len <= SOCKCALL_PAYLOAD_MAX)
		return w->data_pos & (SOCKCALL_PAYLOAD_MAX - 1);
	w->has_piece = 0;
	return wk_room(s, WK_ITEM_HDR + len) + WK_ITEM_HDR;
}

static __always_inline void wk_piece_commit(struct wk_scratch *s, u64 call_off, u32 len, u8 what)
{
	struct wk_walk *w = &s->w;
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
		w->data_pos = at + WK_ITEM_HDR;
		w->has_piece = 1;
	}
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->len += len;
	it->what |= what;
	w->data_pos += len;
	w->piece_end = call_off + len;
}

/* Copy `len` (1..WK_PIECE_MAX) bytes of user memory at `addr`, the call's
 * bytes at `call_off`. Returns 0, or -1 when the read failed. */
static __always_inline int wk_copy_user(struct wk_scratch *s, u64 call_off, u64 addr, u64 len, u8 what)
{
	/* The empty asm keeps clang from merging the check into the caller's
	 * clamps, which the verifier cannot follow (see copy_user history). */
	asm volatile("" : "+r"(len));
	if (len == 0 || len > WK_PIECE_MAX)
		return 0;
	u32 at = wk_piece_at(s, call_off, len);
	if (bpf_probe_read_user(&s->ev.payload[at], len, (void *)addr))
		return -1;
	wk_piece_commit(s, call_off, len, what);
	return 0;
}

/* The same from kernel memory we hold (the window). */
static __always_inline void wk_copy_kernel(struct wk_scratch *s, u64 call_off, void *src, u64 len, u8 what)
{
	asm volatile("" : "+r"(len));
	if (len == 0 || len > WK_PIECE_MAX)
		return;
	u32 at = wk_piece_at(s, call_off, len);
	bpf_probe_read_kernel(&s->ev.payload[at], len, src);
	wk_piece_commit(s, call_off, len, what);
}

/* ---- the call's bytes ------------------------------------------------------ */

/* Read the call's first window of iovecs (or make one of a plain buffer). */
static __always_inline void wk_load_iovs(struct wk_walk *w, u8 call, u64 ptr, u64 len, u64 total)
{
	w->iov_i = 0;
	w->iov_off = 0;
	w->niov = 0;
	w->iov_first = 0;
	w->iov_count = 0;
	w->win_off = 0;
	u64 iov = 0, n = 0;
	switch (call) {
	case SOCKCALL_READ:
	case SOCKCALL_WRITE:
	case SOCKCALL_RECVFROM:
	case SOCKCALL_SENDTO:
		w->iov[0].base = ptr;
		w->iov[0].len = total;
		w->niov = 1;
		w->iov_count = 1;
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
	w->iov_ptr = iov;
	w->iov_count = n;
	if (n > SOCKCALLS_IOV_WINDOW)
		n = SOCKCALLS_IOV_WINDOW;
	if (n == 0 || n > WK_IOV_MAX)
		return;
	if (bpf_probe_read_user(w->iov, n * sizeof(struct user_iovec), (void *)iov) == 0)
		w->niov = n;
	else
		w->iov_count = 0;
}

/* Move the walk to call offset `off` (>= win_off) in the window: its iovec
 * and the offset inside it; past the window's end, iov_i = niov and iov_off
 * the bytes beyond it (wk_next_window goes on from there). */
static __always_inline void wk_seek(struct wk_walk *w, u64 off)
{
	w->pos = off;
	w->iov_i = 0;
	off -= w->win_off;
#pragma unroll
	for (int i = 0; i < WK_IOV_MAX; i++) {
		if (i >= w->niov || i >= SOCKCALLS_IOV_WINDOW)
			break;
		u64 l = w->iov[i].len;
		if (off < l)
			break;
		off -= l;
		w->iov_i = i + 1;
	}
	w->iov_off = off;
}

/* Does the call have iovecs after this window? */
static __always_inline int wk_more_iovs(struct wk_walk *w)
{
	return w->iov_first + w->niov < w->iov_count;
}

/* Read the window after this one (iov_i = niov: the walk is past its last
 * iovec, iov_off bytes beyond its end). Returns 0 when there is none or the
 * read failed (then there is no window: the walk stops there, WALK_END IOV). */
static __always_inline int wk_read_window(struct wk_walk *w)
{
	if (!wk_more_iovs(w))
		return 0;
	u32 first = w->iov_first + w->niov;
	u64 n = w->iov_count - first;
	if (n > SOCKCALLS_IOV_WINDOW)
		n = SOCKCALLS_IOV_WINDOW;
	u64 end = w->pos - w->iov_off; /* the call offset where this window ended */
	asm volatile("" : "+r"(n));
	if (n == 0 || n > WK_IOV_MAX ||
	    bpf_probe_read_user(w->iov, n * sizeof(struct user_iovec), (void *)(w->iov_ptr + (u64)first * sizeof(struct user_iovec)))) {
		w->niov = 0;
		w->iov_count = 0;
		return 0;
	}
	w->iov_first = first;
	w->niov = n;
	w->win_off = end;
	return 1;
}

/* At the start of a walk pass: a cursor that a seek put beyond the window
 * (a sync point in a later iovec) moves on to the window that holds it. */
static __always_inline void wk_next_window(struct wk_walk *w)
{
	if (w->iov_i >= w->niov && wk_read_window(w))
		wk_seek(w, w->pos);
}

/* Raw bytes [from, from + len) of the call (len <= WK_PIECE_MAX), across
 * iovecs, for a stretch the walker does not follow. */
static __always_inline void wk_copy_raw(struct wk_scratch *s, u64 from, u64 len, u8 what)
{
	struct wk_walk *w = &s->w;
	if (from < w->win_off)
		return; /* before the window: not here */
	u64 skip = from - w->win_off;
	for (int i = 0; i < SOCKCALLS_IOV_WINDOW; i++) {
		if (i >= w->niov || len == 0)
			break;
		u64 l = w->iov[i & (WK_IOV_MAX - 1)].len;
		if (skip >= l) {
			skip -= l;
			continue;
		}
		u64 n = l - skip < len ? l - skip : len;
		if (wk_copy_user(s, from, w->iov[i & (WK_IOV_MAX - 1)].base + skip, n, what))
			return;
		from += n;
		len -= n;
		skip = 0;
	}
}

/* ---- walk marks ------------------------------------------------------------ */

static __always_inline void wk_mark(struct wk_scratch *s, u8 kind, u8 how, u16 detail)
{
	struct sockcall_walk_mark *m =
		(struct sockcall_walk_mark *)wk_item(s, kind, 0, sizeof(struct sockcall_walk_mark), s->w.pos);
	m->frame_idx = s->w.st.frame_idx;
	m->how = how;
	m->phase = s->w.st.phase;
	m->detail = detail;
}

/* Stop following frames at the current position. The WALK_END item and
 * the raw bytes after it (for user space to hunt in) are written by
 * wk_finish, once, outside the walk's loop (the verifier's cost of a loop
 * grows with the code inside it). */
static __always_inline void wk_stop(struct wk_scratch *s, u8 reason, u16 detail)
{
	struct wk_walk *w = &s->w;
	w->stop_reason = reason;
	w->stop_detail = detail;
	w->stop_phase = w->st.phase;
	w->stopped = 1;
}

/* Stop at bytes that cannot be the header the framing expects there: the
 * stream lost sync (counted; the rest of the call is hunted in). `reason` is
 * one of events.h's SOCKCALL_STOP_DESYNC reasons. (Said by the reason, not a
 * flag of its own: one more store per stop made clang lay out the walk loop
 * so that the verifier needed 20% more work for it, over its limit.) */
static __always_inline void wk_desync(struct wk_scratch *s, u8 reason, u16 detail)
{
	wk_stop(s, reason, detail);
}

/* The WALK_END of wk_stop, its raw bytes (unless a hunt follows: it copies
 * them), its counter, the new phase. */
static __always_inline void wk_write_stop(struct wk_scratch *s, int raw)
{
	struct wk_walk *w = &s->w;
	u8 reason = w->stop_reason;
	if (!reason)
		return;
	struct sockcall_walk_mark *m =
		(struct sockcall_walk_mark *)wk_item(s, SOCKCALL_ITEM_WALK_END, 0, sizeof(struct sockcall_walk_mark), w->pos);
	m->frame_idx = w->st.frame_idx;
	m->how = reason;
	m->phase = w->stop_phase;
	m->detail = w->stop_detail;
	u8 phase = WK_UNSYNCED;
	switch (reason) {
	case SOCKCALL_STOP_BAD_FLAGS: /* SOCKCALL_STOP_DESYNC */
	case SOCKCALL_STOP_BAD_SIZE:
	case SOCKCALL_STOP_BAD_COMMAND:
	case SOCKCALL_STOP_BAD_MAGIC:
		wk_count(SOCKCALL_COUNTER_DESYNCS, 1);
		break;
	case SOCKCALL_STOP_NOT_PROTOCOL:
		phase = WK_NOT_PROTO;
		wk_count(SOCKCALL_COUNTER_NOT_PROTOCOL, 1);
		break;
	case SOCKCALL_STOP_OPAQUE:
		phase = WK_OPAQUE;
		break;
	case SOCKCALL_STOP_BUDGET:
		wk_count(SOCKCALL_COUNTER_WALK_BUDGET, 1);
		wk_count(SOCKCALL_COUNTER_WALK_ABORTED, 1);
		break;
	case SOCKCALL_STOP_FAULT:
		s->ev.flags |= SOCKCALL_F_PAYLOAD_FAULT;
		/* fall through */
	default:
		wk_count(SOCKCALL_COUNTER_WALK_ABORTED, 1);
		break;
	}
	if (raw && phase != WK_OPAQUE && w->pos < w->total) {
		u64 n = w->total - w->pos;
		wk_copy_raw(s, w->pos, n < SOCKCALLS_PREFIX_BYTES ? n : SOCKCALLS_PREFIX_BYTES, SOCKCALL_BYTES_RAW);
	}
	w->st.phase = phase;
	w->st.hdr_have = 0;
	w->st.cand_score = 0;
}

/* ---- frames ---------------------------------------------------------------- */

static __always_inline void wk_advance(struct wk_walk *w, u64 n)
{
	w->pos += n;
	w->iov_off += n;
}

/* A message ended at the current position. */
static __always_inline void wk_message_end(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	struct sockcall_msg_end *m =
		(struct sockcall_msg_end *)wk_item(s, SOCKCALL_ITEM_MSG_END, 0, sizeof(struct sockcall_msg_end), w->pos);
	m->end_seq = w->seq_start + (u32)w->pos;
	m->frames = st->frame_idx + 1;
	m->msg_index = st->msg_count;
	u32 n = w->n_ends;
	if (n < WK_ENDS_MAX)
		w->ends[n & (WK_ENDS_MAX - 1)] = (u32)w->pos;
#if SOCKCALLS_MSG_RECORDS
	u32 to = w->data_pos; /* just past the MSG_END item */
	if (n < WK_ENDS_MAX) {
		u32 from = w->msg_from_gen == w->flushes ? w->msg_from : WK_FROM_CUT;
		w->end_span[n & (WK_ENDS_MAX - 1)] = from | (to << 16);
		w->end_gen[n & (WK_ENDS_MAX - 1)] = (u8)w->flushes;
	}
	w->msg_from = to;
	w->msg_from_gen = w->flushes;
#endif
	w->n_ends = n + 1;
	w->any_end = 1;
	w->messages++;
	st->msg_count++;
	st->frame_idx = 0;
	st->key_samples = 0;
}

/* Sampling level for a keys frame: every key of a small frame; otherwise
 * keys whose hash has `level` leading zero bits, level chosen so that 4 to 8
 * of the scanned keys are expected. Nested: a key kept at one level is kept
 * at every lower one. */
static __always_inline u8 wk_key_level(u64 scanned)
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

/* ---- what a framing asks of the engine at a header ------------------------- */

/* Header bytes the framing read at the cursor (h[0..used), used <= max, max
 * <= 16 a constant): copied out by direct stores (no helper call per frame),
 * the cursor moved past them. */
static __always_inline void wk_header_bytes(struct wk_scratch *s, const u8 *h, u32 used, const int max)
{
	struct wk_walk *w = &s->w;
	u32 at = wk_piece_at(s, w->pos, used);
	u8 *dst = &s->ev.payload[at];
#pragma unroll
	for (int k = 0; k < 16; k++) {
		if (k < max && k < used)
			dst[k] = h[k];
	}
	wk_piece_commit(s, w->pos, used, SOCKCALL_BYTES_HEADER);
	wk_advance(w, used);
}

/* A body of `size` bytes follows, skipped unless wk_body_copy/keys say otherwise. */
static __always_inline void wk_body_begin(struct wk_walk *w, u64 size)
{
	struct wk_state *st = &w->st;
	w->frames++;
	st->size = size;
	st->left = size;
	st->phase = WK_BODY;
	st->body = WK_BODY_SKIP;
}

/* ... its first `bound` bytes copied out, the rest skipped (a prefix by
 * design: not counted truncated); bound 0: none. */
static __always_inline void wk_body_prefix(struct wk_walk *w, u64 size, u64 bound)
{
	struct wk_state *st = &w->st;
	if (!bound)
		return;
	st->body = WK_BODY_COPY;
	st->copy_left = size < bound ? size : bound;
}

/* ... copied out whole, up to `bound` bytes (counted truncated when it is
 * longer); bound 0: none. */
static __always_inline void wk_body_copy(struct wk_walk *w, u64 size, u64 bound)
{
	wk_body_prefix(w, size, bound);
	if (bound && size > bound)
		w->truncated++;
}

/* ... it is `nkeys` uint64 keys (little-endian): sampled by hash in up to
 * WK_SCAN_BLOCKS blocks of 64 keys spread over it (wk_keys). */
static __always_inline void wk_body_keys(struct wk_state *st, u64 nkeys)
{
	st->body = WK_BODY_KEYS;
	st->key_stride = nkeys > WK_SCAN_KEYS ? (u32)(nkeys / WK_SCAN_BLOCKS) : 0;
	st->key_level = wk_key_level(nkeys > WK_SCAN_KEYS ? WK_SCAN_KEYS : nkeys);
}

/* Hash the w->scan_len bytes of keys in win[]. Branch-free: a key is kept
 * iff its hash has `level` leading zero bits; kept keys are packed into
 * keys[] (every key is written, the cursor only moves past kept ones). Its
 * inputs come from memory (volatile), so every path of the walk enters the
 * loop in the same verifier state and the loop is verified once per step,
 * not once per path. */
static __always_inline void wk_hash_block(struct wk_walk *w)
{
	u64 len = w->scan_len;
	u64 shift = 63 - w->st.key_level; /* (h >> 1) >> shift == h >> (64 - level); 0 for level 0 */
	u64 mask = 0, kept = 0;
	for (int t = 0; t < WK_BLOCK_BYTES / 8; t++) {
		if (t * 8 >= len)
			break;
		u64 key = w->win[t];
		u64 v = (wk_key_hash(key) >> 1) >> (shift & 63);
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
static __always_inline u64 wk_keys(struct wk_scratch *s, u64 addr, u64 n)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u64 fpos = st->size - st->left; /* frame offset of addr */
	u64 hi = st->size;              /* end of the scan block holding fpos */
	if (st->key_stride) {
		/* WK_SCAN_BLOCKS blocks of 64 keys spread evenly over the frame:
		 * the same keys for the sender and the receiver, whatever their
		 * calls' boundaries */
		u64 stride = (u64)st->key_stride << 3;
		u64 j = fpos / stride;
		if (j >= WK_SCAN_BLOCKS)
			return n;
		u64 lo = j * stride;
		hi = lo + WK_BLOCK_BYTES;
		if (fpos >= hi) {
			if (j + 1 >= WK_SCAN_BLOCKS)
				return n;
			u64 next = lo + stride;
			return next - fpos < n ? next - fpos : n;
		}
	}
	u64 m = hi - fpos < n ? hi - fpos : n;
	if (m > WK_BLOCK_BYTES)
		m = WK_BLOCK_BYTES;
	/* whole keys inside [fpos, fpos + m): a key split across calls is not hashed */
	u64 a = (fpos + 7) & ~7ULL, b = (fpos + m) & ~7ULL;
	if (b <= a)
		return m;
	u64 skip = a - fpos, len = b - a;
	asm volatile("" : "+r"(len));
	if (skip > 7 || len > WK_BLOCK_BYTES || len == 0)
		return m;
	if (bpf_probe_read_user(w->win, len, (void *)(addr + skip))) {
		wk_stop(s, SOCKCALL_STOP_FAULT, 0);
		return 0;
	}
	w->scan_len = len;
	w->scan_skip = skip;
	w->scan_m = m;
	wk_hash_block(w);
	u64 mask = w->scan_mask, kept = w->scan_kept;
	len = w->scan_len & (WK_BLOCK_BYTES * 2 - 1);
	skip = w->scan_skip & 7;
	m = w->scan_m;
	u64 room = SOCKCALLS_KEY_SAMPLE_MAX - st->key_samples;
	if (room > SOCKCALLS_KEY_SAMPLE_MAX)
		room = 0;
	u64 count = kept < room ? kept : room;
	if (count > 64)
		count = 64;
	u32 body = sizeof(struct sockcall_keys) + count * 8;
	u32 at = wk_room(s, WK_ITEM_HDR + body);
	struct sockcall_item *it = (struct sockcall_item *)&s->ev.payload[at];
	it->kind = SOCKCALL_ITEM_KEYS;
	it->what = 0;
	it->len = body;
	it->call_off = (u32)(w->pos + skip);
	struct sockcall_keys *k = (struct sockcall_keys *)&s->ev.payload[at + WK_ITEM_HDR];
	k->scanned_bytes = (u32)len;
	k->level = st->key_level;
	k->count = (u8)count;
	k->_pad = 0;
	k->mask = mask;
	if (count)
		bpf_probe_read_kernel(&s->ev.payload[at + WK_ITEM_HDR + sizeof(struct sockcall_keys)],
				      (count * 8) & (WK_BLOCK_BYTES * 2 - 1), w->keys);
	s->w.data_pos = at + WK_ITEM_HDR + (body & (WK_ITEM_MAX * 16 - 1));
	s->w.has_piece = 0;
	st->key_samples += count;
	w->key_samples += count;
	return m;
}

/* A stretch of a frame body. */
static __always_inline int wk_body(struct wk_scratch *s, const int proto, u64 addr, u64 avail)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u64 n = avail < st->left ? avail : st->left;
	if (st->body == WK_BODY_COPY && st->copy_left) {
		u64 c = n < st->copy_left ? n : st->copy_left;
		if (c > WK_PIECE_MAX)
			c = WK_PIECE_MAX;
		if (wk_copy_user(s, w->pos, addr, c, SOCKCALL_BYTES_BODY)) {
			wk_stop(s, SOCKCALL_STOP_FAULT, 0);
			return 1;
		}
		st->copy_left -= c;
		n = c;
	} else if (fr_samples_keys(proto) && st->body == WK_BODY_KEYS) {
		/* folded away for a framing that samples no keys: the key hashing is
		 * most of what the verifier walks in a pass */
		n = wk_keys(s, addr, n);
		if (w->stopped)
			return 1;
	}
	wk_advance(w, n);
	st->left -= n;
	if (!st->left)
		fr_frame_end(s, proto);
	return 0;
}

/* Where the next bytes are: their address and how many are contiguous
 * (returns 0), or 1 when the walk cannot go on. */
static __always_inline int wk_next(struct wk_scratch *s, u64 *addr, u64 *avail)
{
	struct wk_walk *w = &s->w;
	if (w->stopped || w->pos >= w->total)
		return 1;
	u32 i = w->iov_i;
	if (i >= w->niov || i >= WK_IOV_MAX) {
		/* the window's end, the cursor right after its last byte: the
		 * next window, its first iovec (a cursor a seek left beyond it
		 * waits for the next pass); else the call has more bytes than the
		 * iovecs the walker reads */
		if (w->iov_off == 0 && wk_read_window(w)) {
			w->iov_i = 0;
			*avail = 0;
			return 0;
		}
		if (!wk_more_iovs(w))
			wk_stop(s, SOCKCALL_STOP_IOV, 0);
		return 1;
	}
	struct user_iovec *v = &w->iov[i & (WK_IOV_MAX - 1)];
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
static __always_inline int wk_step(struct wk_scratch *s, const int proto)
{
	u64 addr = 0, avail = 0;
	if (wk_next(s, &addr, &avail))
		return 1;
	if (!avail)
		return 0;
	switch (s->w.st.phase) {
	case WK_HEADER:
		return fr_header(s, proto, addr, avail);
	case WK_BODY:
		return wk_body(s, proto, addr, avail);
	default:
		return 1;
	}
}

/* The preface: at most the connection's first call or two, so outside the
 * loop of wk_step (two stretches: the preface may cross an iovec). */
static __always_inline void wk_preface_steps(struct wk_scratch *s, const int proto)
{
	if (!fr_preface_bytes(proto))
		return;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		u64 addr = 0, avail = 0;
		if (s->w.st.phase != WK_PREFACE || wk_next(s, &addr, &avail))
			return;
		if (avail && fr_preface(s, proto, addr, avail))
			return;
	}
}

/* ---- per call ------------------------------------------------------------- */

static __always_inline int wk_synced(u8 phase)
{
	return phase == WK_PREFACE || phase == WK_HEADER || phase == WK_BODY;
}

#define WK_GO 1   /* walk: tail-call the walker */
#define WK_DONE 0 /* nothing to walk: finish now */
#define WK_HUNT 2 /* unsynced: tail-call wk_hunt to look for a sync point */

/* Start walking an unsynced call at call offset `at`, a frame header. */
static __always_inline void wk_start_at(struct wk_scratch *s, u64 at, u8 how)
{
	struct wk_walk *w = &s->w;
	wk_seek(w, at);
	w->walk_from = at;
	w->st.phase = WK_HEADER;
	w->st.hdr_have = 0;
	w->st.key_samples = 0;
	wk_mark(s, SOCKCALL_ITEM_WALK_START, how, w->st.proto);
}

/* A connection's first call: the framing its first bytes are (fr_classify)
 * and the phase its walk starts in; 1 when the walk starts here. 0: no
 * framing starts so, and the direction is not walked (phase NOT_PROTO, its
 * calls counted, nothing copied after this call's raw prefix: the signature
 * user space reports the connection by) unless a sync hint says otherwise. */
static __always_inline int wk_classify(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	struct wk_state *st = &w->st;
	u8 b[4] = {};
	u64 n = w->niov ? w->iov[0].len : 0;
	if (n > w->total)
		n = w->total;
	if (n > 4)
		n = 4;
	int proto = st->proto; /* an empty first iovec: its framing's preface will tell */
	if (n && bpf_probe_read_user(b, n, (void *)w->iov[0].base) == 0)
		proto = fr_classify(b, n);
	if (proto == SOCKCALL_PROTO_NONE) {
		st->phase = WK_NOT_PROTO;
		wk_mark(s, SOCKCALL_ITEM_WALK_END, SOCKCALL_STOP_NOT_PROTOCOL, 0);
		wk_count(SOCKCALL_COUNTER_NOT_PROTOCOL, 1);
		return 0;
	}
	st->proto = proto;
	u32 pre = fr_preface_bytes(proto);
	st->phase = pre ? WK_PREFACE : WK_HEADER;
	st->left = pre;
	return 1;
}

/* Set up the walk of a call that moved `total` bytes starting at sequence
 * seq_start: the connection's state, continuity, sync hints. Writes the
 * items of the unsynced part. */
static __always_inline int wk_begin(struct wk_scratch *s, u64 sk, u8 call, u32 dir, u64 ptr, u64 len,
				    u64 total, u32 isn_next, int isn_known)
{
	struct wk_walk *w = &s->w;
	struct sockcall_event *ev = &s->ev;
	w->data_pos = 0;
	w->has_piece = 0;
	w->stopped = 0;
	w->stop_reason = 0;
	w->any_end = 0;
	w->n_ends = 0;
	w->ends_done = 0;
#if SOCKCALLS_MSG_RECORDS
	w->msg_from = w->msg_from_gen = 0;
	w->flushes = 0;
	w->msgs_done = w->msgs_out = 0;
#endif
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
	wk_load_iovs(w, call, ptr, len, total);

	int first = 0, fresh = 0;
	struct wk_state *known = sockcalls_walk.lookup(&w->key);
	if (known) {
		w->st = *known;
		if (wk_synced(w->st.phase) && w->st.next_seq != w->seq_start) {
			wk_mark(s, SOCKCALL_ITEM_WALK_END, SOCKCALL_STOP_STREAM_GAP, 0);
			wk_count(SOCKCALL_COUNTER_STREAM_GAPS, 1);
			w->st.phase = WK_UNSYNCED;
			w->st.hdr_have = 0;
		}
	} else {
		__builtin_memset(&w->st, 0, sizeof(w->st));
		w->st.phase = WK_UNSYNCED;
		w->st.proto = fr_default_proto();
		if (isn_known && w->seq_start == isn_next) {
			fresh = 1;
			first = wk_classify(s);
		}
	}
	w->st.next_seq = w->seq_start + (u32)total;
	u8 phase = w->st.phase;
	if (wk_synced(phase)) {
		wk_mark(s, SOCKCALL_ITEM_WALK_START, first ? SOCKCALL_WALK_FIRST_BYTE : SOCKCALL_WALK_CONTINUE,
			w->st.proto);
		return WK_GO;
	}
	if (phase == WK_OPAQUE)
		return WK_DONE;
	/* Unsynced: a hint that this call reaches starts the walk there. Its
	 * framing is taken even from a stale hint: the hunt then looks for that
	 * protocol's messages. */
	struct wk_hint *h = sockcalls_sync_hint.lookup(&w->key);
	u64 at = total;
	if (h && (h->flags & WK_HINT_COUNT_ONLY)) {
		sockcalls_sync_hint.delete(&w->key);
		wk_count(SOCKCALL_COUNTER_HINTS_APPLIED, 1);
		w->st.phase = WK_NOT_PROTO;
		return WK_DONE;
	}
	if (h) {
		if (h->proto && h->proto <= SOCKCALL_PROTO_MAX)
			w->st.proto = h->proto;
		s32 d = (s32)(h->seq - w->seq_start);
		if (d < 0) {
			sockcalls_sync_hint.delete(&w->key);
			wk_count(SOCKCALL_COUNTER_HINTS_STALE, 1);
		} else if ((u64)d < total) {
			at = (u64)d;
			w->st.frame_idx = h->frame_idx;
			w->st.msg_aux = 0;
			sockcalls_sync_hint.delete(&w->key);
			wk_count(SOCKCALL_COUNTER_HINTS_APPLIED, 1);
		}
	}
	if (at >= total && phase == WK_UNSYNCED)
		return WK_HUNT; /* not for NOT_PROTO: other protocols are not hunted in */
	if (at >= total && phase == WK_NOT_PROTO && !fresh)
		return WK_DONE; /* counted only: its first call's raw bytes said what it is */
	wk_copy_raw(s, 0, at < SOCKCALLS_PREFIX_BYTES ? at : SOCKCALLS_PREFIX_BYTES, SOCKCALL_BYTES_PREFIX);
	if (at >= total)
		return WK_DONE;
	wk_start_at(s, at, SOCKCALL_WALK_HINT);
	return WK_GO;
}

/* ---- self-sync ------------------------------------------------------------
 * An unsynced call may show where frames are by itself: in a busy stream of
 * small messages, by the time user space has found sync the stream has moved
 * on and its hint is stale. Candidates: bytes where the framing says a
 * message could start (fr_candidate),
 * searched for window by window (WK_HUNT_WINDOW bytes a pass, at most
 * WK_HUNT_PASSES passes a call) from the call's start, or from where the
 * walk met garbage; the bytes searched before the sync point are reported
 * (HUNTED item, past the raw prefix: user space counts them unparsed). One
 * is taken when the chain of frames from it (fr_chain_frame at every header)
 * completes WK_HUNT_MESSAGES messages inside the call, or completes one
 * exactly at the call's end (a call per message, as paced traffic sends and
 * receives): random bytes practically never do. A chain that runs past the
 * call's end (a message longer than a call) becomes a pending candidate: it
 * predicts the sequence of the next header, and later calls check the bytes
 * there; after WK_HUNT_CONFIRM headers found where predicted, the walk
 * starts at the last one. (A user-space hint would do the same from outside,
 * but by the time it arrives the stream has passed a large frame's end.)
 * Only the call's first iovec is searched. */

/* Follow the chain of frames from call offset p (a header of frame idx0 of
 * its message) up to w->h_limit: WK_CHAIN_*. Its position, frame index and
 * message count live in the walk context (volatile): registers would carry a
 * different value on every path and defeat the verifier's pruning. */
static __always_inline int wk_chain(struct wk_walk *w, const int proto, u64 base, u64 p, u32 idx0)
{
	w->h_pos = p;
	w->h_idx = idx0;
	w->h_msgs = 0;
	for (int k = 0; k < WK_HUNT_FRAMES; k++) {
		u64 pos = w->h_pos;
		u64 limit = w->h_limit;
		if (pos >= limit)
			/* the next header is in a later call (only when the iovec
			 * searched holds the whole call: else it may be in this one) */
			return limit == w->total ? WK_CHAIN_AHEAD : WK_CHAIN_BAD;
		if (pos + fr_cand_bytes(proto) > limit)
			return limit == w->total ? WK_CHAIN_CUT : WK_CHAIN_BAD; /* cannot tell */
		u8 h[16] = {};
		u64 r = limit - pos;
		if (r > fr_chain_read(proto))
			r = fr_chain_read(proto);
		if (bpf_probe_read_user(h, r & 15, (void *)(base + pos)))
			return WK_CHAIN_BAD;
		u32 idx = w->h_idx;
		u64 len = 0;
		int end = fr_chain_frame(proto, h, r, idx, &len);
		if (end < 0)
			return WK_CHAIN_BAD;
		w->h_pos = pos + len;
		if (!end) {
			w->h_idx = idx + 1;
		} else {
			w->h_idx = 0;
			w->h_msgs += 1;
			/* two messages; or one that ends exactly where the call ends
			 * (paced traffic: a call per message) */
			if (w->h_msgs >= WK_HUNT_MESSAGES || w->h_pos == limit)
				return WK_CHAIN_DONE;
		}
	}
	return WK_CHAIN_BAD;
}

/* A chain that ran past the call's end becomes (or stays) the pending
 * candidate: where it predicts the next header. */
static __always_inline void wk_pend(struct wk_walk *w, u8 score)
{
	w->st.cand_seq = w->seq_start + (u32)w->h_pos;
	w->st.cand_idx = w->h_idx;
	w->st.cand_score = score;
}

/* One window of the hunt, [h_at, h_at + WK_HUNT_WINDOW) of the call's first
 * iovec: the call offset where the call can be walked from, or w->total.
 * Moves h_at to the next window (h_limit: nothing left to search) and
 * h_rej_end past what it searched and rejected. Bounds go through the
 * (volatile) walk context: a loop that breaks on a comparison with a
 * register narrows that register differently at every exit, and the
 * verifier would follow each exit separately. */
static __always_inline u64 wk_hunt_find(struct wk_scratch *s, const int proto)
{
	struct wk_walk *w = &s->w;
	w->h_limit = 0;
	if (w->niov == 0 || w->iov_first != 0) /* only the call's first iovec is searched */
		return w->total;
	u64 limit = w->iov[0].len < w->total ? w->iov[0].len : w->total;
	w->h_limit = limit;
	u64 from = w->h_at;
	if (from >= limit)
		return w->total;
	u64 n = limit - from < WK_HUNT_WINDOW ? limit - from : WK_HUNT_WINDOW;
	/* the window's last bytes start no candidate: the next window starts there */
	w->h_at = from + n < limit ? from + n - (fr_cand_bytes(proto) - 1) : limit;
	asm volatile("" : "+r"(n));
	if (n < fr_cand_bytes(proto) || n > WK_HUNT_WINDOW || bpf_probe_read_user(w->win, n, (void *)(w->iov[0].base + from))) {
		w->h_at = limit;
		return w->total;
	}
	w->h_n = n;
	u8 *b = (u8 *)w->win;
	w->n_cand = 0;
	for (int j = 0; j < WK_HUNT_WINDOW - 2; j++) {
		if (j + fr_cand_bytes(proto) - 1 >= w->h_n)
			break;
		if (fr_candidate(proto, b + j)) {
			u32 c = w->n_cand;
			if (c < WK_HUNT_CANDIDATES) {
				w->cand[c & (WK_HUNT_CANDIDATES - 1)] = from + j;
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
			int r = wk_chain(w, proto, w->iov[0].base, (u64)d, w->st.cand_idx);
			if (r == WK_CHAIN_BAD || r == WK_CHAIN_CUT) {
				w->st.cand_score = 0;
			} else if (r == WK_CHAIN_DONE || score + 1 >= WK_HUNT_CONFIRM) {
				w->st.frame_idx = w->st.cand_idx;
				w->st.msg_aux = 0;
				w->st.cand_score = 0;
				return (u64)d;
			} else {
				wk_pend(w, score + 1);
				w->h_at = limit;
				return w->total;
			}
		}
	}
	for (int c = 0; c < WK_HUNT_CANDIDATES; c++) {
		if (c >= w->n_cand)
			break;
		u64 p = w->cand[c & (WK_HUNT_CANDIDATES - 1)];
		int r = wk_chain(w, proto, w->iov[0].base, p, 0);
		if (r == WK_CHAIN_DONE) {
			w->st.frame_idx = 0;
			w->st.cand_score = 0;
			return p;
		}
		if (r == WK_CHAIN_AHEAD && !w->st.cand_score) {
			/* plausible up to the call's end: a message, not garbage, from p on */
			wk_pend(w, 1);
			w->h_rej_end = p;
			w->h_tail_at = p;
			w->h_at = limit;
			return w->total;
		}
		if (r == WK_CHAIN_CUT && p < w->h_tail_at)
			w->h_tail_at = p; /* may be a message whose rest the next call holds */
	}
	w->h_rej_end = w->h_at;
	return w->total;
}

/* The hunt is over: the raw bytes where it began (for user space), what it
 * searched and rejected beyond them (a HUNTED item: user space counts it
 * unparsed, not unread), and the walk from the sync point `at` if there is
 * one. Returns WK_GO or WK_DONE. */
static __always_inline int wk_hunt_end(struct wk_scratch *s, const int proto, u64 at)
{
	struct wk_walk *w = &s->w;
	u64 from = w->hunt_from;
	u64 total = w->total;
	u64 end = at < total ? at : total;
	u64 rej = at < total ? at : w->h_rej_end;
	u64 pre = end - from < SOCKCALLS_PREFIX_BYTES ? end - from : SOCKCALLS_PREFIX_BYTES;
	if (end > from)
		wk_copy_raw(s, from, pre, from ? SOCKCALL_BYTES_RAW : SOCKCALL_BYTES_PREFIX);
	if (at >= total && rej > from) {
		/* No sync, something rejected: the call's end may hold the start of
		 * a message the next call completes (a candidate pending or cut by
		 * the call's end, or a header in its last bytes). Those bytes go out
		 * raw, not as hunted: user space joins them to the next call's
		 * prefix and parses that message. */
		u64 t = w->h_tail_at;
		u64 tail = fr_cand_bytes(proto) - 1; /* the last bytes, which start no candidate, go out raw */
		if (total > tail && t > total - tail)
			t = total - tail;
		if (t < from + pre)
			t = from + pre;
		u64 n = total - t < SOCKCALLS_PREFIX_BYTES ? total - t : SOCKCALLS_PREFIX_BYTES;
		/* only the first iovec is hunted in (one read, no loop over iovecs here: the verifier) */
		if (t < total && t + n <= w->h_limit)
			wk_copy_user(s, t, w->iov[0].base + t, n, SOCKCALL_BYTES_RAW);
		if (rej > t)
			rej = t;
	}
	/* the raw prefix is not part of it: user space judges those bytes itself */
	from += pre;
	if (rej > from && rej <= total) {
		struct sockcall_hunted *h =
			(struct sockcall_hunted *)wk_item(s, SOCKCALL_ITEM_HUNTED, 0, sizeof(struct sockcall_hunted), from);
		h->bytes = (u32)(rej - from);
		h->_pad = 0;
		wk_count(SOCKCALL_COUNTER_HUNTED_BYTES, rej - from);
	}
	if (at >= total)
		return WK_DONE;
	wk_start_at(s, at, SOCKCALL_WALK_SELF);
	wk_count(SOCKCALL_COUNTER_SELF_SYNCS, 1);
	return WK_GO;
}

/* One pass of the hunt of an unsynced call (or of the rest of a call whose
 * walk lost sync): WK_HUNT (search the next window: tail-call the hunt
 * again) or WK_DONE (h_found says where it ended: wk_hunt_end, in a program
 * of its own, for the verifier's budget). */
static __always_inline int wk_hunt(struct wk_scratch *s, const int proto)
{
	struct wk_walk *w = &s->w;
	u64 at = wk_hunt_find(s, proto);
	w->h_found = at;
	if (at >= w->total && w->h_at < w->h_limit && w->h_passes + 1 < WK_HUNT_PASSES) {
		w->h_passes += 1;
		return WK_HUNT;
	}
	return WK_DONE;
}

/* The walk stopped at a header that cannot be one (garbage) with bytes of
 * the call left: the rest of the call is hunted in, so a stream that
 * carries garbage and then frames again is followed from the first chain
 * of frames after it, not from the next call on. Returns 1 when a hunt is
 * set up (the caller tail-calls it). */
static __always_inline int wk_lost_sync(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	if (!SOCKCALL_STOP_DESYNC(w->stop_reason))
		return 0;
	if (w->pos >= w->total)
		return 0;
	wk_write_stop(s, 0);
	w->stopped = 0;
	w->stop_reason = 0;
	wk_count(SOCKCALL_COUNTER_WALK_BYTES, w->pos - w->walk_from);
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
static __always_inline int wk_ends_lookup(struct wk_scratch *s)
{
#ifdef NETSTACK_LOADED
	struct wk_walk *w = &s->w;
	u32 n = w->n_ends < WK_ENDS_MAX ? w->n_ends : WK_ENDS_MAX;
	u32 done = w->ends_done;
	if (w->key.dir == WK_DIR_TX) {
		/* msg_id: the message's index on this direction of the connection,
		 * as in its MSG_END item */
		u64 first = w->st.msg_count - w->n_ends;
		for (int i = 0; i < SOCKCALLS_ENDS_PER_PASS; i++) {
			u32 e = done + i;
			if (e >= n)
				break;
			ns_tx_expect_end(w->key.sk, w->seq_start + w->ends[e & (WK_ENDS_MAX - 1)], first + e);
		}
	} else {
		for (int i = 0; i < SOCKCALLS_ENDS_PER_PASS; i++) {
			u32 e = done + i;
			if (e >= n)
				break;
			u32 off = w->ends[e & (WK_ENDS_MAX - 1)];
			struct ns_rx_times *t = (struct ns_rx_times *)wk_item(
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

#if SOCKCALLS_MSG_RECORDS
/* The message records of the next SOCKCALLS_MSGS_PER_PASS ends of the call
 * (events.h, struct sockcall_msg). Returns 1 while ends remain. */
static __always_inline int wk_msgs_emit(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
	u32 n = w->n_ends < WK_ENDS_MAX ? w->n_ends : WK_ENDS_MAX;
	u32 done = w->msgs_done;
	u64 first = w->st.msg_count - w->n_ends;
	int rx_ok = w->key.dir == WK_DIR_RX && w->ends_done && w->rx_gen == w->flushes;
	for (int i = 0; i < SOCKCALLS_MSGS_PER_PASS; i++) {
		u32 e = done + i;
		if (e >= n)
			break;
		struct sockcall_msg *r = sockcalls_msgs.ringbuf_reserve(sizeof(struct sockcall_msg));
		if (!r)
			continue; /* counted with the ends that got none, in wk_finish */
		r->enter_ts_ns = s->ev.enter_ts_ns;
		r->exit_ts_ns = s->ev.exit_ts_ns;
		r->sk = w->key.sk;
		r->msg_index = first + e;
		r->tgid = s->ev.tgid;
		r->tid = s->ev.tid;
		r->netns_ino = s->ev.netns_ino;
		r->seq_start = s->ev.seq_start;
		r->seq_end = s->ev.seq_end;
		r->end_seq = w->seq_start + w->ends[e & (WK_ENDS_MAX - 1)];
		r->frames = 0;
		r->call = s->ev.call;
		r->flags = 0;
		r->items_bytes = 0;
		u32 span = w->end_span[e & (WK_ENDS_MAX - 1)];
		u32 from = span & 0xFFFF, to = span >> 16;
		if (from == WK_FROM_CUT || w->end_gen[e & (WK_ENDS_MAX - 1)] != (u8)w->flushes || to <= from) {
			r->flags |= SOCKCALL_MSG_F_ITEMS_LOST;
		} else {
			u32 len = to - from;
			if (len > SOCKCALL_MSG_ITEMS_MAX) {
				len = SOCKCALL_MSG_ITEMS_MAX;
				r->flags |= SOCKCALL_MSG_F_ITEMS_CUT;
			}
			from &= SOCKCALL_PAYLOAD_MAX - 1;
			len &= SOCKCALL_MSG_ITEMS_MAX * 2 - 1;
			if (len && bpf_probe_read_kernel(r->items, len, &s->ev.payload[from]) == 0)
				r->items_bytes = len;
			/* the slice ends with this message's MSG_END item: its frame count */
			u32 at = len - sizeof(struct sockcall_msg_end) + offsetof(struct sockcall_msg_end, frames);
			if (r->items_bytes == to - from && len >= WK_ITEM_HDR + sizeof(struct sockcall_msg_end) &&
			    at <= SOCKCALL_MSG_ITEMS_MAX - sizeof(u32))
				bpf_probe_read_kernel(&r->frames, sizeof(u32), &r->items[at]);
		}
		if (rx_ok && e < w->ends_done) {
			u32 at = w->rx_base + e * (WK_ITEM_HDR + sizeof(struct ns_rx_times)) + WK_ITEM_HDR;
			if (at + sizeof(struct ns_rx_times) <= w->data_pos) {
				bpf_probe_read_kernel(&r->rx, sizeof(r->rx), &s->ev.payload[at & (SOCKCALL_PAYLOAD_MAX - 1)]);
				r->flags |= SOCKCALL_MSG_F_RX_TIMES;
			}
		}
		sockcalls_msgs.ringbuf_submit(r, 0);
		w->msgs_out++;
	}
	done += SOCKCALLS_MSGS_PER_PASS;
	w->msgs_done = done;
	return done < n;
}
#endif

/* After the walk: the netstack lookups of its message ends, then their
 * records; a program that runs neither goes on to wk_finish. */
static __always_inline void wk_after_walk(void *ctx, struct wk_scratch *s)
{
	if (!s->w.n_ends)
		return;
#if SOCKCALLS_MSG_RECORDS
	/* the RX_TIMES items of walk_ends follow one another from here (the records read them) */
	s->w.rx_base = s->w.data_pos;
	s->w.rx_gen = s->w.flushes;
#endif
#ifdef NETSTACK_LOADED
	sockcalls_progs.call(ctx, WK_SLOT_ENDS);
#endif
#if SOCKCALLS_MSG_RECORDS
	sockcalls_progs.call(ctx, WK_SLOT_MSGS);
#endif
}

/* The call is walked (and wk_write_stop done): per-call netstack state, counters, connection state,
 * the last record. */
static __always_inline void wk_finish(struct wk_scratch *s)
{
	struct wk_walk *w = &s->w;
#ifdef NETSTACK_LOADED
	if (w->any_end) {
		if (w->key.dir == WK_DIR_TX)
			ns_window_state(w->key.sk, (struct ns_window *)wk_item(s, SOCKCALL_ITEM_WINDOW, 0,
									      sizeof(struct ns_window), w->total));
		else
			ns_thread_sched(s->ev.tid, (struct ns_sched *)wk_item(s, SOCKCALL_ITEM_SCHED, 0,
									     sizeof(struct ns_sched), w->total));
	}
#endif
	wk_count(SOCKCALL_COUNTER_WALK_BYTES, w->pos - w->walk_from);
	wk_count(SOCKCALL_COUNTER_FRAMES, w->frames);
	wk_count(SOCKCALL_COUNTER_MESSAGES, w->messages);
	wk_count(SOCKCALL_COUNTER_KEY_SAMPLES, w->key_samples);
	wk_count(SOCKCALL_COUNTER_TRUNCATED, w->truncated);
#if SOCKCALLS_MSG_RECORDS
	wk_count(SOCKCALL_COUNTER_MSGS_OUT, w->msgs_out);
	wk_count(SOCKCALL_COUNTER_MSGS_LOST, w->n_ends - w->msgs_out);
#endif
	struct wk_state *known = sockcalls_walk.lookup(&w->key);
	if (known)
		*known = w->st;
	else if (sockcalls_walk.insert(&w->key, &w->st) == 0)
		wk_count(SOCKCALL_COUNTER_WALKS_MADE, 1);
	else /* made meanwhile on another CPU */
		sockcalls_walk.update(&w->key, &w->st);
	wk_emit(s, 0);
}

/* ---- the programs ----------------------------------------------------------
 * Bodies of the tail-called programs; framings.bpf.h defines each protocol's
 * programs with these and its SOCKCALL_PROTO_* (a constant: each program
 * holds one framing). Not attached: reached by tail calls only
 * (probes/sockcalls.py install_walker puts them in sockcalls_progs). */

/* From sc_exit, after wk_begin said `next`: the walk or hunt of the
 * connection's protocol; returns only when that program is not installed. */
static __always_inline void wk_dispatch(void *ctx, struct wk_scratch *s, int next)
{
	u32 proto = s->w.st.proto;
	if (next == WK_GO) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_WALK));
		/* only reached when the walker is not installed */
		wk_stop(s, SOCKCALL_STOP_NO_WALKER, 0);
	} else if (next == WK_HUNT) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_HUNT));
		/* not installed: as an unsynced call without a sync point */
		wk_copy_raw(s, 0, s->w.total < SOCKCALLS_PREFIX_BYTES ? s->w.total : SOCKCALLS_PREFIX_BYTES,
			    SOCKCALL_BYTES_PREFIX);
	}
}

/* The walk: SOCKCALLS_WALK_STEPS steps, then itself again (tail call) while
 * bytes remain; on garbage, the hunt in the rest of the call; then the
 * netstack lookups of the message ends it saw. */
static __always_inline int wk_walk_pass(void *ctx, const int proto)
{
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
	wk_next_window(&s->w);
	wk_preface_steps(s, proto);
	for (int i = 0; i < SOCKCALLS_WALK_STEPS; i++) {
		if (wk_step(s, proto))
			break;
	}
	if (!s->w.stopped && s->w.pos < s->w.total) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_WALK));
		/* the kernel's tail call limit: this call has too many frames */
		wk_stop(s, SOCKCALL_STOP_BUDGET, 0);
	}
	if (wk_lost_sync(s)) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_HUNT));
		/* no tail call left: the raw bytes after the WALK_END only */
		wk_hunt_end(s, proto, s->w.total);
	} else {
		wk_write_stop(s, 1);
	}
	wk_after_walk(ctx, s);
	wk_finish(s);
	return 0;
}

/* An unsynced call without a hint, or the rest of a call whose walk lost
 * sync: look for a sync point in its bytes, a window per pass (tail calls
 * of itself), then the hunt's end. */
static __always_inline int wk_hunt_pass(void *ctx, const int proto)
{
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
	if (wk_hunt(s, proto) == WK_HUNT) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_HUNT));
		/* the kernel's tail call limit: the rest of the call stays unsearched */
		s->w.h_found = s->w.total;
	}
	sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_HUNT_END));
	/* no tail call left (or not installed): the call's record as it is */
	wk_finish(s);
	return 0;
}

/* The hunt's end: its raw bytes and HUNTED item, the walk from the sync
 * point it found, or the end of the call. */
static __always_inline int wk_hunt_end_pass(void *ctx, const int proto)
{
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
	if (wk_hunt_end(s, proto, s->w.h_found) == WK_GO) {
		sockcalls_progs.call(ctx, WK_SLOT(proto, WK_PROG_WALK));
		wk_stop(s, SOCKCALL_STOP_NO_WALKER, 0);
		wk_write_stop(s, 1);
	}
	wk_after_walk(ctx, s); /* message ends walked before the walk lost sync */
	wk_finish(s);
	return 0;
}

/* Netstack lookups of the message ends, SOCKCALLS_ENDS_PER_PASS per pass
 * (after the walk: following the stream matters more than the times of one
 * call; ends the tail call limit leaves without a lookup have no RX_TIMES
 * item). One program for every protocol. */
static __always_inline int wk_ends_pass(void *ctx)
{
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
	if (wk_ends_lookup(s))
		sockcalls_progs.call(ctx, WK_SLOT_ENDS);
#if SOCKCALLS_MSG_RECORDS
	sockcalls_progs.call(ctx, WK_SLOT_MSGS);
#endif
	wk_finish(s);
	return 0;
}

/* The message records, SOCKCALLS_MSGS_PER_PASS per pass, after the netstack
 * lookups (ends the tail-call limit leaves without a record are counted:
 * msgs_lost). One program for every protocol. */
static __always_inline int wk_msgs_pass(void *ctx)
{
	struct wk_scratch *s = wk_scratch();
	if (!s)
		return 0;
#if SOCKCALLS_MSG_RECORDS
	if (wk_msgs_emit(s))
		sockcalls_progs.call(ctx, WK_SLOT_MSGS);
#endif
	wk_finish(s);
	return 0;
}

#endif /* PSLAT_WALK_ENGINE_BPF_H */
