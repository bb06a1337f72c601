/*
 * wirefwd: the wire of the virtual cluster.
 *
 * A userspace Ethernet frame forwarder. It runs in its own network namespace
 * with one veth end per host ("port"), reads every frame a host sends through
 * an AF_PACKET socket bound to that port, holds it for the one-way delay
 * configured for the ordered pair (source host, destination host), then sends
 * it out of the destination host's port. Destination = the port whose host
 * owns the frame's destination MAC; broadcast, multicast and unknown unicast go
 * to every other port (one copy, one delay, one log record per port).
 *
 * Timing.
 *  - Time in is the kernel's receive timestamp of the frame (SO_TIMESTAMPNS,
 *    CLOCK_REALTIME), converted to CLOCK_MONOTONIC with real - mono checked
 *    right after the receive that returned it (a mono/real/mono bracket, see
 *    read_offset). So the forwarder's own wake-up latency is part of the delay
 *    it applies, not added on top of it, and a step of the realtime clock
 *    (settimeofday: a VM's guest agent setting the time) moves no frame's
 *    time. Steps seen and stamps later than their receive (clamped to it) are
 *    counted in the stats.
 *  - Due time = time in + delay (+ jitter). A frame is held until then: an
 *    absolute CLOCK_MONOTONIC timerfd wakes us spin_ns before it is due, and
 *    the rest is a busy-poll of the sockets (epoll_wait with timeout 0), which
 *    keeps receiving meanwhile. epoll timeouts alone (1 ms granularity) cannot
 *    hold sub-millisecond delays.
 *  - Jitter: uniform in [-J, +J], or normal with standard deviation J; the
 *    delay is clamped at >= 0.
 *  - Order: frames of one ordered pair leave in the order they came in (FIFO):
 *    due = max(sampled due, previous due of that pair). With jitter this turns
 *    would-be reorderings into extra delay (as a FIFO link queue does); the
 *    applied delay in the log is the one after that adjustment. No reordering
 *    within a pair is a design choice, not a limitation to fix.
 *
 * Ground truth: one fixed-size little-endian record per frame per output port
 * (layout below, mirrored in wirelog.py), written whenever the forwarder goes
 * idle and at least every 64 KiB or FLUSH_NS, so a reader can follow the file
 * live. Dropped frames (buffer pool full, send error, still queued at
 * shutdown) are logged with t_out_mono_ns = 0 and a drop reason.
 *
 * Usage: wirefwd CONFIG_FILE. CONFIG_FILE has one directive per line:
 *   log PATH | stats PATH | jitter_ns N | jitter_dist uniform|normal |
 *   seed N | spin_ns N | pool FRAMES | rt_priority N (SCHED_FIFO, 0 = off) |
 *   port IFNAME HOST_MAC      (port index = order of appearance)
 *   delay SRC_IDX DST_IDX NS  (ordered pair; default 0)
 * Prints "ready PID" on stdout once every port is open, then closes stdout.
 * SIGTERM/SIGINT: flush the log, write stats, exit 0. SIGUSR1: write stats.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <math.h>
#include <sched.h>
#include <net/if.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_PORTS 64
#define SLOT_BYTES 2048          /* frames up to MTU 1500 (+ headers) fit */
#define RX_BATCH 32
#define RX_BUDGET_BATCHES 4
#define CLOCK_STEP_NS 20000LL         /* real - mono moved more than this: a step */
#define FLUSH_NS 10000000LL
#define LOGBUF_BYTES (64 * 1024)
#define REC_BYTES 56
#define LOG_MAGIC "PSLATWIR"
#define LOG_VERSION 1u

enum drop_reason { DROP_NONE = 0, DROP_POOL_FULL = 1, DROP_SEND_ERROR = 2, DROP_SHUTDOWN = 3 };

struct port {
    char ifname[IFNAMSIZ];
    unsigned char host_mac[6];
    int fd;
};

struct slot_meta {
    int64_t t_in_ns, due_ns, delay_ns;
    uint64_t serial;             /* tie-break: equal due times leave in arrival order */
    uint16_t len;
    uint8_t src, dst;
};

