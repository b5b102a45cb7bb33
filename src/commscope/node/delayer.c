/*
 * commscope delayer: delay (and jitter) for packets an iptables NFQUEUE rule hands to userspace,
 * where the kernel has no netem.
 *
 *   delayer --queue N --delay-us D [--jitter-us J] [--seed S] [--maxlen M] --pidfile P --stats F
 *
 * Each packet queued on N gets due = arrival + D + U(-J, +J) (U uniform, like netem's default
 * jitter, from a PRNG seeded with S), raised to the previous packet's due so the queue stays FIFO
 * (never reorders). Arrival is the kernel's receive stamp of the packet (NFQA_TIMESTAMP, which
 * this program turns on), else CLOCK_MONOTONIC when its notification is read. Packet ids wait
 * in a ring; when the head is due, one batch verdict (NF_ACCEPT of the highest due id) releases
 * every id up to it. The wait sleeps in ppoll until shortly before the due time (the learnt
 * lateness of a timed wake) and spins the rest, within a CPU budget; while packets are held and
 * carry kernel stamps, arrivals are read at those wakes (at least every 1 ms) rather than each
 * waking the program. Only metadata is copied to userspace (NFQNL_COPY_META): the packet stays
 * in the kernel. FAIL_OPEN: a packet the queue cannot take (maxlen, socket buffer full) is
 * accepted at once instead of dropped, so overload skips the delay rather than losing data.
 *
 * Prints "ready queue=N" on stdout (after the pidfile is written) once the queue is bound; the
 * NFQUEUE rule should be added after that line (with --queue-bypass, packets pass undelayed
 * while no program is bound). SIGTERM/SIGINT accept everything held (the kernel drops what is
 * still queued when the queue is destroyed), write the stats JSON (tmp + rename) and exit 0.
 * Exit 2: bad arguments; exit 1: cannot bind the queue or write the files.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <endian.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netlink.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define RT_PRIORITY 10
#define RCVBUF_BYTES (64 << 20)
#define DEFAULT_MAXLEN (1u << 18)
#define RECV_BATCH 64
#define RECV_BUF 8192 /* one COPY_META notification is ~100-200 B */
#define LATE_BUCKETS 100000 /* lateness histogram: 1 us buckets up to 100 ms, then one more */
#define EXIT_QUIET_NS 20000000LL /* at exit: accept arrivals until 20 ms pass without one */
#define EXIT_MAX_ROUNDS 10
#define EARLY_INIT_NS 50000LL /* first guess of how late a timed wake comes */
#define EARLY_MAX_NS 1000000LL
#define LAZY_READ_NS 1000000LL /* while holding, read arrivals at least this often */
#define SPIN_MAX_NS 400000LL /* the most spent spinning before one release (a timed wake
				    * from an idle vCPU comes 0.05-0.4 ms late on this VM) */
#define SPIN_SHARE 20 /* spin at most 1/20 of the time (a token bucket) ... */
#define SPIN_BUCKET_NS 2000000LL /* ... saving up at most 2 ms of spinning */

struct held {
	uint32_t id;
	int64_t due;
};

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* splitmix64: small, seedable, good enough for uniform jitter. */
static uint64_t rng_state;
static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s --queue N --delay-us D [--jitter-us J] [--seed S] [--maxlen M] "
		"--pidfile P --stats F\n"
		"  N: NFQUEUE number (0-65535); D, J: microseconds (due = arrival + D + U(-J, J),\n"
		"  never before the previous packet's); M: queue length (default %u)\n",
		prog, DEFAULT_MAXLEN);
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	if (!s || !*s || *s == '-')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -1;
	*out = v;
	return 0;
}

/* getopt_long takes any unambiguous prefix (--delay for --delay-us): insist on the full name,
 * so a typo fails here instead of meaning something. */
static int exact_option(char **argv, int optind, const char *optarg, const char *name)
{
	const char *text = argv[optarg && optarg == argv[optind - 1] ? optind - 2 : optind - 1];
	size_t len = strcspn(text + 2, "=");
	return strncmp(text, "--", 2) == 0 && len == strlen(name) && strncmp(text + 2, name, len) == 0;
}

