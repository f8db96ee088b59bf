/* The physical ceiling for threadwire's framing on this machine: a
 * single-threaded epoll server that answers every frame (1 flags byte +
 * 4-byte big-endian length + payload) with the same frame, no protobuf.
 * Level-triggered, non-blocking, one read and one write per readiness,
 * pipelined frames answered in one write. Usage: epoll_echo PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#define MAX_CONN 65536
#define BUF (256 * 1024)

typedef struct { unsigned char *in; size_t have; } conn_t;
static conn_t conns[MAX_CONN];

static void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 7499;
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&address, sizeof address) || listen(listener, 1024)) { perror("bind/listen"); return 1; }
    nonblock(listener);
    int ep = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &event);
    printf("epoll echo listening on 127.0.0.1:%d\n", port);
    fflush(stdout);
    struct epoll_event events[256];
    unsigned char *out = malloc(BUF);
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept(listener, NULL, NULL)) >= 0) {
                    if (client >= MAX_CONN) { close(client); continue; }
                    nonblock(client);
                    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conns[client].in = malloc(BUF);
                    conns[client].have = 0;
                    struct epoll_event add = {.events = EPOLLIN, .data.fd = client};
                    epoll_ctl(ep, EPOLL_CTL_ADD, client, &add);
                }
                continue;
            }
            conn_t *c = &conns[fd];
            ssize_t got = read(fd, c->in + c->have, BUF - c->have);
            if (got <= 0) {
                if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                free(c->in);
                c->in = NULL;
                continue;
            }
            c->have += (size_t)got;
            size_t offset = 0, produced = 0;
            while (c->have - offset >= 5) {
                uint32_t length = ((uint32_t)c->in[offset + 1] << 24) | ((uint32_t)c->in[offset + 2] << 16) |
                                  ((uint32_t)c->in[offset + 3] << 8) | c->in[offset + 4];
                size_t whole = 5 + (size_t)length;
                if (c->have - offset < whole || produced + whole > BUF) break;
                memcpy(out + produced, c->in + offset, whole);
                produced += whole;
                offset += whole;
            }
            memmove(c->in, c->in + offset, c->have - offset);
            c->have -= offset;
            size_t sent = 0;
            while (sent < produced) {
                ssize_t w = write(fd, out + sent, produced - sent);
                if (w < 0) { if (errno == EAGAIN || errno == EINTR) continue; break; }
                sent += (size_t)w;
            }
        }
    }
}