static struct port ports[MAX_PORTS];
static int nports;
static int64_t delay_ns[MAX_PORTS][MAX_PORTS];
static int64_t last_due_ns[MAX_PORTS][MAX_PORTS];
static int64_t jitter_ns;
static int jitter_normal;
static int64_t spin_ns = 50000;
static int rt_priority;          /* SCHED_FIFO priority; 0 = normal scheduling */
static uint32_t pool_frames = 32768;
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static char log_path[4096], stats_path[4096];

static unsigned char *pool;      /* pool_frames * SLOT_BYTES */
static struct slot_meta *meta;
static uint32_t *free_list, free_n;
static uint32_t *heap, heap_n;   /* min-heap of slots by (due_ns, serial) */
static uint64_t next_serial;

static int log_fd = -1;
static unsigned char logbuf[LOGBUF_BYTES];
static size_t logbuf_n;
static int64_t last_flush_ns;

static int64_t real_minus_mono_ns;

static volatile sig_atomic_t stop_requested, stats_requested;

static struct {
    uint64_t frames_in, records_out, bytes_in, dropped_pool, dropped_send,
        dropped_oversize, kernel_drops, max_queued, clock_steps, stamps_after_receive;
    int64_t late_max_ns, clock_step_max_ns;
} st;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("wirefwd: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int64_t clock_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* real - mono, from mono/real/mono brackets (see Timing); returns the last
 * bracket's closing CLOCK_MONOTONIC reading. A bracket says real - mono lies in
 * [r - m2, r - m1]; the kernel keeps real - mono constant between steps (NTP
 * slews both clocks alike), so the brackets since the last step are intersected
 * and the middle of what is left is the offset. One bracket's middle alone was
 * up to 2.5 us off (4.6 us of spread over 2M brackets here, against 67 ns for
 * their intersection), more than a send's lead on the wire's receive. A bracket
 * disjoint from the interval is a step: the interval starts again from it. */
static int64_t offset_lo_ns, offset_hi_ns;

static int64_t read_offset(void) {
    int64_t m1 = clock_ns(CLOCK_MONOTONIC);
    int64_t r = clock_ns(CLOCK_REALTIME);
    int64_t m2 = clock_ns(CLOCK_MONOTONIC);
    int64_t lo = r - m2, hi = r - m1;
    if (!real_minus_mono_ns || lo > offset_hi_ns || hi < offset_lo_ns) {
        int64_t step = lo + (hi - lo) / 2 - real_minus_mono_ns;
        if (step < 0) step = -step;
        if (real_minus_mono_ns && step > CLOCK_STEP_NS) {
            st.clock_steps++;
            if (step > st.clock_step_max_ns) st.clock_step_max_ns = step;
        }
        offset_lo_ns = lo;
        offset_hi_ns = hi;
    } else {
        if (lo > offset_lo_ns) offset_lo_ns = lo;
        if (hi < offset_hi_ns) offset_hi_ns = hi;
    }
    real_minus_mono_ns = offset_lo_ns + (offset_hi_ns - offset_lo_ns) / 2;
    return m2;
}

/* xorshift64*: enough for jitter, reproducible from the seed. */
static double rand_unit(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}

static int64_t sample_delay(int src, int dst) {
    int64_t d = delay_ns[src][dst];
    if (jitter_ns > 0) {
        double j;
        if (jitter_normal) { /* Box-Muller */
            double u1 = rand_unit(), u2 = rand_unit();
            if (u1 < 1e-300) u1 = 1e-300;
            j = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2) * (double)jitter_ns;
        } else {
            j = (rand_unit() * 2.0 - 1.0) * (double)jitter_ns;
        }
        d += (int64_t)llround(j);
    }
    return d < 0 ? 0 : d;
}

/* ---- log ---------------------------------------------------------------- */

static void log_flush(int64_t now_ns) {
    size_t off = 0;
    while (off < logbuf_n) {
        ssize_t w = write(log_fd, logbuf + off, logbuf_n - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            die("cannot write the log %s: %s", log_path, strerror(errno));
        }
        off += (size_t)w;
    }
    logbuf_n = 0;
    last_flush_ns = now_ns;
}

