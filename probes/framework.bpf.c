/* Framework boundary: uprobes where the application hands a message to its
 * messaging framework and where the framework hands one back.
 *
 *   libzmq:  zmq_msg_send (entry+return), zmq_msg_recv (entry+return),
 *            zmq_socket (entry+return, to learn socket types)
 *   ps-lite: ps::ZMQVan::SendMsg (entry+return), ps::ZMQVan::RecvMsg (entry+return)
 *   brpc:    baidu_std's four ends of an RPC, entry only (linked into Paddle's
 *            libpaddle.so; see "brpc" below and docs/paddle.md)
 *
 * One ring event per message, not per call: a ps-lite message is 3-5 zmq
 * frames (ROUTER routing id, meta, keys, vals, lens), and one event per frame
 * made this probe 95% of all events under load. The frames of a thread's zmq
 * message accumulate in its slot of `inflight` (keyed by thread and kind, so
 * by direction): times of the first and last call, each frame's size and
 * first FW_CAPTURE_BYTES bytes; the event goes out at the return of the frame
 * sent without ZMQ_SNDMORE / received without "more". An event carries at
 * most FW_MAX_FRAMES frames: a longer message, or frames of another socket
 * interleaved on the same thread, send the frames so far as an event with
 * `more` set, and user space joins the pieces (it keys by thread, socket and
 * direction, as it did for single frames).
 *
 * A failed call (EAGAIN of a non-blocking send or recv) adds no frame and is
 * only counted: the application sends or receives that frame again.
 * The slot is reused call after call and filled in place, because copying a
 * fresh event in and deleting it again cost more than the rest of the
 * program (measured: ~300 ns of ~900 ns per entry).
 *
 * Every constant below comes from probes/framework.py as -D NAME=integer:
 * the zmq_msg_t layout is measured on the traced libzmq itself
 * (probes/zmq_layout.py), never assumed.
 */
#include <uapi/linux/ptrace.h>

#if !defined(FW_CAPTURE_BYTES) || !defined(FW_RINGBUF_PAGES) || !defined(FW_INFLIGHT_MAX) || \
    !defined(FW_MAX_FRAMES)
#error "probes/framework.py passes FW_CAPTURE_BYTES, FW_MAX_FRAMES, FW_RINGBUF_PAGES and FW_INFLIGHT_MAX"
#endif
#if !defined(ZMQ_MSG_BYTES) || !defined(ZMQ_CONTENT_BLOCK_BYTES) || !defined(ZMQ_TYPE_OFF) || \
    !defined(ZMQ_FLAGS_OFF) || !defined(ZMQ_MORE_MASK) || !defined(ZMQ_VSM_TYPE) || !defined(ZMQ_VSM_DATA_OFF) || !defined(ZMQ_VSM_SIZE_OFF) || \
    !defined(ZMQ_VSM_MAX_BYTES) || !defined(ZMQ_LMSG_TYPE) || !defined(ZMQ_ZCLMSG_TYPE) || \
    !defined(ZMQ_CONTENT_PTR_OFF) || !defined(ZMQ_CONTENT_DATA_OFF) || \
    !defined(ZMQ_CONTENT_SIZE_OFF) || !defined(ZMQ_CMSG_TYPE) || \
    !defined(ZMQ_CMSG_DATA_OFF) || !defined(ZMQ_CMSG_SIZE_OFF)
#error "probes/framework.py passes the calibrated zmq_msg_t layout (ZMQ_*)"
#endif
/* A power of two: the frame index is masked for the verifier. A capture of up
 * to 255 bytes: its length is a u8. */
#if FW_MAX_FRAMES < 1 || FW_MAX_FRAMES > 64 || (FW_MAX_FRAMES & (FW_MAX_FRAMES - 1)) || \
    FW_CAPTURE_BYTES < 8 || FW_CAPTURE_BYTES > 255
#error "FW_MAX_FRAMES must be a power of two <= 64 and FW_CAPTURE_BYTES in [8, 255]"
#endif