/* Everything the stats file reports. */
struct stats {
	uint64_t packets, released, flushed, overflow, enobufs, clamped, missed, held_max;
	uint64_t verdict_errors, late_n, late_sum_ns, late_max_ns;
	uint64_t kernel_stamped, read_lag_sum_ns, timed_wakes, spin_ns;
	uint64_t *late_hist; /* LATE_BUCKETS + 1 */
	uint32_t last_id;
	int have_id;
};

static double late_percentile_us(const struct stats *st, double p)
{
	if (st->late_n == 0)
		return 0.0;
	uint64_t rank = (uint64_t)(p * (double)(st->late_n - 1)) + 1, seen = 0;
	for (int i = 0; i <= LATE_BUCKETS; i++) {
		seen += st->late_hist[i];
		if (seen >= rank)
			return i < LATE_BUCKETS ? (double)i : (double)st->late_max_ns / 1000.0;
	}
	return (double)st->late_max_ns / 1000.0;
}

/* The kernel's own counters for this queue (per network namespace), -1 where unreadable. */
static void kernel_queue_counters(unsigned queue, long long *dropped, long long *user_dropped,
				  long long *id_sequence)
{
	*dropped = *user_dropped = *id_sequence = -1;
	FILE *fh = fopen("/proc/net/netfilter/nfnetlink_queue", "r");
	if (!fh)
		return;
	unsigned q, copy_mode, copy_range, total;
	unsigned long long portid, d, ud, seq;
	int one;
	while (fscanf(fh, "%u %llu %u %u %u %llu %llu %llu %d", &q, &portid, &total, &copy_mode,
		      &copy_range, &d, &ud, &seq, &one) == 9) {
		if (q == queue) {
			*dropped = (long long)d;
			*user_dropped = (long long)ud;
			*id_sequence = (long long)seq;
		}
	}
	fclose(fh);
}

static int write_atomic(const char *path, const char *text)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
		return -1;
	FILE *fh = fopen(tmp, "w");
	if (!fh)
		return -1;
	int bad = fputs(text, fh) < 0;
	bad |= fclose(fh) != 0;
	if (bad || rename(tmp, path) != 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* What the receive loop keeps: the ring of held packets and the due-time rule. */
struct delayer {
	struct held *ring;
	uint32_t cap, head, count;
	int64_t delay_ns, jitter_ns, last_due;
	int64_t real_minus_mono; /* CLOCK_REALTIME - CLOCK_MONOTONIC, to convert kernel stamps */
	int stamped; /* the last packet read had the kernel's receive stamp */
	struct nfq_q_handle *qh;
	struct stats st;
};

static int64_t be64(const void *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v);
	return (int64_t)be64toh(v);
}

/* One queued packet: its due time, into the ring (or through at once if the ring is full). */
static void hold(struct delayer *d, uint32_t id, int64_t arrival)
{
	struct stats *st = &d->st;
	st->packets++;
	/* Ids count up per queue: a gap is packets the kernel accepted without telling us
	 * (FAIL_OPEN on a full queue or socket buffer), i.e. not delayed. */
	if (st->have_id && id > st->last_id + 1)
		st->missed += id - st->last_id - 1;
	st->last_id = id;
	st->have_id = 1;
	if (d->count == d->cap) {
		/* Ring full: let this one through now, ahead of the held ones but never lost.
		 * The ring is as large as the kernel queue, so this is rare. */
		if (nfq_set_verdict(d->qh, id, NF_ACCEPT, 0, NULL) < 0)
			st->verdict_errors++;
		st->overflow++;
		return;
	}
	int64_t due = arrival + d->delay_ns;
	if (d->jitter_ns > 0)
		due += (int64_t)(rng_next() % (uint64_t)(2 * d->jitter_ns + 1)) - d->jitter_ns;
	if (due < arrival)
		due = arrival;
	if (due < d->last_due) {
		due = d->last_due; /* FIFO: never overtake the packet ahead */
		st->clamped++;
	}
	d->last_due = due;
	uint32_t tail = (d->head + d->count) % d->cap;
	d->ring[tail].id = id;
	d->ring[tail].due = due;
	d->count++;
	if (d->count > st->held_max)
		st->held_max = d->count;
}

