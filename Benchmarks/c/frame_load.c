/* An independent closed-loop load generator in C: one blocking thread per
 * connection, each sending one frame and reading one frame back, for a fixed
 * time. It speaks only the framing (1 flags byte + 4-byte big-endian length +
 * payload), so the same generator drives the C epoll echo, the SwiftNIO echo
 * and threadwire. Optional: a setup frame sent (and answered) once per
 * connection first, e.g. initialize.
 * Usage: frame_load PORT CONNECTIONS SECONDS REQUEST_HEX [SETUP_HEX]
 * DEPTH=N in the environment keeps N requests in flight per connection
 * (pipelined: N frames written in one go, then N read); latency is then per
 * batch. REQUEST_HEX may list frames separated by commas: connection i
 * sends frame i modulo their number (one thread per connection, say).
 * ALTERNATE_HEX (same shape, with DEPTH 1) is sent every other time, so
 * that a change replayed is a change each time (a settings/update that sets
 * what is already set commits nothing). Prints one JSON line: requests/s and latency percentiles (p50, p99,
 * p99.9) in µs; latencies over 200 ms count as 200 ms. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUCKETS 200000 /* 1 µs each, up to 200 ms */

static int port, seconds;
static unsigned char *request, *setup;
static size_t request_len, setup_len;
static volatile int running = 1;
static int depth = 1;
/* One connection's frames. */
typedef struct { unsigned char *batch, *alternate; size_t batch_len, alternate_len; } frames_t;

typedef struct { uint64_t count, errors; uint32_t *histogram; frames_t frames; } worker_t;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static unsigned char *from_hex(const char *hex, size_t *len) {
    size_t n = strcspn(hex, ",") / 2;
    unsigned char *bytes = malloc(n);
    for (size_t i = 0; i < n; i++) sscanf(hex + 2 * i, "%2hhx", &bytes[i]);
    *len = n;
    return bytes;
}

/* The i-th (modulo their number) of comma-separated items. */
static const char *nth(const char *list, int i) {
    int count = 1;
    for (const char *c = list; *c; c++) count += *c == ',';
    i %= count;
    while (i-- > 0) list = strchr(list, ',') + 1;
    return list;
}

static int read_full(int fd, unsigned char *buffer, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buffer + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Reads one whole frame; returns its payload length or -1. */
static long read_frame(int fd, unsigned char **buffer, size_t *capacity) {
    unsigned char header[5];
    if (read_full(fd, header, 5)) return -1;
    size_t length = ((size_t)header[1] << 24) | ((size_t)header[2] << 16) | ((size_t)header[3] << 8) | header[4];
    if (length > *capacity) { *buffer = realloc(*buffer, length); *capacity = length; }
    if (length && read_full(fd, *buffer, length)) return -1;
    return (long)length;
}

static int send_all(int fd, const unsigned char *bytes, size_t n) {
    size_t sent = 0;
    while (sent < n) {
        ssize_t w = write(fd, bytes + sent, n - sent);
        if (w <= 0) return -1;
        sent += (size_t)w;
    }
    return 0;
}

static void *work(void *arg) {
    worker_t *worker = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&address, sizeof address)) { worker->errors++; return NULL; }
    size_t capacity = 1 << 16;
    unsigned char *buffer = malloc(capacity);
    if (setup_len && (send_all(fd, setup, setup_len) || read_frame(fd, &buffer, &capacity) < 0)) { worker->errors++; return NULL; }
    for (uint64_t round = 0; running; round++) {
        uint64_t start = now_ns();
        const frames_t *f = &worker->frames;
        int other = f->alternate_len && (round & 1);
        if (send_all(fd, other ? f->alternate : f->batch, other ? f->alternate_len : f->batch_len)) { worker->errors++; break; }
        int failed = 0;
        for (int k = 0; k < depth; k++) if (read_frame(fd, &buffer, &capacity) < 0) { failed = 1; break; }
        if (failed) { worker->errors++; break; }
        uint64_t micros = (now_ns() - start) / 1000;
        worker->histogram[micros < BUCKETS ? micros : BUCKETS - 1]++;
        worker->count += (uint64_t)depth;
    }
    close(fd);
    free(buffer);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: frame_load PORT CONNECTIONS SECONDS REQUEST_HEX [SETUP_HEX]\n"); return 2; }
    port = atoi(argv[1]);
    int connections = atoi(argv[2]);
    seconds = atoi(argv[3]);
    if (argc > 5) setup = from_hex(argv[5], &setup_len);
    if (getenv("DEPTH")) depth = atoi(getenv("DEPTH"));
    if (depth < 1) depth = 1;
    const char *alternates = depth == 1 ? getenv("ALTERNATE_HEX") : NULL;
    pthread_t *threads = calloc(connections, sizeof *threads);
    worker_t *workers = calloc(connections, sizeof *workers);
    for (int i = 0; i < connections; i++) {
        frames_t *f = &workers[i].frames;
        request = from_hex(nth(argv[4], i), &request_len);
        f->batch_len = request_len * (size_t)depth;
        f->batch = malloc(f->batch_len);
        for (int k = 0; k < depth; k++) memcpy(f->batch + (size_t)k * request_len, request, request_len);
        free(request);
        if (alternates) f->alternate = from_hex(nth(alternates, i), &f->alternate_len);
        workers[i].histogram = calloc(BUCKETS, sizeof(uint32_t));
        pthread_create(&threads[i], NULL, work, &workers[i]);
    }
    sleep((unsigned)seconds);
    running = 0;
    uint64_t total = 0, errors = 0;
    uint32_t *merged = calloc(BUCKETS, sizeof(uint32_t));
    for (int i = 0; i < connections; i++) {
        pthread_join(threads[i], NULL);
        total += workers[i].count;
        errors += workers[i].errors;
        for (int b = 0; b < BUCKETS; b++) merged[b] += workers[i].histogram[b];
    }
    uint64_t samples = 0;
    for (int b = 0; b < BUCKETS; b++) samples += merged[b];
    double percentiles[] = {0.5, 0.99, 0.999};
    long values[3] = {0, 0, 0};
    for (int p = 0; p < 3; p++) {
        uint64_t target = (uint64_t)(percentiles[p] * (double)samples), seen = 0;
        for (int b = 0; b < BUCKETS; b++) { seen += merged[b]; if (seen >= target && target) { values[p] = b; break; } }
    }
    printf("{\"requests_per_second\": %.0f, \"p50_us\": %ld, \"p99_us\": %ld, \"p99_9_us\": %ld, \"errors\": %llu}\n",
           (double)total / seconds, values[0], values[1], values[2], (unsigned long long)errors);
    return 0;
}
