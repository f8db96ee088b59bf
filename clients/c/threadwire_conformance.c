/*
 * The cross-language conformance scenario in C (integration/conformance/README.md),
 * on the protobuf-c code generated from proto/. Prints the transcript.
 *
 *   threadwire_conformance HOST PORT
 */
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "threadwire/v1/envelope.pb-c.h"

static int fd = -1;
static uint64_t next_id = 0;

static void fail(const char *what) {
    fprintf(stderr, "conformance: %s\n", what);
    exit(1);
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000.0 + t.tv_nsec / 1e6;
}

static void write_all(const uint8_t *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n <= 0) fail("write failed");
        data += n;
        len -= (size_t)n;
    }
}

static void read_all(uint8_t *data, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, data, len);
        if (n <= 0) fail("the server closed the connection");
        data += n;
        len -= (size_t)n;
    }
}

/* Frames and sends a request; returns its id. */
static uint64_t send_request(Threadwire__V1__Request *request) {
    request->has_id = 1;
    request->id = ++next_id;
    Threadwire__V1__Envelope envelope = THREADWIRE__V1__ENVELOPE__INIT;
    envelope.kind_case = THREADWIRE__V1__ENVELOPE__KIND_REQUEST;
    envelope.request = request;
    size_t size = threadwire__v1__envelope__get_packed_size(&envelope);
    uint8_t *frame = malloc(5 + size);
    if (!frame) fail("out of memory");
    frame[0] = 0;
    frame[1] = (uint8_t)(size >> 24); frame[2] = (uint8_t)(size >> 16);
    frame[3] = (uint8_t)(size >> 8);  frame[4] = (uint8_t)size;
    threadwire__v1__envelope__pack(&envelope, frame + 5);
    write_all(frame, 5 + size);
    free(frame);
    return request->id;
}

/* The next envelope; the caller frees it with threadwire__v1__envelope__free_unpacked. */
static Threadwire__V1__Envelope *read_envelope(void) {
    uint8_t header[5];
    read_all(header, 5);
    if (header[0] != 0) fail("a frame with flags set");
    uint32_t len = ((uint32_t)header[1] << 24) | ((uint32_t)header[2] << 16) | ((uint32_t)header[3] << 8) | header[4];
    uint8_t *payload = malloc(len ? len : 1);
    if (!payload) fail("out of memory");
    read_all(payload, len);
    Threadwire__V1__Envelope *envelope = threadwire__v1__envelope__unpack(NULL, len, payload);
    free(payload);
    if (!envelope) fail("an undecodable frame");
    return envelope;
}

/* Notifications read while waiting for responses, kept for the transcript. */
static Threadwire__V1__Notification *queued[4096];
static Threadwire__V1__Envelope *queued_envelopes[4096];
static size_t queued_count = 0, queued_next = 0;

/* The response for `id` (frees nothing: the caller frees the envelope). */
static Threadwire__V1__Envelope *wait_response(uint64_t id) {
    for (;;) {
        Threadwire__V1__Envelope *envelope = read_envelope();
        if (envelope->kind_case == THREADWIRE__V1__ENVELOPE__KIND_RESPONSE && envelope->response->id == id) return envelope;
        if (envelope->kind_case == THREADWIRE__V1__ENVELOPE__KIND_NOTIFICATION && queued_count < 4096) {
            queued_envelopes[queued_count] = envelope;
            queued[queued_count++] = envelope->notification;
            continue;
        }
        threadwire__v1__envelope__free_unpacked(envelope, NULL);
    }
}

static Threadwire__V1__Envelope *call(Threadwire__V1__Request *request, const char *what) {
    Threadwire__V1__Envelope *envelope = wait_response(send_request(request));
    if (envelope->response->code != 0) {
        fprintf(stderr, "conformance: %s: status %u: %s\n", what, envelope->response->code, envelope->response->message);
        exit(1);
    }
    return envelope;
}

/* The wire name of a notification: its payload field with "_" read as "/",
 * except the names envelope.proto lists whose segments keep an underscore. */
static void notification_method(Threadwire__V1__Notification *note, char *out, size_t size) {
    const ProtobufCFieldDescriptor *field =
        protobuf_c_message_descriptor_get_field(&threadwire__v1__notification__descriptor, (unsigned)note->payload_case);
    static const char *exceptions[][2] = {
        {"item_agent_message_delta", "item/agent_message/delta"},
        {"server_request_resolved", "server_request/resolved"},
        {"thread_token_usage_updated", "thread/token_usage/updated"},
        {"thread_rolled_back", "thread/rolled_back"},
    };
    for (size_t i = 0; i < sizeof exceptions / sizeof exceptions[0]; i++) {
        if (field && strcmp(field->name, exceptions[i][0]) == 0) { snprintf(out, size, "%s", exceptions[i][1]); return; }
    }
    snprintf(out, size, "%s", field ? field->name : "unknown");
    for (char *c = out; *c; c++) if (*c == '_') *c = '/';
}

