/* Many subscribers on one thread, in one single-threaded epoll process so the
 * watchers cost the server's cores as little as possible (issue 28, fan-out).
 * Every connection sends SETUP_HEX (initialize + thread/resume, pipelined)
 * and waits for its responses; once all are subscribed it prints "ready" and
 * reads notifications. A delta from the stamping fake provider carries
 * "ts=<provider send time, ns since the epoch>;" in its text; the watcher
 * finds the stamps in the raw frame (no protobuf needed), and for each
 * connection records the k-th stamp's latency (receive time - stamp).
 * It ends when every connection has EXPECTED stamps, or after TIMEOUT s.
 * With EXPECTED 0 it stays idle for TIMEOUT s (memory of idle subscribers).
 * Usage: fanout_watch PORT CONNECTIONS EXPECTED TIMEOUT SETUP_HEX RESPONSES
 * (RESPONSES: how many response frames SETUP_HEX gets.) Prints one JSON line. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int fd;
    unsigned char *in;
    size_t have, capacity;
    int responses, stamps, errors;
    uint32_t *latency_us; /* one per expected stamp */
} watcher_t;

static uint64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static unsigned char *from_hex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    unsigned char *bytes = malloc(n);
    for (size_t i = 0; i < n; i++) sscanf(hex + 2 * i, "%2hhx", &bytes[i]);
    *len = n;
    return bytes;
}

