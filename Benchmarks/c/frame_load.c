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
 * what is already set commits nothing). WEBSOCKET=PATH speaks WebSocket
 * instead (threadwire's --web-listen): each connection upgrades on PATH, then
 * sends each frame's payload as one masked binary message and reads one
 * message per answer; the same threads, loop and clock as for frames, so the
 * two transports are compared with one generator. Prints one JSON line:
 * requests/s and latency percentiles (p50, p99, p99.9) in µs; latencies over
 * 200 ms count as 200 ms. */
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
static const char *websocket; /* the upgrade's path, or NULL: frames */
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

/* Reads one whole WebSocket message (unfragmented, unmasked: a server's);
 * returns its payload length or -1. */
static long read_message(int fd, unsigned char **buffer, size_t *capacity) {
    unsigned char header[2], extended[8];
    if (read_full(fd, header, 2) || (header[0] & 0x0f) != 0x2) return -1;
    size_t length = header[1] & 0x7f;
    if (length == 126) {
        if (read_full(fd, extended, 2)) return -1;
        length = ((size_t)extended[0] << 8) | extended[1];
    } else if (length == 127) {
        if (read_full(fd, extended, 8)) return -1;
        length = 0;
        for (int i = 0; i < 8; i++) length = (length << 8) | extended[i];
    }
    if (length > *capacity) { *buffer = realloc(*buffer, length); *capacity = length; }
    if (length && read_full(fd, *buffer, length)) return -1;
    return (long)length;
}

static long read_answer(int fd, unsigned char **buffer, size_t *capacity) {
    return websocket ? read_message(fd, buffer, capacity) : read_frame(fd, buffer, capacity);
}

/* Frames (header + payload) rewritten as masked binary messages (a zero
 * mask: the server unmasks as for any key). */
static unsigned char *as_messages(const unsigned char *frames, size_t len, size_t *out_len) {
    unsigned char *out = malloc(len * 2 + 64), *o = out;
    for (size_t at = 0; at + 5 <= len;) {
        size_t n = ((size_t)frames[at + 1] << 24) | ((size_t)frames[at + 2] << 16) | ((size_t)frames[at + 3] << 8) | frames[at + 4];
        *o++ = 0x82;
        if (n < 126) *o++ = 0x80 | (unsigned char)n;
        else if (n < 65536) { *o++ = 0x80 | 126; *o++ = (unsigned char)(n >> 8); *o++ = (unsigned char)n; }
        else { *o++ = 0x80 | 127; for (int i = 7; i >= 0; i--) *o++ = (unsigned char)(n >> (8 * i)); }
        memset(o, 0, 4); o += 4;
        memcpy(o, frames + at + 5, n); o += n;
        at += 5 + n;
    }
    *out_len = (size_t)(o - out);
    return out;
}

static int upgrade(int fd) {
    char request[512], answer[4096];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", websocket, port);
    if (write(fd, request, (size_t)n) != n) return -1;
    size_t got = 0;
    /* Byte by byte, so nothing after the head is taken from the stream. */
    while (got < sizeof answer - 1) {
        if (read(fd, answer + got, 1) != 1) return -1;
        got++;
        if (got >= 4 && memcmp(answer + got - 4, "\r\n\r\n", 4) == 0) break;
    }
    answer[got] = 0;
    return strncmp(answer, "HTTP/1.1 101", 12) == 0 ? 0 : -1;
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
    if (websocket && upgrade(fd)) { worker->errors++; return NULL; }
    if (setup_len && (send_all(fd, setup, setup_len) || read_answer(fd, &buffer, &capacity) < 0)) { worker->errors++; return NULL; }
    for (uint64_t round = 0; running; round++) {
        uint64_t start = now_ns();
        const frames_t *f = &worker->frames;
        int other = f->alternate_len && (round & 1);
        if (send_all(fd, other ? f->alternate : f->batch, other ? f->alternate_len : f->batch_len)) { worker->errors++; break; }
        int failed = 0;
        for (int k = 0; k < depth; k++) if (read_answer(fd, &buffer, &capacity) < 0) { failed = 1; break; }
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
    websocket = getenv("WEBSOCKET");
    if (argc > 5) setup = from_hex(argv[5], &setup_len);
    if (websocket && setup) { size_t n; unsigned char *m = as_messages(setup, setup_len, &n); free(setup); setup = m; setup_len = n; }
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
        if (websocket) {
            size_t n;
            unsigned char *m = as_messages(f->batch, f->batch_len, &n);
            free(f->batch); f->batch = m; f->batch_len = n;
            if (f->alternate) { m = as_messages(f->alternate, f->alternate_len, &n); free(f->alternate); f->alternate = m; f->alternate_len = n; }
        }
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
