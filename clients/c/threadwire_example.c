/*
 * threadwire from C, on the protobuf-c code generated from proto/ (the same
 * code the server links). Connects, initializes, checks health, starts a
 * thread selecting the proactive multi-agent mode, and prints what the server
 * reported. Exit status 0 on success.
 *
 *   threadwire_example HOST PORT
 *
 * Environment (all optional):
 *   THREADWIRE_AUTH_TOKEN  bearer token for a server that authenticates
 *   THREADWIRE_TLS_CA      PEM CA certificate: speak TLS and verify the server
 *                          (its certificate must name HOST)
 *   THREADWIRE_TLS_CERT, THREADWIRE_TLS_KEY
 *                          PEM client certificate and key (mutual TLS)
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "threadwire/v1/envelope.pb-c.h"

/* A connection: a socket, and a TLS session on it when TLS is on. */
typedef struct { int fd; SSL *ssl; } Conn;

static int write_all(Conn *conn, const uint8_t *data, size_t len) {
    while (len > 0) {
        ssize_t n = conn->ssl ? SSL_write(conn->ssl, data, (int)len) : write(conn->fd, data, len);
        if (n <= 0) return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(Conn *conn, uint8_t *data, size_t len) {
    while (len > 0) {
        ssize_t n = conn->ssl ? SSL_read(conn->ssl, data, (int)len) : read(conn->fd, data, len);
        if (n <= 0) return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* TLS 1.2+ with the server verified against `ca` for `host`. */
static SSL *start_tls(int fd, const char *host, const char *ca, const char *cert, const char *key) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) return NULL;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) { fprintf(stderr, "cannot load CA %s\n", ca); return NULL; }
    if (cert && key && (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
                        SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)) {
        fprintf(stderr, "cannot load client certificate %s / key %s\n", cert, key);
        return NULL;
    }
    SSL *ssl = SSL_new(ctx);
    SSL_CTX_free(ctx);  /* the session keeps its own reference */
    if (!ssl) return NULL;
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    struct in6_addr addr;
    if (inet_pton(AF_INET, host, &addr) == 1 || inet_pton(AF_INET6, host, &addr) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(param, host);
    } else {
        X509_VERIFY_PARAM_set1_host(param, host, 0);
        SSL_set_tlsext_host_name(ssl, host);
    }
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        ERR_print_errors_fp(stderr);
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

/* Frames and sends one request envelope. */
static int send_request(Conn *fd, Threadwire__V1__Request *request) {
    Threadwire__V1__Envelope envelope = THREADWIRE__V1__ENVELOPE__INIT;
    envelope.kind_case = THREADWIRE__V1__ENVELOPE__KIND_REQUEST;
    envelope.request = request;
    size_t size = threadwire__v1__envelope__get_packed_size(&envelope);
    uint8_t *frame = malloc(5 + size);
    if (!frame) return -1;
    frame[0] = 0;
    frame[1] = (uint8_t)(size >> 24); frame[2] = (uint8_t)(size >> 16);
    frame[3] = (uint8_t)(size >> 8);  frame[4] = (uint8_t)size;
    threadwire__v1__envelope__pack(&envelope, frame + 5);
    int rc = write_all(fd, frame, 5 + size);
    free(frame);
    return rc;
}

/* Reads frames until the response for `id`; notifications are skipped.
 * The caller frees the result with threadwire__v1__envelope__free_unpacked. */
static Threadwire__V1__Envelope *wait_response(Conn *fd, uint64_t id) {
    for (;;) {
        uint8_t header[5];
        if (read_all(fd, header, 5) != 0) return NULL;
        if (header[0] != 0) return NULL;
        uint32_t len = ((uint32_t)header[1] << 24) | ((uint32_t)header[2] << 16) | ((uint32_t)header[3] << 8) | header[4];
        uint8_t *payload = malloc(len ? len : 1);
        if (!payload || read_all(fd, payload, len) != 0) { free(payload); return NULL; }
        Threadwire__V1__Envelope *envelope = threadwire__v1__envelope__unpack(NULL, len, payload);
        free(payload);
        if (!envelope) return NULL;
        if (envelope->kind_case == THREADWIRE__V1__ENVELOPE__KIND_RESPONSE && envelope->response->has_id && envelope->response->id == id)
            return envelope;
        threadwire__v1__envelope__free_unpacked(envelope, NULL);
    }
}

static int check(Threadwire__V1__Envelope *envelope, const char *what) {
    if (!envelope) { fprintf(stderr, "%s: no response\n", what); return -1; }
    if (envelope->response->code != 0) {
        fprintf(stderr, "%s: status %u: %s\n", what, envelope->response->code, envelope->response->message);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s HOST PORT\n", argv[0]); return 2; }
    struct addrinfo hints = {0}, *address;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(argv[1], argv[2], &hints, &address) != 0) { perror("getaddrinfo"); return 1; }
    int sock = socket(address->ai_family, SOCK_STREAM, 0);
    if (sock < 0 || connect(sock, address->ai_addr, address->ai_addrlen) != 0) { perror("connect"); return 1; }
    freeaddrinfo(address);
    Conn connection = { sock, NULL };
    Conn *fd = &connection;
    const char *ca = getenv("THREADWIRE_TLS_CA");
    if (ca) {
        connection.ssl = start_tls(sock, argv[1], ca, getenv("THREADWIRE_TLS_CERT"), getenv("THREADWIRE_TLS_KEY"));
        if (!connection.ssl) { fprintf(stderr, "TLS handshake failed\n"); return 1; }
    }

    /* initialize */
    Threadwire__V1__ClientInfo info = THREADWIRE__V1__CLIENT_INFO__INIT;
    info.name = "threadwire-c-example";
    Threadwire__V1__InitializeParams init = THREADWIRE__V1__INITIALIZE_PARAMS__INIT;
    init.client_info = &info;
    init.has_protocol_version = 1;
    init.protocol_version = 1;
    init.auth_token = getenv("THREADWIRE_AUTH_TOKEN");
    Threadwire__V1__Request request = THREADWIRE__V1__REQUEST__INIT;
    request.has_id = 1; request.id = 1;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_INITIALIZE;
    request.initialize = &init;
    if (send_request(fd, &request) != 0) return 1;
    Threadwire__V1__Envelope *reply = wait_response(fd, 1);
    if (check(reply, "initialize") != 0) return 1;
    printf("server %s %s\n", reply->response->initialize->server_info->name, reply->response->initialize->server_info->version);
    threadwire__v1__envelope__free_unpacked(reply, NULL);

    /* health/check */
    Threadwire__V1__HealthCheckParams health = THREADWIRE__V1__HEALTH_CHECK_PARAMS__INIT;
    Threadwire__V1__Request health_request = THREADWIRE__V1__REQUEST__INIT;
    health_request.has_id = 1; health_request.id = 2;
    health_request.params_case = THREADWIRE__V1__REQUEST__PARAMS_HEALTH_CHECK;
    health_request.health_check = &health;
    if (send_request(fd, &health_request) != 0) return 1;
    reply = wait_response(fd, 2);
    if (check(reply, "health/check") != 0) return 1;
    printf("health %s\n", reply->response->health_check->status == THREADWIRE__V1__SERVING_STATUS__SERVING_STATUS_SERVING ? "SERVING" : "NOT_SERVING");
    threadwire__v1__envelope__free_unpacked(reply, NULL);

    /* thread/start selecting proactive */
    Threadwire__V1__ThreadStartParams start = THREADWIRE__V1__THREAD_START_PARAMS__INIT;
    start.has_multi_agent_mode = 1;
    start.multi_agent_mode = THREADWIRE__V1__MULTI_AGENT_MODE__MULTI_AGENT_MODE_PROACTIVE;
    Threadwire__V1__Request start_request = THREADWIRE__V1__REQUEST__INIT;
    start_request.has_id = 1; start_request.id = 3;
    start_request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_START;
    start_request.thread_start = &start;
    if (send_request(fd, &start_request) != 0) return 1;
    reply = wait_response(fd, 3);
    if (check(reply, "thread/start") != 0) return 1;
    Threadwire__V1__ThreadLifecycleResult *result = reply->response->thread_start;
    printf("thread %s runtime %d mode %s\n", result->thread->id, result->multi_agent_runtime,
           result->has_multi_agent_mode && result->multi_agent_mode == THREADWIRE__V1__MULTI_AGENT_MODE__MULTI_AGENT_MODE_PROACTIVE ? "proactive" : "unset");
    threadwire__v1__envelope__free_unpacked(reply, NULL);
    if (connection.ssl) { SSL_shutdown(connection.ssl); SSL_free(connection.ssl); }
    close(sock);
    return 0;
}
