/* Shared by every probe: kernel reads at BTF offsets, the filters, counters.
 *
 * Kernel structs are never read through the (wrong) installed headers: every
 * OFF_* constant is a byte offset taken from this kernel's BTF by
 * probes/program.py and passed in with -D, and reads go through
 * bpf_probe_read_kernel at `address + OFF_*`. Addresses are kept as u64 so
 * bcc's rewriter leaves them alone.
 *
 * Filters: FILTER_* are 0/1 constants from the loader; the sets themselves are
 * in hash maps the loader fills with validated integers.
 */
#ifndef PSLAT_COMMON_BPF_H
#define PSLAT_COMMON_BPF_H

#include "events.h"

#define AF_INET_ 2
#define AF_INET6_ 10
#define IPPROTO_TCP_ 6
#define SOCK_STREAM_ 1
#define S_IFMT_ 00170000
#define S_IFSOCK_ 0140000

static __always_inline u64 kread_u64(u64 addr)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline u32 kread_u32(u64 addr)
{
	u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
	return v;
}

static __always_inline u16 kread_u16(u64 addr)
{
	u16 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
	return v;
}

/* A tracepoint's field at a constant offset (from its tracefs format). */
#define TP_U64(ctx, off) (*(u64 *)((char *)(ctx) + (off)))
#define TP_S64(ctx, off) (*(s64 *)((char *)(ctx) + (off)))
#define TP_U32(ctx, off) (*(u32 *)((char *)(ctx) + (off)))
#define TP_S32(ctx, off) (*(s32 *)((char *)(ctx) + (off)))
#define TP_U16(ctx, off) (*(u16 *)((char *)(ctx) + (off)))

/* ---- filters ------------------------------------------------------------ */

struct comm_key {
	char comm[16];
};

#if FILTER_TGIDS
BPF_HASH(filter_tgids, u32, u8, FILTER_TGIDS_MAX);
#endif
#if FILTER_COMMS
BPF_HASH(filter_comms, struct comm_key, u8, FILTER_COMMS_MAX);
#endif
#if FILTER_PORTS
BPF_HASH(filter_ports, u16, u8, FILTER_PORTS_MAX);
#endif
#if FILTER_NETNS
BPF_HASH(filter_netns, u32, u8, FILTER_NETNS_MAX);
#endif

/* The current process is selected by --pid or --comm (either matches), or by
 * default when neither was given. --comm matches the process (its thread group
 * leader's comm), not the thread: libzmq names its I/O threads "ZMQbg/IO/0". */
static __always_inline int process_selected(u32 tgid)
{
#if FILTER_TGIDS || FILTER_COMMS
#if FILTER_TGIDS
	if (filter_tgids.lookup(&tgid))
		return 1;
#endif
#if FILTER_COMMS
	struct comm_key key = {};
	u64 task = bpf_get_current_task();
	u64 leader = kread_u64(task + OFF_TASK_GROUP_LEADER);
	bpf_probe_read_kernel(&key.comm, sizeof(key.comm), (void *)(leader + OFF_TASK_COMM));
	/* The map keys are zero-padded after the NUL; make ours the same. */
	int seen_nul = 0;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (key.comm[i] == 0)
			seen_nul = 1;
		if (seen_nul)
			key.comm[i] = 0;
	}
	if (filter_comms.lookup(&key))
		return 1;
#endif
	return 0;
#else
	return 1;
#endif
}

/* Inode number of the network namespace a socket lives in. */
static __always_inline u32 sock_netns_ino(u64 sk)
{
	u64 net = kread_u64(sk + OFF_SKC_NET);
	return net ? kread_u32(net + OFF_NET_NS_INUM) : 0;
}

/* The socket is selected by --netns and --port (both must match when given). */
static __always_inline int sock_selected(u64 sk)
{
#if FILTER_NETNS
	u32 ino = sock_netns_ino(sk);
	if (!filter_netns.lookup(&ino))
		return 0;
#endif
#if FILTER_PORTS
	u16 sport = kread_u16(sk + OFF_SKC_NUM);
	u16 dport = bpf_ntohs(kread_u16(sk + OFF_SKC_DPORT));
	if (!filter_ports.lookup(&sport) && !filter_ports.lookup(&dport))
		return 0;
#endif
	return 1;
}

