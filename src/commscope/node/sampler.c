/* Interface counter sampler, the native core of `python -m commscope.node.sampler`.
 *
 * usage: commscope-sampler IFACE HZ MAX_SECONDS OUT.bin [PROC_NET_DEV]
 *
 * Samples IFACE's rx/tx byte and packet counters from /proc/net/dev (per network namespace) at
 * HZ until SIGTERM/SIGINT or MAX_SECONDS, then writes every sample to OUT.bin as packed
 * little-endian records of five int64: t_ns (CLOCK_REALTIME, the clock of Python's
 * time.time_ns()), rx_bytes, rx_packets, tx_bytes, tx_packets. The Python parent turns them
 * into counters.parquet.
 *
 * Why C: a Python loop waking 1000 times a second costs ~15 % of step time on a node whose
 * cores are busy training; this loop does one pread and a short parse per wake-up, sleeps to an
 * absolute deadline (clock_nanosleep, TIMER_ABSTIME: oversleeping never accumulates into a
 * slower rate) and appends to memory; nothing is written until the end.
 *
 * Exit status: 0 written, 2 bad arguments or interface not found, 3 I/O error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

typedef struct {
    int64_t t_ns, rx_bytes, rx_packets, tx_bytes, tx_packets;
} sample_t;

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Finds "IFACE:" at the start of a line (after the right-aligning spaces) and reads fields
 * 0, 1, 8, 9 of the 16 that follow: rx bytes, rx packets, tx bytes, tx packets. The kernel
 * omits the space after the colon when a counter is wide, so the colon ends the name. */
static int parse(const char *buf, const char *iface, size_t iface_len, sample_t *s) {
    const char *line = buf;
    while (*line) {
        const char *p = line;
        while (*p == ' ') p++;
        const char *colon = strchr(p, ':');
        const char *eol = strchr(p, '\n');
        if (colon && (!eol || colon < eol) && (size_t)(colon - p) == iface_len &&
            memcmp(p, iface, iface_len) == 0) {
            const char *q = colon + 1;
            unsigned long long f[10];
            for (int i = 0; i < 10; i++) {
                char *end;
                errno = 0;
                f[i] = strtoull(q, &end, 10);
                if (end == q || errno) return -1;
                q = end;
            }
            s->rx_bytes = (int64_t)f[0];
            s->rx_packets = (int64_t)f[1];
            s->tx_bytes = (int64_t)f[8];
            s->tx_packets = (int64_t)f[9];
            return 0;
        }
        if (!eol) break;
        line = eol + 1;
    }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s IFACE HZ MAX_SECONDS OUT.bin [PROC_NET_DEV]\n", argv[0]);
        return 2;
    }
    const char *iface = argv[1];
    double hz = atof(argv[2]), max_seconds = atof(argv[3]);
    const char *out_path = argv[4];
    const char *proc = argc == 6 ? argv[5] : "/proc/net/dev";
    if (hz <= 0 || max_seconds < 0) {
        fprintf(stderr, "HZ must be > 0 and MAX_SECONDS >= 0\n");
        return 2;
    }
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* the Python parent died: stop, do not run on alone */
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: clock_nanosleep returns EINTR at once */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int fd = open(proc, O_RDONLY);
    if (fd < 0) {
        fprintf(stderr, "cannot open %s: %s\n", proc, strerror(errno));
        return 3;
    }
    static char buf[1 << 16];
    size_t iface_len = strlen(iface);
    size_t cap = 1 << 16, n = 0;
    sample_t *samples = malloc(cap * sizeof *samples);
    if (!samples) return 3;

    const int64_t period = (int64_t)(1e9 / hz);
    const int64_t t0 = now_ns(CLOCK_MONOTONIC);
    const int64_t end = t0 + (int64_t)(max_seconds * 1e9);
    int64_t deadline = t0;
    for (;;) {
        int last = stop_requested != 0; /* a stop still gets one final sample */
        ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
        if (got < 0) {
            fprintf(stderr, "read %s: %s\n", proc, strerror(errno));
            return 3;
        }
        buf[got] = '\0';
        if (n == cap) {
            sample_t *grown = realloc(samples, 2 * cap * sizeof *samples);
            if (!grown) break; /* out of memory: keep what we have */
            samples = grown;
            cap *= 2;
        }
        sample_t *s = &samples[n];
        s->t_ns = now_ns(CLOCK_REALTIME);
        if (parse(buf, iface, iface_len, s) != 0) {
            fprintf(stderr, "interface '%s' not found in %s\n", iface, proc);
            return 2;
        }
        n++;
        int64_t now = now_ns(CLOCK_MONOTONIC);
        if (last || now >= end) break;
        deadline += period;
        if (deadline < now) /* fell behind (descheduled): skip missed slots, do not burst */
            deadline = now + period - (now - t0) % period;
        struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
        while (!stop_requested &&
               clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
    close(fd);

    FILE *out = fopen(out_path, "wb");
    if (!out || fwrite(samples, sizeof *samples, n, out) != n || fclose(out) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", out_path, strerror(errno));
        return 3;
    }
    free(samples);
    return 0;
}
