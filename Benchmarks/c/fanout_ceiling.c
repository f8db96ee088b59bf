/* The physical ceiling for fan-out on this machine, next to threadwire in the
 * same run (issue 28): a single-threaded epoll server that answers every
 * frame a subscriber sends with a bare response frame (payload 0x12 0x00),
 * and once SUBSCRIBERS connections have each sent SETUP_FRAMES frames, sends
 * CHUNKS frames to every one of them, one round every DELAY_MS, each frame
 * carrying "ts=<send time, ns since the epoch>;" like the stamping provider
 * and written with its own write() per subscriber as it is produced (no
 * batching: what a server that keeps up does). Then it exits.
 * Usage: fanout_ceiling PORT SUBSCRIBERS SETUP_FRAMES CHUNKS DELAY_MS */
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

#define MAX_CONN 65536

static uint64_t wall_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int frames_seen[MAX_CONN];

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: fanout_ceiling PORT SUBSCRIBERS SETUP_FRAMES CHUNKS DELAY_MS\n"); return 2; }
    int port = atoi(argv[1]), subscribers = atoi(argv[2]), setup_frames = atoi(argv[3]);
    int chunks = atoi(argv[4]), delay_ms = atoi(argv[5]), one = 1;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 4096)) { perror("bind/listen"); return 1; }
    fcntl(listener, F_SETFL, fcntl(listener, F_GETFL) | O_NONBLOCK);
    int ep = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &event);
    socklen_t length = sizeof address;
    getsockname(listener, (struct sockaddr *)&address, &length); /* PORT 0: the kernel's choice */
    printf("fanout ceiling listening on 127.0.0.1:%d\n", ntohs(address.sin_port));
    fflush(stdout);
    int *fds = calloc((size_t)subscribers, sizeof(int));
    int ready = 0;
    unsigned char in[65536];
    static const unsigned char response[] = {0, 0, 0, 0, 2, 0x12, 0x00};
    struct epoll_event events[256];
    /* Subscribe phase: answer every frame (frames here are tiny and arrive whole). */
    while (ready < subscribers) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept(listener, NULL, NULL)) >= 0) {
                    if (client >= MAX_CONN) { close(client); continue; }
                    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event add = {.events = EPOLLIN, .data.fd = client};
                    epoll_ctl(ep, EPOLL_CTL_ADD, client, &add);
                }
                continue;
            }
            ssize_t got = read(fd, in, sizeof in);
            if (got <= 0) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); close(fd); continue; }
            for (ssize_t at = 0; at + 5 <= got;) {
                size_t len = ((size_t)in[at + 1] << 24) | ((size_t)in[at + 2] << 16) | ((size_t)in[at + 3] << 8) | in[at + 4];
                at += 5 + (ssize_t)len;
                if (write(fd, response, sizeof response) != sizeof response) perror("write");
                if (++frames_seen[fd] == setup_frames) fds[ready++] = fd;
            }
        }
    }
    /* Stream phase. */
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    unsigned char frame[64];
    for (int k = 0; k < chunks; k++) {
        uint64_t due = wall_ns() + (uint64_t)delay_ms * 1000000ull;
        char text[40];
        int text_len = snprintf(text, sizeof text, "ts=%llu;", (unsigned long long)wall_ns());
        /* A Notification-shaped payload: key 0x1a, length, then the stamp. */
        frame[0] = 0;
        frame[1] = frame[2] = frame[3] = 0;
        frame[4] = (unsigned char)(text_len + 2);
        frame[5] = 0x1a;
        frame[6] = (unsigned char)text_len;
        memcpy(frame + 7, text, (size_t)text_len);
        for (int s = 0; s < subscribers; s++) {
            if (write(fds[s], frame, (size_t)(7 + text_len)) < 0 && errno != EAGAIN) perror("write");
        }
        uint64_t now = wall_ns();
        if (now < due) {
            struct timespec pause = {.tv_sec = 0, .tv_nsec = (long)(due - now)};
            nanosleep(&pause, NULL);
        }
    }
    getrusage(RUSAGE_SELF, &after);
    double cpu = (double)(after.ru_utime.tv_sec - before.ru_utime.tv_sec) + (double)(after.ru_stime.tv_sec - before.ru_stime.tv_sec)
        + (double)(after.ru_utime.tv_usec - before.ru_utime.tv_usec + after.ru_stime.tv_usec - before.ru_stime.tv_usec) / 1e6;
    printf("{\"cpu_s\": %.2f, \"cpu_us_per_notification_per_subscriber\": %.2f}\n", cpu, cpu / chunks / subscribers * 1e6);
    fflush(stdout);
    sleep(2); /* let the watchers read the last frames before the sockets close */
    return 0;
}