enum fw_kind {
    FW_ZMQ_SEND = 1,
    FW_ZMQ_RECV = 2,
    FW_ZMQ_SOCKET = 3,
    FW_PS_SEND = 4,
    FW_PS_RECV = 5,
    FW_BRPC_CLIENT_SEND = 6,  /* brpc::policy::PackRpcRequest: a request packed to go out */
    FW_BRPC_CLIENT_RECV = 7,  /* brpc::Controller::OnVersionedRPCReturned: its response back */
    FW_BRPC_SERVER_RECV = 8,  /* brpc::policy::ProcessRpcRequest: a request handed to the service */
    FW_BRPC_SERVER_SEND = 9,  /* brpc::policy::SendRpcResponse: the service's response out */
};

enum fw_counter {
    FW_SEEN = 0,          /* events submitted (zmq: messages, or pieces of one) */
    FW_LOST = 1,          /* ring buffer full */
    FW_FAILED = 2,        /* call returned an error (e.g. EAGAIN): nothing added */
    FW_ORPHAN = 3,        /* return without its entry (attached mid-call, or inflight full) */
    FW_INFLIGHT_FULL = 4, /* entry state could not be saved */
    FW_FRAMES = 5,        /* zmq frames completed (and added to a message) */
    FW_PIECES = 6,        /* events sent before their message ended (more set) */
    FW_UNPAIRED = 7,      /* brpc: a server request or response whose other end was not on its thread */
    FW_NCOUNTERS = 8,
};

/* Mirrored by FwEvent in probes/framework.py (checked at every start against
 * the `fw_event_layout` map, whose leaf type bcc derives from this declaration).
 * Only the first `frames` heads are sent: the record is cut after them.
 * Explicit padding: no hole the compiler could place differently. */
struct fw_event {
    u64 ts_ns;            /* entry of the first call, CLOCK_MONOTONIC */
    u64 first_ret_ts_ns;  /* return of the first call */
    u64 ret_ts_ns;        /* return of the last call; brpc: when the record was complete */
    u64 sock;             /* zmq: socket handle; ps: the ZMQVan (this); brpc: the correlation id */
    s64 ret;              /* last call's return: zmq frame bytes; ps message bytes; zmq_socket 0 or -1 */
    u32 tgid;
    u32 tid;
    s32 arg;              /* zmq_msg_send: flags of the last call; zmq_socket: socket type */
    u8 kind;              /* enum fw_kind */
    u8 more;              /* zmq: the message goes on in a later event */
    u8 frames;            /* zmq: frames in this event (1..FW_MAX_FRAMES); ps: 1; zmq_socket, brpc: 0 */
    u8 _pad;
    u64 sizes[FW_MAX_FRAMES];    /* zmq: each frame's size read from its zmq_msg_t */
    u8 head_len[FW_MAX_FRAMES];  /* valid bytes of each head */
    /* [frame][byte], flat: bcc's view of a map's leaf type keeps only one dimension.
     * zmq: first bytes of each frame; ps: start of ps::Meta. */
    u8 heads[FW_MAX_FRAMES * FW_CAPTURE_BYTES];
};

/* A thread's state for one kind: the message so far, and the call in progress. */
struct fw_slot {
    struct fw_event ev;
    u64 call_ts_ns;
    u64 call_sock;
    u64 obj;        /* zmq: zmq_msg_t *; ps: ps::Message * */
    s32 call_arg;
    u8 busy;        /* a call whose return has not come yet */
    u8 call_more;   /* the frame of this call has "more" */
    u8 _pad[2];
};

struct fw_key {
    u32 tid;
    u32 kind;
};

/* LRU: threads that exit leave their slot behind; the oldest are reused. */
BPF_TABLE("lru_hash", struct fw_key, struct fw_slot, inflight, FW_INFLIGHT_MAX);
BPF_PERCPU_ARRAY(counters, u64, FW_NCOUNTERS);
BPF_RINGBUF_OUTPUT(events, FW_RINGBUF_PAGES);
BPF_ARRAY(fw_event_layout, struct fw_event, 1);  /* never written: only its type is used */

