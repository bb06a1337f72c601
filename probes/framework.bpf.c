/* Framework boundary: uprobes where the application hands a message to its
 * messaging framework and where the framework hands one back.
 *
 *   libzmq:  zmq_msg_send (entry+return), zmq_msg_recv (entry+return),
 *            zmq_socket (entry+return, to learn socket types)
 *   ps-lite: ps::ZMQVan::SendMsg (entry+return), ps::ZMQVan::RecvMsg (entry+return)
 *
 * One event per completed call, emitted at the return so a failed call (EAGAIN
 * of a non-blocking send or recv) can be dropped here and only counted.
 * Entry state lives in `inflight`, keyed by thread and kind: one slot per
 * thread, reused call after call and filled in place, because copying a
 * fresh 144-byte event in and deleting it again cost more than the rest of
 * the program (measured: ~300 ns of ~900 ns per entry).
 *
 * Every constant below comes from probes/framework.py as -D NAME=integer:
 * the zmq_msg_t layout is measured on the traced libzmq itself
 * (probes/zmq_layout.py), never assumed.
 */
#include <uapi/linux/ptrace.h>

#if !defined(FW_CAPTURE_BYTES) || !defined(FW_RINGBUF_PAGES) || !defined(FW_INFLIGHT_MAX)
#error "probes/framework.py passes FW_CAPTURE_BYTES, FW_RINGBUF_PAGES and FW_INFLIGHT_MAX"
#endif
#if !defined(ZMQ_MSG_BYTES) || !defined(ZMQ_CONTENT_BLOCK_BYTES) || !defined(ZMQ_TYPE_OFF) || \
    !defined(ZMQ_FLAGS_OFF) || !defined(ZMQ_MORE_MASK) || !defined(ZMQ_VSM_TYPE) || !defined(ZMQ_VSM_DATA_OFF) || !defined(ZMQ_VSM_SIZE_OFF) || \
    !defined(ZMQ_VSM_MAX_BYTES) || !defined(ZMQ_LMSG_TYPE) || !defined(ZMQ_ZCLMSG_TYPE) || \
    !defined(ZMQ_CONTENT_PTR_OFF) || !defined(ZMQ_CONTENT_DATA_OFF) || \
    !defined(ZMQ_CONTENT_SIZE_OFF) || !defined(ZMQ_CMSG_TYPE) || \
    !defined(ZMQ_CMSG_DATA_OFF) || !defined(ZMQ_CMSG_SIZE_OFF)
#error "probes/framework.py passes the calibrated zmq_msg_t layout (ZMQ_*)"
#endif

enum fw_kind {
    FW_ZMQ_SEND = 1,
    FW_ZMQ_RECV = 2,
    FW_ZMQ_SOCKET = 3,
    FW_PS_SEND = 4,
    FW_PS_RECV = 5,
};

enum fw_counter {
    FW_SEEN = 0,          /* calls completed and submitted */
    FW_LOST = 1,          /* ring buffer full */
    FW_FAILED = 2,        /* call returned an error (e.g. EAGAIN): not submitted */
    FW_ORPHAN = 3,        /* return without its entry (attached mid-call, or inflight full) */
    FW_INFLIGHT_FULL = 4, /* entry state could not be saved */
    FW_NCOUNTERS = 5,
};

/* Mirrored by FwEvent in probes/framework.py (checked at every start against
 * the `fw_event_layout` map, whose leaf type bcc derives from this declaration).
 * Explicit padding: no hole the compiler could place differently. */
struct fw_event {
    u64 ts_ns;       /* call entry, CLOCK_MONOTONIC */
    u64 ret_ts_ns;   /* call return */
    u64 sock;        /* zmq: socket handle; ps: the ZMQVan (this) */
    u64 obj;         /* zmq: zmq_msg_t *; ps: ps::Message * */
    s64 ret;         /* return value: frame/message bytes; zmq_socket: 0, or -1 if it failed */
    u64 size;        /* zmq: frame size read from the zmq_msg_t */
    u32 tgid;
    u32 tid;
    s32 arg;         /* zmq_msg_send: flags; zmq_socket: socket type */
    u16 data_len;    /* valid bytes in data */
    u8 kind;         /* enum fw_kind */
    u8 more;         /* send: ZMQ_SNDMORE given; recv: the frame's "more" flag */
    u8 msg_type;     /* zmq: the zmq_msg_t type tag (diagnostics) */
    u8 busy;         /* the slot holds an entry whose return has not come yet */
    u8 _pad[6];
    u8 data[FW_CAPTURE_BYTES]; /* zmq: first bytes of the frame; ps: start of ps::Meta */
};

struct fw_key {
    u32 tid;
    u32 kind;
};

/* LRU: threads that exit leave their slot behind; the oldest are reused. */
BPF_TABLE("lru_hash", struct fw_key, struct fw_event, inflight, FW_INFLIGHT_MAX);
BPF_PERCPU_ARRAY(counters, u64, FW_NCOUNTERS);
BPF_RINGBUF_OUTPUT(events, FW_RINGBUF_PAGES);
BPF_ARRAY(fw_event_layout, struct fw_event, 1);  /* never written: only its type is used */