static int compare(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t pick(uint32_t *sorted, size_t n, double q) {
    if (n == 0) return 0;
    size_t i = (size_t)(q * (double)n);
    return sorted[i >= n ? n - 1 : i];
}

/* One frame: a response (Envelope field 2, key 0x12) counts toward setup;
 * any frame's stamps are recorded. */
static void on_frame(watcher_t *w, const unsigned char *payload, size_t len, int expected, uint64_t now) {
    if (len > 0 && payload[0] == 0x12) {
        w->responses++;
        /* Response.id (key 0x08) then Response.code (key 0x10): non-zero is a refused setup. */
        size_t i = 1;
        while (i < len && (payload[i] & 0x80)) i++;
        i++;
        while (i < len && (payload[i] == 0x08 || payload[i] == 0x10)) {
            int is_code = payload[i++] == 0x10;
            uint64_t value = 0;
            int shift = 0;
            while (i < len) { value |= (uint64_t)(payload[i] & 0x7f) << shift; shift += 7; if (!(payload[i++] & 0x80)) break; }
            if (is_code && value != 0) w->errors++;
        }
        return;
    }
    for (size_t i = 0; i + 3 < len; i++) {
        if (payload[i] != 't' || payload[i + 1] != 's' || payload[i + 2] != '=') continue;
        uint64_t sent = 0;
        size_t j = i + 3;
        while (j < len && payload[j] >= '0' && payload[j] <= '9') sent = sent * 10 + (uint64_t)(payload[j++] - '0');
        if (j < len && payload[j] == ';' && w->stamps < expected) {
            w->latency_us[w->stamps++] = now > sent ? (uint32_t)((now - sent) / 1000) : 0;
        }
        i = j;
    }
}

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: fanout_watch PORT CONNECTIONS EXPECTED TIMEOUT SETUP_HEX RESPONSES\n"); return 2; }
    int port = atoi(argv[1]), connections = atoi(argv[2]), expected = atoi(argv[3]), timeout = atoi(argv[4]);
    int responses_needed = atoi(argv[6]);
    size_t setup_len;
    unsigned char *setup = from_hex(argv[5], &setup_len);
    watcher_t *watchers = calloc((size_t)connections, sizeof *watchers);
    int ep = epoll_create1(0), one = 1;
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int c = 0; c < connections; c++) {
        watcher_t *w = &watchers[c];
        w->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (w->fd < 0 || connect(w->fd, (struct sockaddr *)&address, sizeof address)) { perror("connect"); return 1; }
        setsockopt(w->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (write(w->fd, setup, setup_len) != (ssize_t)setup_len) { perror("write"); return 1; }
        fcntl(w->fd, F_SETFL, fcntl(w->fd, F_GETFL) | O_NONBLOCK);
        w->capacity = 64 * 1024;
        w->in = malloc(w->capacity);
        w->latency_us = calloc(expected > 0 ? (size_t)expected : 1, sizeof(uint32_t));
        struct epoll_event add = {.events = EPOLLIN, .data.ptr = w};
        epoll_ctl(ep, EPOLL_CTL_ADD, w->fd, &add);
    }
    int subscribed = 0, done = 0, closed = 0, announced = 0;
    uint64_t deadline = wall_ns() + (uint64_t)timeout * 1000000000ull;
    struct epoll_event events[512];
    while (wall_ns() < deadline) {
        if (!announced && subscribed == connections) {
            printf("ready %d\n", connections);
            fflush(stdout);
            announced = 1;
            if (expected == 0) { sleep((unsigned)timeout); break; }
        }
        if (announced && done + closed == connections) break;
        int n = epoll_wait(ep, events, 512, 100);
        uint64_t now = wall_ns();
        for (int e = 0; e < n; e++) {
            watcher_t *w = events[e].data.ptr;
            ssize_t got = read(w->fd, w->in + w->have, w->capacity - w->have);
            if (got == 0 || (got < 0 && errno != EAGAIN)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, w->fd, NULL);
                closed++;
                continue;
            }
            if (got < 0) continue;
            w->have += (size_t)got;
            size_t at = 0;
            while (w->have - at >= 5) {
                size_t len = ((size_t)w->in[at + 1] << 24) | ((size_t)w->in[at + 2] << 16) | ((size_t)w->in[at + 3] << 8) | w->in[at + 4];
                if (w->have - at < 5 + len) {
                    if (5 + len > w->capacity) { w->capacity = 5 + len; unsigned char *grown = malloc(w->capacity); memcpy(grown, w->in + at, w->have - at); free(w->in); w->in = grown; w->have -= at; at = 0; }
                    break;
                }
                int before_responses = w->responses, before_stamps = w->stamps;
                on_frame(w, w->in + at + 5, len, expected, now);
                if (before_responses < responses_needed && w->responses >= responses_needed) subscribed++;
                if (expected > 0 && before_stamps < expected && w->stamps == expected) done++;
                at += 5 + len;
            }
            memmove(w->in, w->in + at, w->have - at);
            w->have -= at;
        }
    }
    /* Every (connection, stamp) latency, and per stamp the last subscriber's. */
    size_t total = 0;
    uint32_t *all = malloc(sizeof(uint32_t) * (size_t)connections * (size_t)(expected > 0 ? expected : 1));
    uint32_t *last = calloc(expected > 0 ? (size_t)expected : 1, sizeof(uint32_t));
    int complete = 0, refused = 0;
    long long missing = 0;
    for (int c = 0; c < connections; c++) {
        watcher_t *w = &watchers[c];
        if (w->stamps == expected) complete++;
        if (w->errors) refused++;
        missing += expected - w->stamps;
        for (int k = 0; k < w->stamps; k++) {
            all[total++] = w->latency_us[k];
            if (w->latency_us[k] > last[k]) last[k] = w->latency_us[k];
        }
    }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double cpu = (double)usage.ru_utime.tv_sec + (double)usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
    qsort(all, total, sizeof *all, compare);
    qsort(last, expected > 0 ? (size_t)expected : 0, sizeof *last, compare);
    printf("{\"connections\": %d, \"subscribed\": %d, \"refused\": %d, \"closed\": %d, \"complete\": %d, \"missing\": %lld, \"received\": %zu, "
           "\"cpu_s\": %.2f, \"p50_us\": %u, \"p99_us\": %u, \"max_us\": %u, \"last_subscriber_p50_us\": %u, \"last_subscriber_p99_us\": %u, \"last_subscriber_max_us\": %u}\n",
           connections, subscribed, refused, closed, complete, missing, total, cpu,
           pick(all, total, 0.5), pick(all, total, 0.99), total ? all[total - 1] : 0,
           pick(last, (size_t)expected, 0.5), pick(last, (size_t)expected, 0.99), expected > 0 ? last[expected - 1] : 0);
    return 0;
}