/* ---- host-pair sampling (load shedding; DESIGN.md "Sampling") ------------
 *
 * When the agent cannot keep up it keeps whole host pairs: a hash of the
 * UNORDERED pair of addresses, so a request and its response (different
 * connections, ps-lite answers on its own one) and both ends of the pair
 * decide alike. pslat_sampling[0] is the share shed, in 1/65536: a pair whose
 * 16-bit hash is below it is dropped. 0, the value a fresh map holds, keeps
 * everything; the agent writes the map at run time (probes/filters.py has the
 * Python mirror of the hash and the units). A lower rate sheds a superset of
 * what a higher one shed, so a rate change never swaps one pair for another.
 *
 * Addresses enter as IPv6 (IPv4 as v4-mapped ::ffff:a.b.c.d, so a dual-stack
 * socket and an IPv4 one of the same pair agree), two big-endian u64 words
 * each, the smaller address first; PSLAT_PAIR_SEED comes from probes/filters.py.
 */
BPF_ARRAY(pslat_sampling, u32, 1);
/* what was shed, per kind (PSLAT_SHED_*), so losses on purpose are counted */
#define PSLAT_SHED_CALLS 0     /* send/recv calls of unsampled pairs not traced */
#define PSLAT_SHED_NETSTACK 1  /* netstack events of unsampled pairs not emitted */
#define PSLAT_SHED_NR 2
BPF_PERCPU_ARRAY(pslat_shed_counters, u64, PSLAT_SHED_NR);

static __always_inline void pslat_count_shed(int slot)
{
	u64 *v = pslat_shed_counters.lookup(&slot);
	if (v)
		*v += 1;
}