static void put16(unsigned char *p, uint16_t v) { v = htole16(v); memcpy(p, &v, 2); }
static void put32(unsigned char *p, uint32_t v) { v = htole32(v); memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { v = htole64(v); memcpy(p, &v, 8); }
static uint16_t be16at(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t be32at(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/*
 * Record layout (56 bytes, little-endian):
 *  0 u64 t_in_mono_ns    8 u64 t_out_mono_ns (0: dropped)   16 i64 delay_applied_ns
 * 24 u8 src_idx  25 u8 dst_idx  26 u16 ethertype  28 u8[4] ip_src  32 u8[4] ip_dst
 *    (addresses as on the wire, network order; zero if not IPv4)
 * 36 u16 sport  38 u16 dport (TCP or UDP)  40 u32 seq  44 u32 ack (TCP)
 * 48 u8 tcp_flags  49 u8 ip_proto  50 u16 payload_len (TCP/UDP payload bytes)
 * 52 u16 frame_len  54 u8 drop_reason (0 sent, 1 pool full, 2 send error, 3 shutdown)
 * 55 u8 reserved
 */
static void log_record(const struct slot_meta *m, const unsigned char *f, int64_t t_out_ns,
                       int drop_reason) {
    unsigned char *r = logbuf + logbuf_n;
    memset(r, 0, REC_BYTES);
    put64(r + 0, (uint64_t)m->t_in_ns);
    put64(r + 8, (uint64_t)t_out_ns);
    put64(r + 16, (uint64_t)m->delay_ns);
    r[24] = m->src;
    r[25] = m->dst;
    r[54] = (unsigned char)drop_reason;
    put16(r + 52, m->len);
    if (m->len >= 14) {
        uint16_t et = be16at(f + 12);
        put16(r + 26, et);
        const unsigned char *ip = f + 14;
        size_t iplen_avail = m->len - 14;
        if (et == ETH_P_IP && iplen_avail >= 20 && (ip[0] >> 4) == 4) {
            size_t ihl = (size_t)(ip[0] & 0x0f) * 4;
            uint16_t tot = be16at(ip + 2);
            uint8_t proto = ip[9];
            memcpy(r + 28, ip + 12, 4);
            memcpy(r + 32, ip + 16, 4);
            r[49] = proto;
            const unsigned char *l4 = ip + ihl;
            if (proto == IPPROTO_TCP && iplen_avail >= ihl + 20 && tot >= ihl + 20) {
                size_t doff = (size_t)(l4[12] >> 4) * 4;
                put16(r + 36, be16at(l4));
                put16(r + 38, be16at(l4 + 2));
                put32(r + 40, be32at(l4 + 4));
                put32(r + 44, be32at(l4 + 8));
                r[48] = l4[13];
                if (tot >= ihl + doff) put16(r + 50, (uint16_t)(tot - ihl - doff));
            } else if (proto == IPPROTO_UDP && iplen_avail >= ihl + 8) {
                put16(r + 36, be16at(l4));
                put16(r + 38, be16at(l4 + 2));
                uint16_t ulen = be16at(l4 + 4);
                if (ulen >= 8) put16(r + 50, (uint16_t)(ulen - 8));
            }
        }
    }
    logbuf_n += REC_BYTES;
    if (logbuf_n + REC_BYTES > LOGBUF_BYTES) log_flush(clock_ns(CLOCK_MONOTONIC));
}

/* ---- pool and heap ------------------------------------------------------ */

static int heap_less(uint32_t a, uint32_t b) {
    if (meta[a].due_ns != meta[b].due_ns) return meta[a].due_ns < meta[b].due_ns;
    return meta[a].serial < meta[b].serial;
}

static void heap_push(uint32_t s) {
    uint32_t i = heap_n++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!heap_less(s, heap[p])) break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = s;
    if (heap_n > st.max_queued) st.max_queued = heap_n;
}

static uint32_t heap_pop(void) {
    uint32_t top = heap[0], last = heap[--heap_n], i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= heap_n) break;
        if (c + 1 < heap_n && heap_less(heap[c + 1], heap[c])) c++;
        if (!heap_less(heap[c], last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_n) heap[i] = last;
    return top;
}

static int slot_alloc(uint32_t *s) {
    if (!free_n) return 0;
    *s = free_list[--free_n];
    return 1;
}

static void slot_free(uint32_t s) { free_list[free_n++] = s; }

/* ---- forwarding --------------------------------------------------------- */

static void schedule(uint32_t s, int src, int dst) {
    struct slot_meta *m = &meta[s];
    m->src = (uint8_t)src;
    m->dst = (uint8_t)dst;
    int64_t due = m->t_in_ns + sample_delay(src, dst);
    if (due < last_due_ns[src][dst]) due = last_due_ns[src][dst]; /* per-pair FIFO */
    last_due_ns[src][dst] = due;
    m->due_ns = due;
    m->delay_ns = due - m->t_in_ns;
    m->serial = next_serial++;
    heap_push(s);
}

static int port_of_mac(const unsigned char *mac) {
    for (int i = 0; i < nports; i++)
        if (!memcmp(ports[i].host_mac, mac, 6)) return i;
    return -1;
}

/* One received frame in slot s: queue it for its port, or a copy for every
 * other port when it is broadcast/multicast/unknown unicast. */
static void route(uint32_t s, int src) {
    const unsigned char *f = pool + (size_t)s * SLOT_BYTES;
    int dst = (f[0] & 1) ? -1 : port_of_mac(f);
    if (dst == src) { slot_free(s); return; } /* a host talking to itself never reaches the wire */
    if (dst >= 0) { schedule(s, src, dst); return; }
    int first = 1;
    for (int p = 0; p < nports; p++) {
        if (p == src) continue;
        uint32_t c = s;
        if (!first) {
            if (!slot_alloc(&c)) { /* log the lost copy, then drop it */
                struct slot_meta lost = meta[s];
                lost.src = (uint8_t)src;
                lost.dst = (uint8_t)p;
                lost.delay_ns = 0;
                log_record(&lost, f, 0, DROP_POOL_FULL);
                st.dropped_pool++;
                continue;
            }
            memcpy(pool + (size_t)c * SLOT_BYTES, f, meta[s].len);
            meta[c] = meta[s];
        }
        first = 0;
        schedule(c, src, p);
    }
    if (first) slot_free(s); /* a one-port wire: nobody to send to */
}

/* Send every frame that is due, one send() each, its t_out read just before
 * it: the log is the tests' truth per frame. (With one sendmmsg per batch the
 * k-th frame of a batch left up to k * 3 us after the batch's one t_out: 150 us
 * late on record for the last segment of a 50-segment burst.) */
static void send_due(void) {
    for (;;) {
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        if (!heap_n || meta[heap[0]].due_ns > now) return;
        uint32_t slot = heap_pop();
        const struct slot_meta *m = &meta[slot];
        const unsigned char *f = pool + (size_t)slot * SLOT_BYTES;
        int64_t t_out = clock_ns(CLOCK_MONOTONIC); /* handed to the kernel now */
        if (send(ports[m->dst].fd, f, m->len, MSG_DONTWAIT) == (ssize_t)m->len) {
            st.records_out++;
            if (t_out - m->due_ns > st.late_max_ns) st.late_max_ns = t_out - m->due_ns;
            log_record(m, f, t_out, DROP_NONE);
        } else {
            st.dropped_send++;
            log_record(m, f, 0, DROP_SEND_ERROR);
        }
        slot_free(slot);
    }
}

/* Drain up to RX_BUDGET_BATCHES batches from one port. */
static void receive(int src) {
    struct mmsghdr msgs[RX_BATCH];
    struct iovec iov[RX_BATCH];
    struct sockaddr_ll from[RX_BATCH];
    char ctrl[RX_BATCH][CMSG_SPACE(sizeof(struct timespec)) + 64];
    uint32_t slots[RX_BATCH];

    for (int b = 0; b < RX_BUDGET_BATCHES; b++) {
        int n = 0;
        for (; n < RX_BATCH; n++) {
            if (!slot_alloc(&slots[n])) break;
            iov[n].iov_base = pool + (size_t)slots[n] * SLOT_BYTES;
            iov[n].iov_len = SLOT_BYTES;
            memset(&msgs[n].msg_hdr, 0, sizeof msgs[n].msg_hdr);
            msgs[n].msg_hdr.msg_iov = &iov[n];
            msgs[n].msg_hdr.msg_iovlen = 1;
            msgs[n].msg_hdr.msg_name = &from[n];
            msgs[n].msg_hdr.msg_namelen = sizeof from[n];
            msgs[n].msg_hdr.msg_control = ctrl[n];
            msgs[n].msg_hdr.msg_controllen = sizeof ctrl[n];
        }
        if (n == 0) {
            /* Pool full: take one frame into a scratch slot to log and drop it,
             * so the kernel queue does not silently overflow instead. */
            static unsigned char scratch[SLOT_BYTES];
            ssize_t r = recv(ports[src].fd, scratch, sizeof scratch, MSG_DONTWAIT);
            if (r > 0) { st.frames_in++; st.dropped_pool++; }
            return;
        }
        int got = recvmmsg(ports[src].fd, msgs, (unsigned)n, MSG_DONTWAIT, NULL);
        if (got < 0) got = 0;
        int64_t now_mono = read_offset();
        for (int i = 0; i < got; i++) {
            struct slot_meta *m = &meta[slots[i]];
            if (from[i].sll_pkttype == PACKET_OUTGOING) { slot_free(slots[i]); continue; }
            st.frames_in++;
            st.bytes_in += msgs[i].msg_len;
            if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
                st.dropped_oversize++;
                slot_free(slots[i]);
                continue;
            }
            m->len = (uint16_t)msgs[i].msg_len;
            m->t_in_ns = now_mono; /* fallback if the kernel gave no timestamp */
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c;
                 c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(c), sizeof ts);
                    m->t_in_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec - real_minus_mono_ns;
                    if (m->t_in_ns > now_mono) { /* a stamp cannot follow its receive */
                        st.stamps_after_receive++;
                        m->t_in_ns = now_mono;
                    }
                }
            }
            route(slots[i], src);
        }
        for (int i = got; i < n; i++) slot_free(slots[i]);
        if (got < n) return; /* socket drained */
    }
}