/* Never written: the initial value of a thread's slot (too big for the stack). */
BPF_ARRAY(zero_event, struct fw_event, 1);

static __always_inline void count(u32 which)
{
    u64 *c = counters.lookup(&which);
    if (c)
        (*c)++;
}

#define FW_MIN(a, b) ((a) < (b) ? (a) : (b))
/* Inline frames are copied whole from the zmq_msg_t already on our stack. */
#define FW_VSM_COPY FW_MIN(ZMQ_VSM_MAX_BYTES, FW_CAPTURE_BYTES)
#if ZMQ_VSM_DATA_OFF + FW_VSM_COPY > ZMQ_MSG_BYTES || ZMQ_TYPE_OFF >= ZMQ_MSG_BYTES || \
    ZMQ_FLAGS_OFF >= ZMQ_MSG_BYTES || ZMQ_VSM_SIZE_OFF >= ZMQ_MSG_BYTES || \
    ZMQ_CONTENT_PTR_OFF + 8 > ZMQ_MSG_BYTES || ZMQ_CMSG_DATA_OFF + 8 > ZMQ_MSG_BYTES || \
    ZMQ_CMSG_SIZE_OFF + 8 > ZMQ_MSG_BYTES || ZMQ_CONTENT_BLOCK_BYTES > 64
#error "zmq_msg_t layout constants out of range"
#endif

/* Size and first bytes of the frame in a zmq_msg_t, by its type tag. The
 * zmq_msg_t is read in one go: each bpf_probe_read_user costs ~100 ns here. */
static __always_inline void read_frame(struct fw_event *e, const u8 *msg)
{
    u8 raw[ZMQ_MSG_BYTES];
    const u8 *data = 0;
    u64 size = 0;

    if (bpf_probe_read_user(raw, sizeof(raw), msg) != 0)
        return;
    u8 tag = raw[ZMQ_TYPE_OFF];
    e->msg_type = tag;
    if (e->kind == FW_ZMQ_RECV)
        e->more = (raw[ZMQ_FLAGS_OFF] & ZMQ_MORE_MASK) != 0;
    if (tag == ZMQ_VSM_TYPE) {
        size = FW_MIN(raw[ZMQ_VSM_SIZE_OFF], ZMQ_VSM_MAX_BYTES);
        e->size = size;
        __builtin_memcpy(e->data, raw + ZMQ_VSM_DATA_OFF, FW_VSM_COPY);
        e->data_len = FW_MIN(size, FW_VSM_COPY);
        return;
    }
    if (tag == ZMQ_LMSG_TYPE || tag == ZMQ_ZCLMSG_TYPE) {
        const u8 *content = 0;
        u8 block[ZMQ_CONTENT_BLOCK_BYTES];
        __builtin_memcpy(&content, raw + ZMQ_CONTENT_PTR_OFF, sizeof(content));
        if (bpf_probe_read_user(block, sizeof(block), content) != 0)
            return;
        __builtin_memcpy(&data, block + ZMQ_CONTENT_DATA_OFF, sizeof(data));
        __builtin_memcpy(&size, block + ZMQ_CONTENT_SIZE_OFF, sizeof(size));
    } else if (tag == ZMQ_CMSG_TYPE) {
        __builtin_memcpy(&data, raw + ZMQ_CMSG_DATA_OFF, sizeof(data));
        __builtin_memcpy(&size, raw + ZMQ_CMSG_SIZE_OFF, sizeof(size));
    } else {
        return;  /* a kind we do not read (delimiter, join/leave): size 0, no data */
    }
    e->size = size;
    u32 n = size < FW_CAPTURE_BYTES ? (u32)size : FW_CAPTURE_BYTES;
    /* Bounded for the verifier; a frame shorter than the capture is read exactly,
     * so the read never runs off the end of its buffer into an unmapped page. */
    n &= (2 * FW_CAPTURE_BYTES - 1);
    if (n > FW_CAPTURE_BYTES)
        n = FW_CAPTURE_BYTES;
    if (data && bpf_probe_read_user(e->data, n, data) == 0)
        e->data_len = n;
}

/* This thread's slot for `kind`, reset for a new call (stale data bytes past
 * data_len are left: user space reads only data_len of them). */