/* The netlink messages of one datagram: hold each queued packet; count error replies. */
static void parse_datagram(struct delayer *d, const char *buf, size_t len, int64_t read_at)
{
	for (const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf; NLMSG_OK(nlh, len);
	     nlh = NLMSG_NEXT(nlh, len)) {
		if (nlh->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(nlh);
			if (nlh->nlmsg_len >= NLMSG_LENGTH(sizeof *e) && e->error != 0)
				d->st.verdict_errors++;
			continue;
		}
		if (NFNL_SUBSYS_ID(nlh->nlmsg_type) != NFNL_SUBSYS_QUEUE ||
		    NFNL_MSG_TYPE(nlh->nlmsg_type) != NFQNL_MSG_PACKET)
			continue;
		const size_t skip = NLMSG_ALIGN(sizeof(struct nfgenmsg));
		if (nlh->nlmsg_len < NLMSG_LENGTH(skip))
			continue;
		const char *a = (const char *)NLMSG_DATA(nlh) + skip;
		size_t left = nlh->nlmsg_len - NLMSG_LENGTH(skip);
		const struct nfqnl_msg_packet_hdr *ph = NULL;
		const struct nfqnl_msg_packet_timestamp *ts = NULL;
		while (left >= sizeof(struct nlattr)) {
			const struct nlattr *at = (const struct nlattr *)a;
			if (at->nla_len < sizeof *at || at->nla_len > left)
				break;
			int type = at->nla_type & NLA_TYPE_MASK;
			if (type == NFQA_PACKET_HDR && at->nla_len >= NLA_HDRLEN + sizeof *ph)
				ph = (const void *)(a + NLA_HDRLEN);
			else if (type == NFQA_TIMESTAMP && at->nla_len >= NLA_HDRLEN + sizeof *ts)
				ts = (const void *)(a + NLA_HDRLEN);
			size_t step = NLA_ALIGN(at->nla_len);
			if (step >= left)
				break;
			a += step;
			left -= step;
		}
		if (!ph)
			continue;
		/* Arrival: the kernel's receive stamp (wall clock, us) where the packet has one, so
		 * the ~0.1 ms this process takes to wake on an idle VM is not added to the delay;
		 * else when its notification was read. */
		int64_t arrival = read_at;
		d->stamped = 0;
		if (ts) {
			int64_t mono = be64(&ts->sec) * 1000000000LL + be64(&ts->usec) * 1000LL -
				       d->real_minus_mono;
			if (mono <= read_at && mono > read_at - 1000000000LL) {
				arrival = mono;
				d->stamped = 1;
				d->st.kernel_stamped++;
				d->st.read_lag_sum_ns += (uint64_t)(read_at - mono);
			}
		}
		hold(d, ntohl(ph->packet_id), arrival);
	}
}

/* Accept every held packet whose due time has come, in one batch verdict; their lateness. */
static void release_due(struct delayer *d, int64_t now)
{
	uint32_t released = 0, last_id = 0;
	struct stats *st = &d->st;
	while (d->count > 0 && d->ring[d->head].due <= now) {
		uint64_t late = (uint64_t)(now - d->ring[d->head].due);
		st->late_sum_ns += late;
		if (late > st->late_max_ns)
			st->late_max_ns = late;
		uint64_t b = late / 1000;
		st->late_hist[b < LATE_BUCKETS ? b : LATE_BUCKETS]++;
		last_id = d->ring[d->head].id;
		d->head = (d->head + 1) % d->cap;
		d->count--;
		released++;
	}
	if (!released)
		return;
	/* One message accepts every id <= last_id: all released ones, and any whose notification
	 * was lost (those the kernel already accepted under FAIL_OPEN). */
	if (nfq_set_verdict_batch(d->qh, last_id, NF_ACCEPT) < 0)
		st->verdict_errors++;
	st->released += released;
	st->late_n += released;
}

