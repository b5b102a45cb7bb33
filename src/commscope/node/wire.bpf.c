/* In-kernel wire accounting: bytes, frames and socket buffers per time bin and peer, on tc clsact.
 *
 * Loaded twice on a node's experiment interface by `python -m commscope.node.wire` (which also
 * builds it, see build_object): section "tc/ingress" on clsact ingress, "tc/egress" on clsact
 * egress, each load with its own maps. Per packet it adds the bytes and frames it puts on the
 * wire into the slot of
 *
 *     peer slot (from cs_peers, 0 = no known peer) x ring slot (bin mod RING_SLOTS)
 *
 * of a shared array, bin = bpf_ktime_get_ns() / BIN_NS (CLOCK_MONOTONIC: the clock userspace
 * maps to wall time), with atomic adds (packets of one bin arrive on several CPUs). The array is
 * memory-mapped by the reader (BPF_F_MMAPABLE), which copies finished bins out and zeroes them
 * a fraction of a lap later: no syscall per read, so the reader costs next to nothing however
 * fine the bins. A slot is written again only a lap (>= 2 s) after its bin, long after it was
 * drained; the reader never touches the two newest bins, which packets may still be adding to.
 *
 * The peer is the packet's IPv4 source on ingress and its destination on egress, looked up in
 * cs_peers by the address's last byte and compared in full, which the loader fills with the
 * cluster's experiment addresses. Everything else (ARP, IPv6, other hosts) counts in slot 0, so
 * the sum over slots is every byte the interface carried.
 *
 * Bytes and frames on the wire: skb->len (the L2 frame without FCS, what /proc/net/dev and tc
 * count) and one frame, except for a GSO packet of gso_segs segments (TCP builds them even with
 * the device's GSO off and segments them after the qdisc, so clsact egress sees them): its
 * segments each repeat the Ethernet/IP/TCP headers, so it counts len + (segs-1) x headers
 * bytes and segs frames, which is what tbf charges and what the segmented frames' device
 * counters count; `gso_extra` counts the frames beyond the first of such packets, so the
 * reader knows how many socket buffers the stack handed to tc (packets - gso_extra).
 *
 * It never changes traffic: it returns TC_ACT_UNSPEC, "no verdict", so tc goes on to the next
 * filter (the shaper's redirect to the ifb at prio 2) and the packet continues as if this filter
 * were not there. TC_ACT_OK would end classification and skip the shaper.
 *
 * Compile-time parameters (clang -D): BIN_NS, RING_SLOTS (a power of two), MAX_PEERS.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#ifndef BIN_NS
#define BIN_NS 100000ULL
#endif
#ifndef RING_SLOTS
#define RING_SLOTS 32768
#endif
#ifndef MAX_PEERS
#define MAX_PEERS 9
#endif

#if (RING_SLOTS & (RING_SLOTS - 1)) != 0
#error "RING_SLOTS must be a power of two"
#endif

/* One bin of one peer; read by commscope.node.wire as three native u64 through mmap. */
struct bin {
    __u64 bytes;
    __u64 packets;   /* frames on the wire */
    __u64 gso_extra; /* frames beyond the first of GSO packets: socket buffers = packets - this */
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(map_flags, BPF_F_MMAPABLE);
    __uint(max_entries, MAX_PEERS * RING_SLOTS);
    __type(key, __u32);
    __type(value, struct bin);
} cs_bins SEC(".maps");

/* The cell's peers by the last byte of their IPv4 address (the loader refuses peers that share
 * one): an array lookup and a compare instead of a hash lookup, on every packet. */
struct peer {
    __u32 addr; /* IPv4 address, network byte order; 0: no peer */
    __u32 slot; /* 1 .. MAX_PEERS-1 */
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 256);
    __type(key, __u32);
    __type(value, struct peer);
} cs_peers SEC(".maps");

/* Offsets of the IPv4 source and destination in an untagged Ethernet frame. */
#define IP_SADDR_OFF (ETH_HLEN + 12)
#define IP_DADDR_OFF (ETH_HLEN + 16)

/* Ethernet + IPv4 + TCP header bytes of a TCP/IPv4 frame, 0 for anything else: what every
 * segment of a GSO packet repeats on the wire. */
static __always_inline __u32 header_len(struct __sk_buff *skb) {
    __u8 vihl, proto, doff;
    if (skb->protocol != bpf_htons(ETH_P_IP) ||
        bpf_skb_load_bytes(skb, ETH_HLEN, &vihl, 1) ||
        bpf_skb_load_bytes(skb, ETH_HLEN + 9, &proto, 1) || proto != 6 /* IPPROTO_TCP */)
        return 0;
    __u32 ihl = (vihl & 0x0f) * 4;
    if (bpf_skb_load_bytes(skb, ETH_HLEN + ihl + 12, &doff, 1))
        return 0;
    return ETH_HLEN + ihl + (doff >> 4) * 4;
}

static __always_inline int account(struct __sk_buff *skb, __u32 addr_off) {
    __u32 slot = 0;
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    /* Direct packet access: the IPv4 header is in the linear part of every frame here. */
    if (skb->protocol == bpf_htons(ETH_P_IP) && data + addr_off + 4 <= data_end) {
        __u32 addr = *(__u32 *)(data + addr_off);
        __u32 last = ((__u8 *)(data + addr_off))[3];
        struct peer *peer = bpf_map_lookup_elem(&cs_peers, &last);
        if (peer && peer->addr == addr && peer->slot < MAX_PEERS)
            slot = peer->slot;
    }
    __u64 bin = bpf_ktime_get_ns() / BIN_NS;
    __u32 key = slot * RING_SLOTS + (__u32)(bin & (RING_SLOTS - 1));
    struct bin *b = bpf_map_lookup_elem(&cs_bins, &key);
    if (!b)
        return TC_ACT_UNSPEC;
    __u32 segs = skb->gso_segs;
    if (segs > 1) { /* rare with MTU frames: only here the headers need parsing */
        __sync_fetch_and_add(&b->bytes, skb->len + (segs - 1) * header_len(skb));
        __sync_fetch_and_add(&b->packets, segs);
        __sync_fetch_and_add(&b->gso_extra, segs - 1);
    } else {
        __sync_fetch_and_add(&b->bytes, skb->len);
        __sync_fetch_and_add(&b->packets, 1);
    }
    return TC_ACT_UNSPEC;
}

SEC("tc/ingress")
int count_ingress(struct __sk_buff *skb) { return account(skb, IP_SADDR_OFF); }

SEC("tc/egress")
int count_egress(struct __sk_buff *skb) { return account(skb, IP_DADDR_OFF); }

char LICENSE[] SEC("license") = "GPL";