/* ---- set-up ------------------------------------------------------------- */

static int parse_mac(const char *s, unsigned char mac[6]) {
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return 0;
    for (int i = 0; i < 6; i++) {
        if (v[i] > 255) return 0;
        mac[i] = (unsigned char)v[i];
    }
    return 1;
}

static void read_config(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open config %s: %s", path, strerror(errno));
    char line[4352];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char key[32], a[4096], b[64];
        long long n1, n2, n3;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (sscanf(line, "%31s", key) != 1) continue;
        if (!strcmp(key, "log") && sscanf(line, "%*s %4095s", a) == 1) {
            snprintf(log_path, sizeof log_path, "%s", a);
        } else if (!strcmp(key, "stats") && sscanf(line, "%*s %4095s", a) == 1) {
            snprintf(stats_path, sizeof stats_path, "%s", a);
        } else if (!strcmp(key, "jitter_ns") && sscanf(line, "%*s %lld", &n1) == 1 && n1 >= 0) {
            jitter_ns = n1;
        } else if (!strcmp(key, "jitter_dist") && sscanf(line, "%*s %63s", b) == 1 &&
                   (!strcmp(b, "uniform") || !strcmp(b, "normal"))) {
            jitter_normal = !strcmp(b, "normal");
        } else if (!strcmp(key, "seed") && sscanf(line, "%*s %lld", &n1) == 1) {
            rng_state = (uint64_t)n1 * 0x9e3779b97f4a7c15ULL + 1;
        } else if (!strcmp(key, "spin_ns") && sscanf(line, "%*s %lld", &n1) == 1 && n1 >= 0) {
            spin_ns = n1;
        } else if (!strcmp(key, "rt_priority") && sscanf(line, "%*s %lld", &n1) == 1 && n1 >= 0 &&
                   n1 <= 99) {
            rt_priority = (int)n1;
        } else if (!strcmp(key, "pool") && sscanf(line, "%*s %lld", &n1) == 1 && n1 >= 64 &&
                   n1 <= (1 << 22)) {
            pool_frames = (uint32_t)n1;
        } else if (!strcmp(key, "port") && sscanf(line, "%*s %4095s %63s", a, b) == 2) {
            if (nports == MAX_PORTS) die("%s:%d: more than %d ports", path, lineno, MAX_PORTS);
            if (strlen(a) >= IFNAMSIZ) die("%s:%d: interface name too long", path, lineno);
            if (!parse_mac(b, ports[nports].host_mac)) die("%s:%d: bad MAC %s", path, lineno, b);
            snprintf(ports[nports].ifname, IFNAMSIZ, "%s", a);
            nports++;
        } else if (!strcmp(key, "delay") && sscanf(line, "%*s %lld %lld %lld", &n1, &n2, &n3) == 3 &&
                   n1 >= 0 && n1 < MAX_PORTS && n2 >= 0 && n2 < MAX_PORTS && n3 >= 0) {
            delay_ns[n1][n2] = n3;
        } else {
            die("%s:%d: cannot parse: %s", path, lineno, line);
        }
    }
    fclose(f);
    if (!log_path[0]) die("%s: no 'log PATH' line", path);
    if (nports < 1) die("%s: no 'port' lines", path);
}