static const char *enum_name(const ProtobufCEnumDescriptor *descriptor, int value) {
    const ProtobufCEnumValue *found = protobuf_c_enum_descriptor_get_value(descriptor, value);
    return found ? found->name : "unknown";
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s HOST PORT\n", argv[0]); return 2; }
    struct addrinfo hints = {0}, *address;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(argv[1], argv[2], &hints, &address) != 0) fail("cannot resolve the address");
    fd = socket(address->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, address->ai_addr, address->ai_addrlen) != 0) fail("cannot connect");
    freeaddrinfo(address);

    /* initialize */
    Threadwire__V1__ClientInfo client_info = THREADWIRE__V1__CLIENT_INFO__INIT;
    client_info.name = "conformance-c";
    char *opt_out[] = {"item/agent_message/delta", "thread/token_usage/updated"};
    Threadwire__V1__Capabilities capabilities = THREADWIRE__V1__CAPABILITIES__INIT;
    capabilities.n_opt_out_notification_methods = 2;
    capabilities.opt_out_notification_methods = opt_out;
    Threadwire__V1__InitializeParams initialize = THREADWIRE__V1__INITIALIZE_PARAMS__INIT;
    initialize.client_info = &client_info;
    initialize.has_protocol_version = 1;
    initialize.protocol_version = 1;
    initialize.capabilities = &capabilities;
    Threadwire__V1__Request request = THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_INITIALIZE;
    request.initialize = &initialize;
    Threadwire__V1__Envelope *answer = call(&request, "initialize");
    printf("initialize: protocol_version=%u server=%s\n", answer->response->initialize->protocol_version,
           answer->response->initialize->server_info->name);
    threadwire__v1__envelope__free_unpacked(answer, NULL);

    /* thread/start with a selected mode */
    Threadwire__V1__ThreadStartParams start = THREADWIRE__V1__THREAD_START_PARAMS__INIT;
    start.has_multi_agent_mode = 1;
    start.multi_agent_mode = THREADWIRE__V1__MULTI_AGENT_MODE__MULTI_AGENT_MODE_PROACTIVE;
    request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_START;
    request.thread_start = &start;
    answer = call(&request, "thread/start");
    Threadwire__V1__ThreadLifecycleResult *started = answer->response->thread_start;
    char *thread_id = strdup(started->thread->id);
    printf("thread/start: selected_mode=%s\n", started->has_multi_agent_mode
           ? enum_name(&threadwire__v1__multi_agent_mode__descriptor, (int)started->multi_agent_mode) : "none");
    threadwire__v1__envelope__free_unpacked(answer, NULL);

    /* turn/start, then notifications to turn/completed */
    Threadwire__V1__UserInput input = THREADWIRE__V1__USER_INPUT__INIT;
    input.content_case = THREADWIRE__V1__USER_INPUT__CONTENT_TEXT;
    input.text = "conformance";
    Threadwire__V1__UserInput *inputs[] = {&input};
    Threadwire__V1__TurnStartParams turn = THREADWIRE__V1__TURN_START_PARAMS__INIT;
    turn.thread_id = thread_id;
    turn.n_input = 1;
    turn.input = inputs;
    request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_TURN_START;
    request.turn_start = &turn;
    answer = call(&request, "turn/start");
    printf("turn/start: status=%s\n", enum_name(&threadwire__v1__turn_status__descriptor, (int)answer->response->turn_start->turn->status));
    threadwire__v1__envelope__free_unpacked(answer, NULL);
    printf("notifications:");
    Threadwire__V1__Envelope *completed = NULL;
    while (!completed) {
        Threadwire__V1__Envelope *envelope;
        Threadwire__V1__Notification *note;
        if (queued_next < queued_count) {
            envelope = queued_envelopes[queued_next];
            note = queued[queued_next++];
        } else {
            envelope = read_envelope();
            if (envelope->kind_case != THREADWIRE__V1__ENVELOPE__KIND_NOTIFICATION) {
                threadwire__v1__envelope__free_unpacked(envelope, NULL);
                continue;
            }
            note = envelope->notification;
        }
        char method[128];
        notification_method(note, method, sizeof method);
        printf(" %s", method);
        if (note->payload_case == THREADWIRE__V1__NOTIFICATION__PAYLOAD_TURN_COMPLETED) completed = envelope;
        else threadwire__v1__envelope__free_unpacked(envelope, NULL);
    }
    printf("\n");
    Threadwire__V1__Turn *done = completed->notification->turn_completed->turn;
    printf("turn/completed: status=%s items=", enum_name(&threadwire__v1__turn_status__descriptor, (int)done->status));
    for (size_t i = 0; i < done->n_items; i++) {
        printf("%s%s", i ? "," : "", enum_name(&threadwire__v1__item_type__descriptor, (int)done->items[i]->type));
    }
    printf("\n");
    threadwire__v1__envelope__free_unpacked(completed, NULL);
    for (; queued_next < queued_count; queued_next++) threadwire__v1__envelope__free_unpacked(queued_envelopes[queued_next], NULL);
    queued_count = queued_next = 0;

    /* thread/settings/update clearing the mode */
    Threadwire__V1__ThreadSettingsUpdateParams update = THREADWIRE__V1__THREAD_SETTINGS_UPDATE_PARAMS__INIT;
    update.thread_id = thread_id;
    update.multi_agent_mode_update_case = THREADWIRE__V1__THREAD_SETTINGS_UPDATE_PARAMS__MULTI_AGENT_MODE_UPDATE_CLEAR_MULTI_AGENT_MODE;
    update.clear_multi_agent_mode = 1;
    request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_SETTINGS_UPDATE;
    request.thread_settings_update = &update;
    answer = call(&request, "thread/settings/update");
    Threadwire__V1__ThreadSettingsUpdateResult *updated = answer->response->thread_settings_update;
    printf("thread/settings/update: changed=%s selected_mode=%s\n", updated->changed ? "true" : "false",
           updated->settings->has_multi_agent_mode
           ? enum_name(&threadwire__v1__multi_agent_mode__descriptor, (int)updated->settings->multi_agent_mode) : "none");
    threadwire__v1__envelope__free_unpacked(answer, NULL);

    /* 1,000 requests written before any answer is read, then one whose 1 ms
     * deadline cannot be met: its answer queues behind the 1,000. */
    Threadwire__V1__ThreadReadParams read = THREADWIRE__V1__THREAD_READ_PARAMS__INIT;
    read.thread_id = thread_id;
    Threadwire__V1__HealthCheckParams health = THREADWIRE__V1__HEALTH_CHECK_PARAMS__INIT;
    uint64_t ids[1000];
    for (int i = 0; i < 1000; i++) {
        request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
        if (i % 2 == 0) { request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_READ; request.thread_read = &read; }
        else { request.params_case = THREADWIRE__V1__REQUEST__PARAMS_HEALTH_CHECK; request.health_check = &health; }
        ids[i] = send_request(&request);
    }
    request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_READ;
    request.thread_read = &read;
    request.has_timeout_ms = 1;
    request.timeout_ms = 1;
    double late_deadline = now_ms() + 1;
    uint64_t late = send_request(&request);
    int answered = 0, matched = 1, ok = 1;
    for (int i = 0; i < 1000; i++) {
        Threadwire__V1__Envelope *envelope = read_envelope();
        if (envelope->kind_case != THREADWIRE__V1__ENVELOPE__KIND_RESPONSE) { i--; threadwire__v1__envelope__free_unpacked(envelope, NULL); continue; }
        Threadwire__V1__Response *response = envelope->response;
        answered++;
        if (response->id != ids[i]) matched = 0;
        if (i % 2 == 0 && !(response->result_case == THREADWIRE__V1__RESPONSE__RESULT_THREAD_READ &&
                             strcmp(response->thread_read->thread->id, thread_id) == 0)) matched = 0;
        if (i % 2 == 1 && response->result_case != THREADWIRE__V1__RESPONSE__RESULT_HEALTH_CHECK) matched = 0;
        if (response->code != 0) ok = 0;
        threadwire__v1__envelope__free_unpacked(envelope, NULL);
    }
    printf("pipelined: sent=1000 answered=%d ids=%s codes=%s\n", answered, matched ? "matched" : "mismatched", ok ? "all_ok" : "errors");
    answer = wait_response(late);
    /* The client's deadline: an answer read after it counts as DEADLINE_EXCEEDED. */
    unsigned code = now_ms() > late_deadline ? 4 : answer->response->code;
    printf("deadline: code=%u\n", code);
    threadwire__v1__envelope__free_unpacked(answer, NULL);

    /* An error code */
    read.thread_id = "no-such-thread";
    request = (Threadwire__V1__Request)THREADWIRE__V1__REQUEST__INIT;
    request.params_case = THREADWIRE__V1__REQUEST__PARAMS_THREAD_READ;
    request.thread_read = &read;
    answer = wait_response(send_request(&request));
    printf("thread/read no-such-thread: code=%u\n", answer->response->code);
    threadwire__v1__envelope__free_unpacked(answer, NULL);
    for (size_t i = 0; i < queued_count; i++) threadwire__v1__envelope__free_unpacked(queued_envelopes[i], NULL);
    free(thread_id);
    close(fd);
    return 0;
}