/* Never written: the initial value of a thread's slot (too big for the stack). */
BPF_ARRAY(zero_slot, struct fw_slot, 1);

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

/* Size, first bytes and (recv) "more" flag of the frame in a zmq_msg_t, by its
 * type tag, into frame n of the slot's message. The zmq_msg_t is read in one
 * go: each bpf_probe_read_user costs ~100 ns here. */
static __always_inline void read_frame(struct fw_slot *s, u32 n, const u8 *msg, int want_more)
{
    u8 raw[ZMQ_MSG_BYTES];
    const u8 *data = 0;
    u64 size = 0;

    n &= FW_MAX_FRAMES - 1;
    s->ev.sizes[n] = 0;
    s->ev.head_len[n] = 0;
    if (bpf_probe_read_user(raw, sizeof(raw), msg) != 0)
        return;
    if (want_more)
        s->call_more = (raw[ZMQ_FLAGS_OFF] & ZMQ_MORE_MASK) != 0;
    u8 tag = raw[ZMQ_TYPE_OFF];
    if (tag == ZMQ_VSM_TYPE) {
        size = FW_MIN(raw[ZMQ_VSM_SIZE_OFF], ZMQ_VSM_MAX_BYTES);
        s->ev.sizes[n] = size;
        __builtin_memcpy(s->ev.heads + n * FW_CAPTURE_BYTES, raw + ZMQ_VSM_DATA_OFF, FW_VSM_COPY);
        s->ev.head_len[n] = FW_MIN(size, FW_VSM_COPY);
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
    s->ev.sizes[n] = size;
    u32 len = size < FW_CAPTURE_BYTES ? (u32)size : FW_CAPTURE_BYTES;
    /* Bounded for the verifier; a frame shorter than the capture is read exactly,
     * so the read never runs off the end of its buffer into an unmapped page. */
    len &= (2 * FW_CAPTURE_BYTES - 1);
    if (len > FW_CAPTURE_BYTES)
        len = FW_CAPTURE_BYTES;
    if (data && bpf_probe_read_user(s->ev.heads + n * FW_CAPTURE_BYTES, len, data) == 0)
        s->ev.head_len[n] = len;
}

/* This thread's slot for `kind` (made on its first call). */
static __always_inline struct fw_slot *slot_of(u32 tid, u8 kind)
{
    struct fw_key key = {.tid = tid, .kind = kind};
    struct fw_slot *s = inflight.lookup(&key);
    if (s)
        return s;
    u32 zero = 0;
    struct fw_slot *z = zero_slot.lookup(&zero);
    if (!z || inflight.update(&key, z) != 0 || !(s = inflight.lookup(&key)))
        count(FW_INFLIGHT_FULL);
    return s;
}

/* Sends the event in the slot: its fixed part and its first `frames` heads. */
static __always_inline void emit(struct fw_slot *s)
{
    u32 n = s->ev.frames;
    if (n > FW_MAX_FRAMES)
        n = FW_MAX_FRAMES;
    u32 len = offsetof(struct fw_event, heads) + n * FW_CAPTURE_BYTES;
    if (events.ringbuf_output(&s->ev, len, 0) != 0)
        count(FW_LOST);
    else
        count(FW_SEEN);
}

/* Records a call's entry in the slot. */
static __always_inline struct fw_slot *enter(struct pt_regs *ctx, u8 kind)
{
    struct fw_slot *s = slot_of((u32)bpf_get_current_pid_tgid(), kind);
    if (!s)
        return 0;
    s->call_ts_ns = bpf_ktime_get_ns();
    s->call_sock = PT_REGS_PARM2(ctx);
    s->obj = PT_REGS_PARM1(ctx);
    s->call_arg = (s32)PT_REGS_PARM3(ctx);
    s->call_more = 0;
    s->busy = 1;
    return s;
}

/* The slot of this thread's call of `kind` at its return; NULL if its entry was not seen. */
static __always_inline struct fw_slot *leave(u8 kind)
{
    struct fw_key key = {.tid = (u32)bpf_get_current_pid_tgid(), .kind = kind};
    struct fw_slot *s = inflight.lookup(&key);
    if (!s || !s->busy) {
        count(FW_ORPHAN);
        return 0;
    }
    s->busy = 0;
    return s;
}

/* --- zmq frames, accumulated into messages ----------------------------------------- */

/* The message so far goes out as a piece if the frame of this call cannot join it. */
static __always_inline void make_room(struct fw_slot *s)
{
    if (s->ev.frames && (s->ev.sock != s->call_sock || s->ev.frames >= FW_MAX_FRAMES)) {
        s->ev.more = 1;
        emit(s);
        count(FW_PIECES);
        s->ev.frames = 0;
    }
}

/* Frame n of the slot's message is in: the message so far goes out when it was the last. */
static __always_inline void zmq_frame_done(struct fw_slot *s, u32 n, u8 kind, u64 now, s64 ret)
{
    if (n == 0) {
        u64 id = bpf_get_current_pid_tgid();
        s->ev.ts_ns = s->call_ts_ns;
        s->ev.first_ret_ts_ns = now;
        s->ev.sock = s->call_sock;
        s->ev.tgid = id >> 32;
        s->ev.tid = (u32)id;
        s->ev.kind = kind;
    }
    s->ev.ret_ts_ns = now;
    s->ev.ret = ret;
    s->ev.arg = s->call_arg;
    s->ev.frames = n + 1;
    count(FW_FRAMES);
    if (!s->call_more) {
        s->ev.more = 0;
        emit(s);
        s->ev.frames = 0;
    }
}

/* int zmq_msg_send(zmq_msg_t *msg, void *socket, int flags), at its entry only: the
 * frame is read before libzmq moves it out of msg, and the entry's time is the
 * message's send stage (TxStage.FRAMEWORK_CALL), so a uretprobe's trap (about 2 us
 * in the job's thread per frame) would add nothing but the return value. Its
 * "return" times are the entry's, its ret the frame's size. A send that then fails
 * (EAGAIN on a non-blocking socket, EINTR, ETERM: not ps-lite's blocking van's way)
 * still has its record, which no wire message matches: counted
 * framework_unmatched. */
int zmq_send_entry(struct pt_regs *ctx)
{
    struct fw_slot *s = enter(ctx, FW_ZMQ_SEND);
    if (!s)
        return 0;
    s->busy = 0;   /* no return probe will take the slot */
    make_room(s);
    s->call_more = (s->call_arg & 2 /* ZMQ_SNDMORE, public API */) != 0;
    u32 n = s->ev.frames;
    if (n >= FW_MAX_FRAMES)   /* make_room emptied a full slot: not reached */
        return 0;
    read_frame(s, n, (const u8 *)s->obj, 0);
    zmq_frame_done(s, n, FW_ZMQ_SEND, s->call_ts_ns, s->ev.sizes[n & (FW_MAX_FRAMES - 1)]);
    return 0;
}

/* int zmq_msg_recv(zmq_msg_t *msg, void *socket, int flags): read at return, so a
 * failed non-blocking recv on another socket does not cut the message so far. */
int zmq_recv_entry(struct pt_regs *ctx)
{
    enter(ctx, FW_ZMQ_RECV);
    return 0;
}

int zmq_recv_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();   /* the return, before our own reads */
    struct fw_slot *s = leave(FW_ZMQ_RECV);
    if (!s)
        return 0;
    s64 ret = (s32)PT_REGS_RC(ctx);
    if (ret < 0) {
        count(FW_FAILED);
        return 0;
    }
    make_room(s);
    u32 n = s->ev.frames;
    if (n >= FW_MAX_FRAMES)   /* make_room emptied a full slot: not reached */
        return 0;
    read_frame(s, n, (const u8 *)s->obj, 1);   /* the frame is in the zmq_msg_t only now */
    zmq_frame_done(s, n, FW_ZMQ_RECV, now, ret);
    return 0;
}