static __always_inline struct fw_event *begin(u8 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    struct fw_key key = {.tid = (u32)id, .kind = kind};
    struct fw_event *e = inflight.lookup(&key);
    if (!e) {
        u32 zero = 0;
        struct fw_event *z = zero_event.lookup(&zero);
        if (!z || inflight.update(&key, z) != 0 || !(e = inflight.lookup(&key))) {
            count(FW_INFLIGHT_FULL);
            return 0;
        }
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->ret_ts_ns = 0;
    e->sock = 0;
    e->obj = 0;
    e->ret = 0;
    e->size = 0;
    e->tgid = id >> 32;
    e->tid = (u32)id;
    e->arg = 0;
    e->data_len = 0;
    e->kind = kind;
    e->more = 0;
    e->msg_type = 0;
    e->busy = 1;
    return e;
}

/* Completes this thread's call of `kind`; NULL if its entry was not seen. */
static __always_inline struct fw_event *finish(struct pt_regs *ctx, u8 kind, s64 ret)
{
    struct fw_key key = {.tid = (u32)bpf_get_current_pid_tgid(), .kind = kind};
    struct fw_event *e = inflight.lookup(&key);
    if (!e || !e->busy) {
        count(FW_ORPHAN);
        return 0;
    }
    e->ret_ts_ns = bpf_ktime_get_ns();
    e->ret = ret;
    return e;
}

static __always_inline int submit(struct fw_event *e)
{
    if (e->ret < 0)
        count(FW_FAILED);
    else if (events.ringbuf_output(e, sizeof(*e), 0) != 0)
        count(FW_LOST);
    else
        count(FW_SEEN);
    e->busy = 0;
    return 0;
}

/* int zmq_msg_send(zmq_msg_t *msg, void *socket, int flags)
 * Read at entry: libzmq moves the frame out of msg while sending. */
int zmq_send_entry(struct pt_regs *ctx)
{
    struct fw_event *e = begin(FW_ZMQ_SEND);
    if (!e)
        return 0;
    e->obj = PT_REGS_PARM1(ctx);
    e->sock = PT_REGS_PARM2(ctx);
    e->arg = (s32)PT_REGS_PARM3(ctx);
    e->more = (e->arg & 2 /* ZMQ_SNDMORE, public API */) != 0;
    read_frame(e, (const u8 *)e->obj);
    return 0;
}

int zmq_send_return(struct pt_regs *ctx)
{
    struct fw_event *e = finish(ctx, FW_ZMQ_SEND, (s32)PT_REGS_RC(ctx));
    return e ? submit(e) : 0;
}

/* int zmq_msg_recv(zmq_msg_t *msg, void *socket, int flags)
 * Read at return: the frame is in msg only then. */
int zmq_recv_entry(struct pt_regs *ctx)
{
    struct fw_event *e = begin(FW_ZMQ_RECV);
    if (!e)
        return 0;
    e->obj = PT_REGS_PARM1(ctx);
    e->sock = PT_REGS_PARM2(ctx);
    e->arg = (s32)PT_REGS_PARM3(ctx);
    return 0;
}

int zmq_recv_return(struct pt_regs *ctx)
{
    struct fw_event *e = finish(ctx, FW_ZMQ_RECV, (s32)PT_REGS_RC(ctx));
    if (!e)
        return 0;
    if (e->ret >= 0)
        read_frame(e, (const u8 *)e->obj);
    return submit(e);
}

/* void *zmq_socket(void *ctx, int type): which handles are ROUTER sockets. */
int zmq_socket_entry(struct pt_regs *ctx)
{
    struct fw_event *e = begin(FW_ZMQ_SOCKET);
    if (!e)
        return 0;
    e->arg = (s32)PT_REGS_PARM2(ctx);
    return 0;
}

int zmq_socket_return(struct pt_regs *ctx)
{
    u64 handle = PT_REGS_RC(ctx);
    struct fw_event *e = finish(ctx, FW_ZMQ_SOCKET, handle ? 0 : -1);
    if (!e)
        return 0;
    e->sock = handle;
    return submit(e);
}

/* int ps::ZMQVan::SendMsg(const ps::Message &msg): this in PARM1, &msg in PARM2.
 * ps::Message begins with ps::Meta; user space decodes its leading fields. */
static __always_inline int ps_entry(struct pt_regs *ctx, u8 kind, int read_now)
{
    struct fw_event *e = begin(kind);
    if (!e)
        return 0;
    e->sock = PT_REGS_PARM1(ctx);
    e->obj = PT_REGS_PARM2(ctx);
    if (read_now && bpf_probe_read_user(e->data, FW_CAPTURE_BYTES, (void *)e->obj) == 0)
        e->data_len = FW_CAPTURE_BYTES;
    return 0;
}

int ps_send_entry(struct pt_regs *ctx) { return ps_entry(ctx, FW_PS_SEND, 1); }

int ps_send_return(struct pt_regs *ctx)
{
    struct fw_event *e = finish(ctx, FW_PS_SEND, (s32)PT_REGS_RC(ctx));
    return e ? submit(e) : 0;
}

/* int ps::ZMQVan::RecvMsg(ps::Message *msg): the Message is filled at return. */
int ps_recv_entry(struct pt_regs *ctx) { return ps_entry(ctx, FW_PS_RECV, 0); }

int ps_recv_return(struct pt_regs *ctx)
{
    struct fw_event *e = finish(ctx, FW_PS_RECV, (s32)PT_REGS_RC(ctx));
    if (!e)
        return 0;
    if (e->ret >= 0 && bpf_probe_read_user(e->data, FW_CAPTURE_BYTES, (void *)e->obj) == 0)
        e->data_len = FW_CAPTURE_BYTES;
    return submit(e);
}