/* murmur3's 64-bit finaliser: every input bit moves every output bit */
static __always_inline u64 pslat_mix64(u64 x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

static __always_inline u32 pslat_pair_hash16(u64 ahi, u64 alo, u64 bhi, u64 blo)
{
	if (ahi > bhi || (ahi == bhi && alo > blo)) {
		u64 t = ahi;
		ahi = bhi;
		bhi = t;
		t = alo;
		alo = blo;
		blo = t;
	}
	u64 h = PSLAT_PAIR_SEED;
	h = pslat_mix64(h ^ ahi);
	h = pslat_mix64(h ^ alo);
	h = pslat_mix64(h ^ bhi);
	h = pslat_mix64(h ^ blo);
	return (u32)(h >> 48);
}

/* An address as FILL_TUPLE stores it (IPv4 in the first 4 bytes) -> words. */
static __always_inline void pslat_addr_words(u16 family, const u8 *a, u64 *hi, u64 *lo)
{
	/* memcpy: `a` may be unaligned, and the verifier refuses unaligned stack reads */
	if (family == AF_INET6_) {
		u64 w[2];
		__builtin_memcpy(w, a, 16);
		*hi = __builtin_bswap64(w[0]);
		*lo = __builtin_bswap64(w[1]);
	} else {
		u32 v4;
		__builtin_memcpy(&v4, a, 4);
		*hi = 0;
		*lo = 0x0000ffff00000000ULL | bpf_ntohl(v4);
	}
}

static __always_inline u32 pslat_addrs_hash16(u16 family, const u8 *saddr, const u8 *daddr)
{
	u64 ahi, alo, bhi, blo;
	pslat_addr_words(family, saddr, &ahi, &alo);
	pslat_addr_words(family, daddr, &bhi, &blo);
	return pslat_pair_hash16(ahi, alo, bhi, blo);
}

/* The pair hash of a socket, read from the kernel (callers that see a socket
 * once; sockcalls caches it per connection). */
static __always_inline u32 pslat_sock_hash16(u64 sk)
{
	u8 s[16] = {}, d[16] = {};
	u16 family = kread_u16(sk + OFF_SKC_FAMILY);
	if (family == AF_INET6_) {
		bpf_probe_read_kernel(s, 16, (void *)(sk + OFF_SKC_V6_RCV_SADDR));
		bpf_probe_read_kernel(d, 16, (void *)(sk + OFF_SKC_V6_DADDR));
	} else {
		bpf_probe_read_kernel(s, 4, (void *)(sk + OFF_SKC_RCV_SADDR));
		bpf_probe_read_kernel(d, 4, (void *)(sk + OFF_SKC_DADDR));
	}
	return pslat_addrs_hash16(family, s, d);
}

/* The share shed now, in 1/65536 (0: every pair is kept). */
static __always_inline u32 pslat_shed_units(void)
{
	int zero = 0;
	u32 *v = pslat_sampling.lookup(&zero);
	return v ? *v : 0;
}

/* Is the pair of these addresses (as FILL_TUPLE stores them) sampled now? */
static __always_inline int pslat_addrs_sampled(u16 family, const u8 *saddr, const u8 *daddr)
{
	u32 shed = pslat_shed_units();
	return !shed || pslat_addrs_hash16(family, saddr, daddr) >= shed;
}

/* Is a socket's pair sampled? Reads its addresses only while shedding. */
static __always_inline int pslat_sock_sampled(u64 sk)
{
	u32 shed = pslat_shed_units();
	return !shed || pslat_sock_hash16(sk) >= shed;
}

/* fd of the current task -> its struct sock, or 0 when the fd is not an
 * IPv4/IPv6 TCP socket. Walks task->files->fdt->fd[fd] -> file ->
 * (S_IFSOCK inode) -> file->private_data (struct socket) -> socket->sk. */
static __always_inline u64 fd_to_tcp_sock(u32 fd)
{
	u64 task = bpf_get_current_task();
	u64 files = kread_u64(task + OFF_TASK_FILES);
	if (!files)
		return 0;
	u64 fdt = kread_u64(files + OFF_FILES_FDT);
	if (!fdt)
		return 0;
	if (fd >= kread_u32(fdt + OFF_FDT_MAX_FDS))
		return 0;
	u64 fdarr = kread_u64(fdt + OFF_FDT_FD);
	u64 file = kread_u64(fdarr + (u64)fd * 8);
	if (!file)
		return 0;
	u64 inode = kread_u64(file + OFF_FILE_F_INODE);
	if (!inode || (kread_u16(inode + OFF_INODE_I_MODE) & S_IFMT_) != S_IFSOCK_)
		return 0;
	u64 socket = kread_u64(file + OFF_FILE_PRIVATE_DATA);
	if (!socket)
		return 0;
	u64 sk = kread_u64(socket + OFF_SOCKET_SK);
	if (!sk)
		return 0;
	u16 family = kread_u16(sk + OFF_SKC_FAMILY);
	if (family != AF_INET_ && family != AF_INET6_)
		return 0;
	if (kread_u16(sk + OFF_SK_PROTOCOL) != IPPROTO_TCP_ || kread_u16(sk + OFF_SK_TYPE) != SOCK_STREAM_)
		return 0;
	return sk;
}

/* The 4-tuple of a socket, into an event's fields. */
#define FILL_TUPLE(ev, sk)                                                              \
	do {                                                                            \
		(ev)->family = kread_u16((sk) + OFF_SKC_FAMILY);                        \
		(ev)->sport = kread_u16((sk) + OFF_SKC_NUM);                            \
		(ev)->dport = bpf_ntohs(kread_u16((sk) + OFF_SKC_DPORT));               \
		if ((ev)->family == AF_INET6_) {                                        \
			bpf_probe_read_kernel((ev)->saddr, 16, (void *)((sk) + OFF_SKC_V6_RCV_SADDR)); \
			bpf_probe_read_kernel((ev)->daddr, 16, (void *)((sk) + OFF_SKC_V6_DADDR)); \
		} else {                                                                \
			bpf_probe_read_kernel((ev)->saddr, 4, (void *)((sk) + OFF_SKC_RCV_SADDR)); \
			bpf_probe_read_kernel((ev)->daddr, 4, (void *)((sk) + OFF_SKC_DADDR)); \
		}                                                                       \
	} while (0)

#endif /* PSLAT_COMMON_BPF_H */