int main(int argc, char **argv)
{
	uint64_t queue = UINT64_MAX, delay_us = UINT64_MAX, jitter_us = 0, seed = 1;
	uint64_t maxlen = DEFAULT_MAXLEN;
	const char *pidfile = NULL, *stats_path = NULL;
	static const struct option opts[] = {
		{"queue", required_argument, 0, 'q'},	{"delay-us", required_argument, 0, 'd'},
		{"jitter-us", required_argument, 0, 'j'}, {"seed", required_argument, 0, 's'},
		{"maxlen", required_argument, 0, 'm'},	{"pidfile", required_argument, 0, 'p'},
		{"stats", required_argument, 0, 'o'},	{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	int c, li = 0;
	while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
		int bad = 0;
		if (c != '?' && !exact_option(argv, optind, optarg, opts[li].name)) {
			fprintf(stderr, "%s: spell out --%s\n", argv[0], opts[li].name);
			usage(argv[0]);
			return 2;
		}
		switch (c) {
		case 'q': bad = parse_u64(optarg, 65535, &queue); break;
		case 'd': bad = parse_u64(optarg, 60000000, &delay_us); break;
		case 'j': bad = parse_u64(optarg, 60000000, &jitter_us); break;
		case 's': bad = parse_u64(optarg, UINT64_MAX, &seed); break;
		case 'm': bad = parse_u64(optarg, 1u << 24, &maxlen) || maxlen == 0; break;
		case 'p': pidfile = optarg; break;
		case 'o': stats_path = optarg; break;
		case 'h': usage(argv[0]); return 0;
		default: usage(argv[0]); return 2;
		}
		if (bad) {
			fprintf(stderr, "%s: bad value for --%s: %s\n", argv[0], opts[li].name,
				optarg);
			usage(argv[0]);
			return 2;
		}
	}
	if (optind < argc || queue == UINT64_MAX || delay_us == UINT64_MAX || !pidfile ||
	    !*pidfile || !stats_path || !*stats_path) {
		fprintf(stderr, "%s: %s\n", argv[0],
			optind < argc ? "unexpected argument" : "missing a required option");
		usage(argv[0]);
		return 2;
	}
	rng_state = seed;
	const int64_t delay_ns = (int64_t)delay_us * 1000, jitter_ns = (int64_t)jitter_us * 1000;

	struct delayer d = {.cap = (uint32_t)maxlen, .delay_ns = delay_ns, .jitter_ns = jitter_ns};
	struct stats *st = &d.st;
	d.ring = calloc(d.cap, sizeof *d.ring);
	st->late_hist = calloc(LATE_BUCKETS + 1, sizeof *st->late_hist);
	if (!d.ring || !st->late_hist) {
		fprintf(stderr, "delayer: out of memory for a ring of %u packets\n", d.cap);
		return 1;
	}

	/* Signals stay blocked except inside ppoll, so a stop is never lost between the check
	 * and the wait, and no syscall elsewhere returns EINTR. */
	sigset_t block, waitmask;
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &waitmask);
	sigdelset(&waitmask, SIGTERM);
	sigdelset(&waitmask, SIGINT);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	struct nfq_handle *h = nfq_open();
	if (!h) {
		fprintf(stderr, "delayer: cannot bind NFQUEUE %" PRIu64 ": nfq_open: %s\n", queue,
			strerror(errno));
		return 1;
	}
	d.qh = nfq_create_queue(h, (uint16_t)queue, NULL, NULL);
	if (!d.qh) {
		int err = errno;
		fprintf(stderr, "delayer: cannot bind NFQUEUE %" PRIu64 ": %s (%s)\n", queue,
			strerror(err),
			err == EPERM   ? "needs CAP_NET_ADMIN in this network namespace"
			: err == EBUSY ? "another program holds this queue number"
				       : "nfnetlink_queue");
		nfq_close(h);
		return 1;
	}
	if (nfq_set_mode(d.qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(d.qh, d.cap) < 0 ||
	    nfq_set_queue_flags(d.qh, NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN,
				NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN) < 0) {
		fprintf(stderr, "delayer: cannot configure NFQUEUE %" PRIu64 ": %s\n", queue,
			strerror(errno));
		nfq_destroy_queue(d.qh);
		nfq_close(h);
		return 1;
	}
	int fd = nfq_fd(h);
	int rcvbuf = RCVBUF_BYTES;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf); /* capped by rmem_max */
	socklen_t optlen = sizeof rcvbuf;
	getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, &optlen);
	/* A socket asking for receive timestamps turns on the kernel's (global) stamping of every
	 * received packet, which NFQUEUE then passes on (NFQA_TIMESTAMP). Held open until exit. */
	int stamp_fd = socket(AF_INET, SOCK_DGRAM, 0), one = 1;
	if (stamp_fd >= 0)
		setsockopt(stamp_fd, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one);

	/* Releases must leave on time: real-time priority, 1 ns timer slack, no page faults. */
	const char *sched = "other";
	struct sched_param sp = {.sched_priority = RT_PRIORITY};
	if (sched_setscheduler(0, SCHED_FIFO, &sp) == 0)
		sched = "fifo";
	else
		fprintf(stderr, "delayer: SCHED_FIFO refused (%s): releases will be later\n",
			strerror(errno));
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	mlockall(MCL_CURRENT | MCL_FUTURE);

	char pidtext[32];
	snprintf(pidtext, sizeof pidtext, "%d\n", (int)getpid());
	if (write_atomic(pidfile, pidtext) != 0) {
		fprintf(stderr, "delayer: cannot write pidfile %s: %s\n", pidfile, strerror(errno));
		nfq_destroy_queue(d.qh);
		nfq_close(h);
		return 1;
	}
	printf("ready queue=%" PRIu64 "\n", queue);
	fflush(stdout);

	static char bufs[RECV_BATCH][RECV_BUF];
	struct iovec iov[RECV_BATCH];
	struct mmsghdr msgs[RECV_BATCH];
	for (int i = 0; i < RECV_BATCH; i++) {
		iov[i].iov_base = bufs[i];
		iov[i].iov_len = RECV_BUF;
	}
	const int64_t start = now_ns();
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	int64_t exit_quiet_since = 0, early_ns = EARLY_INIT_NS;
	int64_t spin_budget = SPIN_BUCKET_NS, budget_at = start;
	int exit_rounds = 0;

	for (;;) {
		/* Read everything waiting before releasing: ids must be known to be released. */
		int got_any = 0;
		for (;;) {
			memset(msgs, 0, sizeof msgs);
			for (int i = 0; i < RECV_BATCH; i++) {
				msgs[i].msg_hdr.msg_iov = &iov[i];
				msgs[i].msg_hdr.msg_iovlen = 1;
			}
			int n = recvmmsg(fd, msgs, RECV_BATCH, MSG_DONTWAIT, NULL);
			if (n < 0) {
				if (errno == ENOBUFS) {
					st->enobufs++; /* the kernel accepted what it could not tell us */
					continue;
				}
				break; /* EAGAIN: drained */
			}
			struct timespec real;
			clock_gettime(CLOCK_REALTIME, &real);
			int64_t read_at = now_ns();
			d.real_minus_mono =
				(int64_t)real.tv_sec * 1000000000LL + real.tv_nsec - read_at;
			for (int i = 0; i < n; i++)
				parse_datagram(&d, bufs[i], msgs[i].msg_len, read_at);
			got_any = 1;
			if (n < RECV_BATCH)
				break;
		}

		if (stop_signal) {
			/* Accept all held and anything that still arrives, until quiet: the kernel
			 * drops whatever is queued when the queue goes away. */
			if (d.count > 0 || got_any) {
				if (st->have_id &&
				    nfq_set_verdict_batch(d.qh, st->last_id, NF_ACCEPT) < 0)
					st->verdict_errors++;
				st->flushed += d.count;
				d.head = d.count = 0;
			}
			int64_t t = now_ns();
			if (got_any || exit_quiet_since == 0)
				exit_quiet_since = t;
			if (t - exit_quiet_since >= EXIT_QUIET_NS || ++exit_rounds > EXIT_MAX_ROUNDS)
				break;
			struct timespec ts = {0, EXIT_QUIET_NS / 2};
			ppoll(&pfd, 1, &ts, &block); /* signals stay blocked now */
			continue;
		}

		release_due(&d, now_ns());
		if (d.count == 0) {
			if (ppoll(&pfd, 1, NULL, &waitmask) < 0 && errno != EINTR)
				break;
			continue;
		}
		/* A timed wake comes late (~40 us on this VM when busy, ~0.1 ms from idle): sleep
		 * until early_ns (the usual overshoot, learnt) before the due time and spin the
		 * rest, at most min(early_ns, SPIN_MAX_NS) per release and SPIN_SHARE of the time
		 * overall, so dense traffic cannot turn this into a busy loop on a node that also
		 * trains; out of budget, wake as soon as the timer can and release a little late. */
		int64_t now = now_ns(), remaining = d.ring[d.head].due - now;
		spin_budget += (now - budget_at) / SPIN_SHARE;
		budget_at = now;
		if (spin_budget > SPIN_BUCKET_NS)
			spin_budget = SPIN_BUCKET_NS;
		int64_t spin = early_ns < SPIN_MAX_NS ? early_ns : SPIN_MAX_NS;
		if (remaining <= spin && remaining <= spin_budget) {
			while (now_ns() < d.ring[d.head].due)
				;
			int64_t spun = now_ns() - now;
			spin_budget -= spun;
			st->spin_ns += (uint64_t)spun;
			struct timespec zero = {0, 0};
			ppoll(NULL, 0, &zero, &waitmask); /* lets a pending SIGTERM in */
			continue;
		}
		int64_t wait = remaining - early_ns;
		if (wait < 1)
			wait = 1;
		/* With kernel stamps, when a packet's notification is read does not change its due
		 * time, and a new packet is never due before the held head: so while packets are held,
		 * sleep on the timer alone and read arrivals at the next wake (at least every
		 * LAZY_READ_NS, so the socket buffer never fills). That halves the wake-ups per
		 * packet, which cost ~10 us each on this VM. */
		int lazy = d.stamped;
		if (lazy && wait > LAZY_READ_NS)
			wait = LAZY_READ_NS;
		struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
		int r = ppoll(&pfd, lazy ? 0 : 1, &ts, &waitmask);
		if (r == 0) {
			int64_t over = now_ns() - (now + wait);
			early_ns += (over - early_ns) / 8;
			if (early_ns < 0)
				early_ns = 0;
			if (early_ns > EARLY_MAX_NS)
				early_ns = EARLY_MAX_NS;
			st->timed_wakes++;
		} else if (r < 0 && errno != EINTR) {
			fprintf(stderr, "delayer: ppoll: %s\n", strerror(errno));
			stop_signal = SIGTERM; /* flush and report rather than drop what is held */
		}
	}

	double elapsed = (double)(now_ns() - start) / 1e9;
	long long kdropped, kuser_dropped, kseq;
	kernel_queue_counters((unsigned)queue, &kdropped, &kuser_dropped, &kseq);
	nfq_destroy_queue(d.qh);
	nfq_close(h);
	if (stamp_fd >= 0)
		close(stamp_fd);

	char text[2048];
	double mean = st->late_n ? (double)st->late_sum_ns / (double)st->late_n / 1000.0 : 0.0;
	double lag = st->kernel_stamped
			     ? (double)st->read_lag_sum_ns / (double)st->kernel_stamped / 1000.0
			     : 0.0;
	snprintf(text, sizeof text,
		 "{\"queue\": %" PRIu64 ", \"delay_us\": %" PRIu64 ", \"jitter_us\": %" PRIu64
		 ", \"seed\": %" PRIu64 ", \"maxlen\": %u, \"rcvbuf\": %d, \"sched\": \"%s\",\n"
		 " \"packets\": %" PRIu64 ", \"released\": %" PRIu64 ", \"flushed\": %" PRIu64
		 ", \"overflow\": %" PRIu64 ", \"missed\": %" PRIu64 ", \"enobufs\": %" PRIu64
		 ", \"clamped\": %" PRIu64 ", \"held_max\": %" PRIu64 ", \"verdict_errors\": %" PRIu64
		 ",\n \"late_us\": {\"mean\": %.3f, \"p50\": %.1f, \"p99\": %.1f, \"max\": %.3f},\n"
		 " \"kernel_stamped\": %" PRIu64 ", \"read_lag_us_mean\": %.3f, \"early_us\": %.3f"
		 ", \"timed_wakes\": %" PRIu64 ", \"spin_s\": %.6f,\n"
		 " \"kernel\": {\"queue_dropped\": %lld, \"user_dropped\": %lld, \"id_sequence\": "
		 "%lld},\n"
		 " \"elapsed_s\": %.6f, \"exit_signal\": %d}\n",
		 queue, delay_us, jitter_us, seed, d.cap, rcvbuf, sched, st->packets, st->released,
		 st->flushed, st->overflow, st->missed, st->enobufs, st->clamped, st->held_max,
		 st->verdict_errors, mean, late_percentile_us(st, 0.50), late_percentile_us(st, 0.99),
		 (double)st->late_max_ns / 1000.0, st->kernel_stamped, lag, (double)early_ns / 1000.0,
		 st->timed_wakes, (double)st->spin_ns / 1e9, kdropped, kuser_dropped, kseq, elapsed,
		 (int)stop_signal);
	if (write_atomic(stats_path, text) != 0) {
		fprintf(stderr, "delayer: cannot write stats %s: %s\n", stats_path, strerror(errno));
		return 1;
	}
	return 0;
}