static void open_port(struct port *p) {
    /* Protocol 0 until bound: an ETH_P_ALL socket would queue frames of every
     * interface in the namespace between socket() and bind(). */
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket(AF_PACKET): %s (needs root / CAP_NET_RAW)", strerror(errno));
    unsigned idx = if_nametoindex(p->ifname);
    if (!idx) die("no interface %s in this namespace", p->ifname);
    int one = 1, rcvbuf = 8 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) < 0)
        die("SO_TIMESTAMPNS on %s: %s", p->ifname, strerror(errno));
    /* our own transmissions on this port are not input */
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0)
        fprintf(stderr, "wirefwd: PACKET_IGNORE_OUTGOING unsupported; filtering by pkttype\n");
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_ll sll = {0};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = (int)idx;
    if (bind(fd, (struct sockaddr *)&sll, sizeof sll) < 0)
        die("bind to %s: %s", p->ifname, strerror(errno));
    /* frames already queued before bind() are not ours to judge: drop them */
    unsigned char junk[SLOT_BYTES];
    while (recv(fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {}
    p->fd = fd;
}

static void write_stats(void) {
    if (!stats_path[0]) return;
    for (int i = 0; i < nports; i++) {
        struct tpacket_stats ps;
        socklen_t l = sizeof ps;
        if (getsockopt(ports[i].fd, SOL_PACKET, PACKET_STATISTICS, &ps, &l) == 0)
            st.kernel_drops += ps.tp_drops; /* the kernel resets them on read */
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", stats_path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f,
            "{\"frames_in\": %" PRIu64 ", \"records_out\": %" PRIu64 ", \"bytes_in\": %" PRIu64
            ", \"dropped_pool\": %" PRIu64 ", \"dropped_send\": %" PRIu64
            ", \"dropped_oversize\": %" PRIu64 ", \"kernel_drops\": %" PRIu64
            ", \"max_queued\": %" PRIu64 ", \"late_max_ns\": %" PRId64
            ", \"queued_now\": %u, \"spin_ns\": %" PRId64 ", \"pool_frames\": %u"
            ", \"clock_steps\": %" PRIu64 ", \"clock_step_max_ns\": %" PRId64
            ", \"stamps_after_receive\": %" PRIu64 ", \"cpu_ns\": %" PRId64 "}\n",
            st.frames_in, st.records_out, st.bytes_in, st.dropped_pool, st.dropped_send,
            st.dropped_oversize, st.kernel_drops, st.max_queued, st.late_max_ns, heap_n, spin_ns,
            pool_frames, st.clock_steps, st.clock_step_max_ns, st.stamps_after_receive,
            clock_ns(CLOCK_PROCESS_CPUTIME_ID));
    fclose(f);
    rename(tmp, stats_path);
}

static void on_stop(int sig) { (void)sig; stop_requested = 1; }
static void on_stats(int sig) { (void)sig; stats_requested = 1; }

static void install_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_stop; /* no SA_RESTART: epoll_wait returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_stats;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void arm_timer(int tfd, int64_t at_ns, int64_t *armed_ns) {
    if (*armed_ns == at_ns) return;
    struct itimerspec its = {0};
    its.it_value.tv_sec = at_ns / 1000000000LL;
    its.it_value.tv_nsec = at_ns % 1000000000LL;
    if (at_ns == 0) its.it_value.tv_nsec = 0; /* disarm */
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
    *armed_ns = at_ns;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: wirefwd CONFIG_FILE\n");
        return 2;
    }
    read_config(argv[1]);
    install_signals();
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    if (rt_priority > 0) {
        /* A wire must not wait behind the processes it connects: on shared
         * cores a normal-priority forwarder wakes milliseconds late when the
         * hosts are busy. The kernel's RT throttling (sched_rt_runtime_us)
         * still leaves the others CPU if the forwarder saturates. */
        struct sched_param sp = {.sched_priority = rt_priority};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
            fprintf(stderr, "wirefwd: SCHED_FIFO %d refused (%s); running at normal priority\n",
                    rt_priority, strerror(errno));
    }

    pool = malloc((size_t)pool_frames * SLOT_BYTES);
    meta = calloc(pool_frames, sizeof *meta);
    free_list = malloc(pool_frames * sizeof *free_list);
    heap = malloc(pool_frames * sizeof *heap);
    if (!pool || !meta || !free_list || !heap) die("out of memory for %u frames", pool_frames);
    for (uint32_t i = 0; i < pool_frames; i++) free_list[i] = pool_frames - 1 - i;
    free_n = pool_frames;

    log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) die("cannot create the log %s: %s", log_path, strerror(errno));
    unsigned char hdr[16];
    memcpy(hdr, LOG_MAGIC, 8);
    put32(hdr + 8, LOG_VERSION);
    put32(hdr + 12, REC_BYTES);
    if (write(log_fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) die("cannot write the log header");

    int ep = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ep < 0 || tfd < 0) die("epoll/timerfd: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN};
    for (int i = 0; i < nports; i++) {
        open_port(&ports[i]);
        ev.data.u32 = (uint32_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, ports[i].fd, &ev);
    }
    ev.data.u32 = MAX_PORTS;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);

    read_offset();
    int64_t armed_ns = 0;
    last_flush_ns = clock_ns(CLOCK_MONOTONIC);

    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) { dup2(devnull, STDOUT_FILENO); close(devnull); }

    struct epoll_event evs[MAX_PORTS + 1];
    while (!stop_requested) {
        send_due();
        int64_t now = clock_ns(CLOCK_MONOTONIC);
        if (stats_requested) { stats_requested = 0; write_stats(); }

        int timeout_ms = -1;
        if (heap_n && meta[heap[0]].due_ns - now <= spin_ns) {
            timeout_ms = 0; /* the last stretch: busy-poll */
            if (logbuf_n && now - last_flush_ns > FLUSH_NS) log_flush(now);
        } else {
            arm_timer(tfd, heap_n ? meta[heap[0]].due_ns - spin_ns : 0, &armed_ns);
            if (logbuf_n) log_flush(now); /* going idle: let readers see it */
        }
        int n = epoll_wait(ep, evs, MAX_PORTS + 1, timeout_ms);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u32 == MAX_PORTS) {
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) > 0) armed_ns = 0;
            } else {
                receive((int)evs[i].data.u32);
            }
        }
    }
    while (heap_n) { /* still on the wire when it was cut: logged, not lost silently */
        uint32_t s = heap_pop();
        log_record(&meta[s], pool + (size_t)s * SLOT_BYTES, 0, DROP_SHUTDOWN);
    }
    log_flush(clock_ns(CLOCK_MONOTONIC));
    close(log_fd);
    write_stats();
    return 0;
}