/* --- one event per call: zmq_socket, ps::ZMQVan ---------------------------------------- */

/* The slot's event as the record of one call that returned at ret_ts_ns. */
static __always_inline void call_event(struct fw_slot *s, u8 kind, s64 ret, u64 sock, u8 frames,
                                       u64 ret_ts_ns)
{
    u64 id = bpf_get_current_pid_tgid();
    s->ev.ts_ns = s->call_ts_ns;
    s->ev.ret_ts_ns = s->ev.first_ret_ts_ns = ret_ts_ns;
    s->ev.sock = sock;
    s->ev.ret = ret;
    s->ev.tgid = id >> 32;
    s->ev.tid = (u32)id;
    s->ev.arg = s->call_arg;
    s->ev.kind = kind;
    s->ev.more = 0;
    s->ev.frames = frames;
    s->ev.sizes[0] = 0;
    if (ret < 0)
        count(FW_FAILED);
    else
        emit(s);
}

/* void *zmq_socket(void *ctx, int type): which handles are ROUTER sockets. */
int zmq_socket_entry(struct pt_regs *ctx)
{
    struct fw_slot *s = enter(ctx, FW_ZMQ_SOCKET);
    if (s)
        s->call_arg = (s32)PT_REGS_PARM2(ctx);
    return 0;
}

int zmq_socket_return(struct pt_regs *ctx)
{
    struct fw_slot *s = leave(FW_ZMQ_SOCKET);
    u64 handle = PT_REGS_RC(ctx);
    if (s)
        call_event(s, FW_ZMQ_SOCKET, handle ? 0 : -1, handle, 0, bpf_ktime_get_ns());
    return 0;
}

/* ps::Message begins with ps::Meta; user space decodes its leading fields. */
static __always_inline void read_ps_meta(struct fw_slot *s)
{
    s->ev.head_len[0] = 0;
    if (bpf_probe_read_user(s->ev.heads, FW_CAPTURE_BYTES, (void *)s->obj) == 0)
        s->ev.head_len[0] = FW_CAPTURE_BYTES;
}

/* int ps::ZMQVan::SendMsg(const ps::Message &msg): this in PARM1, &msg in PARM2. */
static __always_inline int ps_enter(struct pt_regs *ctx, u8 kind, int read_now)
{
    struct fw_slot *s = enter(ctx, kind);
    if (!s)
        return 0;
    s->call_sock = PT_REGS_PARM1(ctx);
    s->obj = PT_REGS_PARM2(ctx);
    s->call_arg = 0;
    if (read_now)
        read_ps_meta(s);
    return 0;
}

int ps_send_entry(struct pt_regs *ctx) { return ps_enter(ctx, FW_PS_SEND, 1); }

int ps_send_return(struct pt_regs *ctx)
{
    struct fw_slot *s = leave(FW_PS_SEND);
    if (s)
        call_event(s, FW_PS_SEND, (s32)PT_REGS_RC(ctx), s->call_sock, 1, bpf_ktime_get_ns());
    return 0;
}

/* int ps::ZMQVan::RecvMsg(ps::Message *msg): the Message is filled at return. */
int ps_recv_entry(struct pt_regs *ctx) { return ps_enter(ctx, FW_PS_RECV, 0); }

int ps_recv_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();   /* the return, before our own read */
    struct fw_slot *s = leave(FW_PS_RECV);
    if (!s)
        return 0;
    s64 ret = (s32)PT_REGS_RC(ctx);
    if (ret >= 0)
        read_ps_meta(s);
    call_event(s, FW_PS_RECV, ret, s->call_sock, 1, now);
    return 0;
}

/* --- brpc: one event per RPC end, entry probes only ------------------------------------
 * Each of the four functions runs once per message of brpc's baidu_std protocol and has
 * the wire's correlation id in reach (docs/paddle.md, "The framework boundary"), so an
 * event is its kind, thread, time and that id; no slot, no copy of the message.
 * The server's request end (ProcessRpcRequest) has no id in a register: its entry time
 * waits in `brpc_request` for the SendRpcResponse that the service's done closure calls
 * inside it, on the same thread and deeper on the same stack; both events go out then. */

struct brpc_request {
    u64 ts_ns;   /* ProcessRpcRequest's entry */
    u64 sp;      /* its stack pointer: SendRpcResponse inside it runs below */
};

/* Far enough for any handler's frames between the two calls, near enough that a
 * SendRpcResponse on another stack (an asynchronous done) is seldom taken for one. */
#define FW_BRPC_NESTED_BYTES (1 << 20)

BPF_TABLE("lru_hash", u32, struct brpc_request, brpc_request, FW_INFLIGHT_MAX);

static __always_inline void brpc_event(u8 kind, u64 ts_ns, u64 done_ns, u64 correlation_id)
{
    /* the fixed part only: frames 0, no heads */
    struct fw_event *e = events.ringbuf_reserve(offsetof(struct fw_event, heads));
    if (!e) {
        count(FW_LOST);
        return;
    }
    u64 id = bpf_get_current_pid_tgid();
    __builtin_memset(e, 0, offsetof(struct fw_event, heads));
    e->ts_ns = e->first_ret_ts_ns = ts_ns;
    e->ret_ts_ns = done_ns;
    e->sock = correlation_id;
    e->tgid = id >> 32;
    e->tid = (u32)id;
    e->kind = kind;
    events.ringbuf_submit(e, 0);
    count(FW_SEEN);
}

/* void PackRpcRequest(IOBuf *buf, SocketMessage **, uint64_t correlation_id,
 *                     const MethodDescriptor *, Controller *, const IOBuf &, const Authenticator *) */
int brpc_client_send(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    brpc_event(FW_BRPC_CLIENT_SEND, now, now, PT_REGS_PARM3(ctx));
    return 0;
}

/* void Controller::OnVersionedRPCReturned(const CompletionInfo &info, bool, int):
 * info = {bthread_id_t id (one u64: the correlation id of the response), bool responded}.
 * Not responded (a timeout, a failed socket): no response came, nothing to record. */
int brpc_client_recv(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    struct { u64 id; u8 responded; u8 _pad[7]; } info;
    if (bpf_probe_read_user(&info, sizeof(info), (void *)PT_REGS_PARM2(ctx)) != 0 || !info.responded) {
        count(FW_FAILED);
        return 0;
    }
    brpc_event(FW_BRPC_CLIENT_RECV, now, now, info.id);
    return 0;
}

/* void ProcessRpcRequest(InputMessageBase *msg) */
int brpc_server_recv(struct pt_regs *ctx)
{
    struct brpc_request r = {.ts_ns = bpf_ktime_get_ns(), .sp = PT_REGS_SP(ctx)};
    u32 tid = (u32)bpf_get_current_pid_tgid();
    if (brpc_request.lookup(&tid))
        count(FW_UNPAIRED);   /* the last one's response did not come on this thread */
    brpc_request.update(&tid, &r);
    return 0;
}

/* void SendRpcResponse(int64_t correlation_id, Controller *, ...) */
int brpc_server_send(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 cid = PT_REGS_PARM1(ctx);
    u64 sp = PT_REGS_SP(ctx);
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct brpc_request *r = brpc_request.lookup(&tid);
    if (r && sp < r->sp && r->sp - sp < FW_BRPC_NESTED_BYTES) {
        brpc_event(FW_BRPC_SERVER_RECV, r->ts_ns, now, cid);
        brpc_request.delete(&tid);
    } else {
        count(FW_UNPAIRED);
    }
    brpc_event(FW_BRPC_SERVER_SEND, now, now, cid);
    return 0;
}
