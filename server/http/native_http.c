/* The HTTP side of the native interface ([server] interface = "native"): one native thread owns every connection.

   Under Granian's WSGI interface each request costs a request thread's wake-ups and hand-overs of the interpreter's
   lock (docs/performance.md, "Where a request's CPU goes"); here one thread waits on every connection with epoll,
   reads and frames each request (Content-Length or chunks, Expect: 100-continue, keep-alive, HTTP/1.0), and queues
   it whole. Python (native.py) takes every queued request in one call (nh_take, which waits without the
   interpreter's lock), so a burst of arrivals costs one wake-up, and answers each with nh_reply from whichever
   thread has the answer (the batcher's worker, for infer), which writes it at once when the socket takes it.

   A connection carries one request at a time: bytes that arrive while its request is with Python wait in its
   buffer (pipelining is answered in order). The head is parsed here only as far as framing needs and the few
   fields the infer route reads; Python gets the raw head for the rest. Built by native.py with the system's C
   compiler and loaded with ctypes: no Python API. */

#define _GNU_SOURCE
#include <errno.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 128
#define MAX_HEAD 65536
#define FIRST_BUFFER 8192
#define DRAIN_LIMIT (8 << 20) /* unread body bytes read and dropped after an early answer, as fastpath.DrainAfter */

/* Record flags, as native.py reads them. */
enum { FLAG_TOO_LARGE = 1, FLAG_CHUNKED = 2, FLAG_CLOSE = 4, FLAG_BAD = 8 };
/* Fields located in the head, in this order: offset and length each. */
enum { F_METHOD, F_PATH, F_QUERY, F_CONTENT_TYPE, F_AUTHORIZATION, F_BINARY_LENGTH, F_CONTENT_LENGTH,
       F_TRANSFER_ENCODING, F_COUNT };

typedef struct {
    uint64_t token;
    uint32_t flags;
    uint32_t head_length;
    uint64_t body_length;
    uint32_t peer_length;
    uint32_t record_length; /* this record's bytes, padded to 8 */
    double arrived;         /* when it was read whole, on CLOCK_MONOTONIC (Python's time.perf_counter) */
    uint32_t field[2 * F_COUNT];
} nh_record;

enum { FREE = 0, READING, WITH_PYTHON, LINGERING };

typedef struct {
    int fd;
    uint32_t generation;
    int state;
    char *in;
    size_t in_length, in_capacity;
    size_t head_length;   /* 0 while the head is incomplete */
    int64_t declared;     /* Content-Length; -1: chunked */
    char *body;           /* a chunked body, decoded */
    size_t body_length, body_capacity, chunk_at; /* chunk_at: where undecoded chunk bytes start in `in` */
    uint32_t flags;
    int continue_sent, expects_continue;
    int peer_closed;
    int keep_alive;
    char *out;
    size_t out_length, out_sent, out_capacity;
    int close_after;      /* close once the answer is out */
    size_t drained;
    size_t skip;          /* bytes of a refused body still to drop before the next request */
    int watching_out;
    char peer[64];
    uint32_t field[2 * F_COUNT];
    int queued;           /* in the ready list */
    int next_ready;
    double arrived;
} connection;

typedef struct {
    int epoll, wake, listen_fd, listening;
    int notify;           /* an eventfd written when the queue of requests stops being empty (nh_notify); -1: none */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t arrived;
    int stopping, running, woken;
    connection *connections;
    int slots, open;
    int64_t max_body;
    int ready_head, ready_tail, ready_count; /* requests complete and not yet taken */
    int *resume;                               /* connections whose buffered bytes wait to be parsed again */
    int resume_count;
} nh_server;

static uint64_t token_of(int slot, uint32_t generation) { return ((uint64_t)generation << 32) | (uint32_t)slot; }

static int grow(char **buffer, size_t *capacity, size_t needed) {
    if (needed <= *capacity) return 0;
    size_t size = *capacity ? *capacity : FIRST_BUFFER;
    while (size < needed) size *= 2;
    char *bigger = realloc(*buffer, size);
    if (!bigger) return -1;
    *buffer = bigger;
    *capacity = size;
    return 0;
}

static void watch(nh_server *s, int slot, int out) {
    connection *c = &s->connections[slot];
    if (c->watching_out == out) return;
    struct epoll_event event = {.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0), .data.u64 = (uint64_t)slot};
    epoll_ctl(s->epoll, EPOLL_CTL_MOD, c->fd, &event);
    c->watching_out = out;
}

static void close_connection(nh_server *s, int slot) {
    connection *c = &s->connections[slot];
    if (c->state == FREE) return;
    epoll_ctl(s->epoll, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->state = FREE;
    c->generation++;
    c->in_length = c->out_length = c->out_sent = c->body_length = 0;
    s->open--;
    if (!s->listening && !s->stopping && s->listen_fd >= 0) {
        struct epoll_event event = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
        if (epoll_ctl(s->epoll, EPOLL_CTL_ADD, s->listen_fd, &event) == 0) s->listening = 1;
    }
}

/* Write what the socket takes; then close, linger or go back to reading. Called with the lock held. */
static void flush(nh_server *s, int slot) {
    connection *c = &s->connections[slot];
    while (c->out_sent < c->out_length) {
        ssize_t n = send(c->fd, c->out + c->out_sent, c->out_length - c->out_sent, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_sent += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            watch(s, slot, 1);
            return;
        } else {
            close_connection(s, slot);
            return;
        }
    }
    c->out_length = c->out_sent = 0;
    if (c->close_after && c->peer_closed) {
        close_connection(s, slot);
        return;
    }
    watch(s, slot, 0);
    if (c->close_after) {
        /* read and drop what the client still sends, so that closing does not reset the answer away */
        shutdown(c->fd, SHUT_WR);
        c->state = LINGERING;
        c->drained = 0;
    }
}

static void ready(nh_server *s, int slot) {
    connection *c = &s->connections[slot];
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    c->arrived = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
    c->state = WITH_PYTHON;
    c->queued = 1;
    c->next_ready = -1;
    if (s->ready_count == 0) s->ready_head = slot;
    else s->connections[s->ready_tail].next_ready = slot;
    s->ready_tail = slot;
    s->ready_count++;
    pthread_cond_signal(&s->arrived);
    uint64_t one = 1;
    if (s->ready_count == 1 && s->notify >= 0 && write(s->notify, &one, sizeof one) < 0) { /* one is pending */ }
}

static int field_is(const char *name, size_t length, const char *wanted) {
    return strlen(wanted) == length && strncasecmp(name, wanted, length) == 0;
}

static const char *find(const char *at, size_t length, const char *what) {
    return memmem(at, length, what, strlen(what));
}

static int has_token(const char *value, size_t length, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i + n <= length; i++)
        if (strncasecmp(value + i, token, n) == 0) return 1;
    return 0;
}

/* Parse a complete head: request line, framing, the fields Python reads. -1: not HTTP (answered 400 by Python). */
static int parse_head(connection *c) {
    const char *head = c->in;
    size_t end = c->head_length - 2; /* the blank line's CRLF */
    memset(c->field, 0, sizeof c->field);
    c->declared = 0;
    c->flags = 0;
    c->expects_continue = 0;
    const char *line_end = find(head, end, "\r\n");
    if (!line_end) return -1;
    const char *space = memchr(head, ' ', (size_t)(line_end - head));
    if (!space || space == head) return -1;
    c->field[2 * F_METHOD] = 0;
    c->field[2 * F_METHOD + 1] = (uint32_t)(space - head);
    const char *target = space + 1;
    const char *space2 = memchr(target, ' ', (size_t)(line_end - target));
    if (!space2 || space2 == target) return -1;
    const char *version = space2 + 1;
    size_t version_length = (size_t)(line_end - version);
    if (version_length != 8 || strncmp(version, "HTTP/1.", 7) != 0) return -1;
    int http10 = version[7] == '0';
    const char *query = memchr(target, '?', (size_t)(space2 - target));
    const char *path_end = query ? query : space2;
    c->field[2 * F_PATH] = (uint32_t)(target - head);
    c->field[2 * F_PATH + 1] = (uint32_t)(path_end - target);
    if (query) {
        c->field[2 * F_QUERY] = (uint32_t)(query + 1 - head);
        c->field[2 * F_QUERY + 1] = (uint32_t)(space2 - query - 1);
    }
    int keep_alive = !http10, chunked = 0, has_length = 0;
    int64_t length = 0;
    const char *line = line_end + 2;
    while (line < head + end) {
        const char *next = find(line, (size_t)(head + end - line), "\r\n");
        if (!next) next = head + end;
        const char *colon = memchr(line, ':', (size_t)(next - line));
        if (!colon) return -1;
        size_t name_length = (size_t)(colon - line);
        const char *value = colon + 1;
        while (value < next && (*value == ' ' || *value == '\t')) value++;
        const char *value_end = next;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) value_end--;
        size_t value_length = (size_t)(value_end - value);
        int index = -1;
        if (field_is(line, name_length, "content-type")) index = F_CONTENT_TYPE;
        else if (field_is(line, name_length, "authorization")) index = F_AUTHORIZATION;
        else if (field_is(line, name_length, "inference-header-content-length")) index = F_BINARY_LENGTH;
        else if (field_is(line, name_length, "content-length")) {
            index = F_CONTENT_LENGTH;
            if (value_length == 0 || value_length > 18) return -1;
            int64_t parsed = 0;
            for (size_t i = 0; i < value_length; i++) {
                if (value[i] < '0' || value[i] > '9') return -1;
                parsed = parsed * 10 + (value[i] - '0');
            }
            if (has_length && parsed != length) return -1;
            length = parsed;
            has_length = 1;
        } else if (field_is(line, name_length, "transfer-encoding")) {
            index = F_TRANSFER_ENCODING;
            if (has_token(value, value_length, "chunked")) chunked = 1;
            else return -1; /* no other coding is taken */
        } else if (field_is(line, name_length, "connection")) {
            if (has_token(value, value_length, "close")) keep_alive = 0;
            else if (has_token(value, value_length, "keep-alive")) keep_alive = 1;
        } else if (field_is(line, name_length, "expect")) {
            if (has_token(value, value_length, "100-continue") && !http10) c->expects_continue = 1;
        }
        if (index >= 0) {
            c->field[2 * index] = (uint32_t)(value - head);
            c->field[2 * index + 1] = (uint32_t)value_length;
        }
        line = next + 2;
    }
    if (chunked && has_length) return -1; /* RFC 9112: a request with both is refused */
    c->keep_alive = keep_alive;
    if (!keep_alive) c->flags |= FLAG_CLOSE;
    if (chunked) {
        c->declared = -1;
        c->flags |= FLAG_CHUNKED;
    } else {
        c->declared = length;
    }
    return 0;
}

/* Decode the chunks received so far. 1: body complete; 0: more to come; -1: malformed; -2: over the limit. */
static int decode_chunks(nh_server *s, connection *c) {
    for (;;) {
        char *at = c->in + c->chunk_at;
        size_t left = c->in_length - c->chunk_at;
        char *line_end = (char *)find(at, left, "\r\n");
        if (!line_end) return left > 1024 ? -1 : 0;
        uint64_t size = 0;
        char *p = at;
        int digits = 0;
        for (; p < line_end; p++) {
            char ch = *p;
            int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
            if (v < 0) break;
            if (++digits > 15) return -1;
            size = size * 16 + (uint64_t)v;
        }
        if (!digits || (p < line_end && *p != ';' && *p != ' ' && *p != '\t')) return -1;
        size_t after_line = (size_t)(line_end + 2 - at);
        if (size == 0) { /* the last chunk: trailers end with a blank line */
            char *trailers = line_end + 2;
            size_t rest = c->in_length - (size_t)(trailers - c->in);
            if (rest >= 2 && trailers[0] == '\r' && trailers[1] == '\n') {
                c->chunk_at = (size_t)(trailers + 2 - c->in);
                return 1;
            }
            const char *blank = find(trailers, rest, "\r\n\r\n");
            if (!blank) return rest > MAX_HEAD ? -1 : 0;
            c->chunk_at = (size_t)(blank + 4 - c->in);
            return 1;
        }
        if (c->body_length + size > (uint64_t)s->max_body) return -2;
        if (left < after_line + size + 2) return 0;
        if (at[after_line + size] != '\r' || at[after_line + size + 1] != '\n') return -1;
        if (grow(&c->body, &c->body_capacity, c->body_length + size) < 0) return -1;
        memcpy(c->body + c->body_length, at + after_line, size);
        c->body_length += size;
        c->chunk_at += after_line + size + 2;
    }
}

static void answer_now(nh_server *s, int slot, const char *text) {
    connection *c = &s->connections[slot];
    size_t n = strlen(text);
    if (grow(&c->out, &c->out_capacity, c->out_length + n) < 0) {
        close_connection(s, slot);
        return;
    }
    memcpy(c->out + c->out_length, text, n);
    c->out_length += n;
    c->close_after = 1;
    flush(s, slot);
}

/* Drop what has arrived of a refused body, keeping the connection; 1: more of it is still to come. */
static int skip_refused(connection *c) {
    size_t dropped = c->skip < c->in_length ? c->skip : c->in_length;
    memmove(c->in, c->in + dropped, c->in_length - dropped);
    c->in_length -= dropped;
    c->skip -= dropped;
    return c->skip > 0;
}

/* Frame what the connection holds: a request handed to Python once whole. Called with the lock held. */
static void parse(nh_server *s, int slot) {
    connection *c = &s->connections[slot];
    if (c->state != READING) return;
    if (c->skip && skip_refused(c)) return;
    if (c->head_length == 0) {
        /* tolerate the blank lines some clients send between requests (RFC 9112 2.2) */
        size_t skip = 0;
        while (skip + 1 < c->in_length && c->in[skip] == '\r' && c->in[skip + 1] == '\n') skip += 2;
        if (skip) {
            memmove(c->in, c->in + skip, c->in_length - skip);
            c->in_length -= skip;
        }
        const char *blank = find(c->in, c->in_length < MAX_HEAD ? c->in_length : MAX_HEAD, "\r\n\r\n");
        if (!blank) {
            if (c->in_length >= MAX_HEAD) {
                static const char body[] = "{\"error\": \"request head over 65536 bytes\"}";
                char answer[256];
                snprintf(answer, sizeof answer,
                         "HTTP/1.1 431 REQUEST HEADER FIELDS TOO LARGE\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", sizeof body - 1, body);
                answer_now(s, slot, answer);
            }
            return;
        }
        c->head_length = (size_t)(blank + 4 - c->in);
        c->body_length = 0;
        c->chunk_at = c->head_length;
        c->continue_sent = 0;
        if (parse_head(c) < 0) {
            c->flags = FLAG_BAD | FLAG_CLOSE;
            c->declared = 0;
            c->keep_alive = 0;
            ready(s, slot);
            return;
        }
        if (c->declared > s->max_body) { /* refused on its head: Python answers 413 and the body is dropped as it
                                             comes, the connection kept; past DRAIN_LIMIT it is closed */
            c->flags |= FLAG_TOO_LARGE;
            if (c->declared > DRAIN_LIMIT) {
                c->flags |= FLAG_CLOSE;
                c->keep_alive = 0;
            }
            ready(s, slot);
            return;
        }
    }
    int complete;
    if (c->declared >= 0) {
        complete = c->in_length >= c->head_length + (size_t)c->declared;
    } else {
        complete = decode_chunks(s, c);
        if (complete == -1) {
            c->flags = FLAG_BAD | FLAG_CLOSE;
            c->keep_alive = 0;
            ready(s, slot);
            return;
        }
        if (complete == -2) {
            c->flags |= FLAG_TOO_LARGE | FLAG_CLOSE;
            c->keep_alive = 0;
            ready(s, slot);
            return;
        }
    }
    if (complete) {
        ready(s, slot);
    } else if (c->expects_continue && !c->continue_sent) {
        c->continue_sent = 1;
        static const char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (grow(&c->out, &c->out_capacity, c->out_length + sizeof go_on - 1) == 0) {
            memcpy(c->out + c->out_length, go_on, sizeof go_on - 1);
            c->out_length += sizeof go_on - 1;
            flush(s, slot);
        }
    }
}

/* Read what the socket holds. Called with the lock held. */
static void receive(nh_server *s, int slot) {
    connection *c = &s->connections[slot];
    char scratch[16384];
    for (;;) {
        if (c->state == LINGERING) {
            ssize_t n = recv(c->fd, scratch, sizeof scratch, 0);
            if (n > 0 && (c->drained += (size_t)n) <= DRAIN_LIMIT) continue;
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
            close_connection(s, slot);
            return;
        }
        size_t limit = (size_t)s->max_body + 2 * MAX_HEAD;
        if (c->in_length >= limit) { /* a client sending far past its request: stop reading until answered */
            if (c->state != WITH_PYTHON) { /* cannot be a request any more */
                close_connection(s, slot);
                return;
            }
            struct epoll_event event = {.events = c->watching_out == 1 ? EPOLLOUT : 0, .data.u64 = (uint64_t)slot};
            epoll_ctl(s->epoll, EPOLL_CTL_MOD, c->fd, &event);
            c->watching_out = -1; /* the next watch() watches for reading again */
            return;
        }
        if (grow(&c->in, &c->in_capacity, c->in_length + 16384) < 0) {
            close_connection(s, slot);
            return;
        }
        size_t room = c->in_capacity - c->in_length;
        ssize_t n = recv(c->fd, c->in + c->in_length, room, 0);
        if (n > 0) {
            c->in_length += (size_t)n;
            if (c->skip && c->state == READING) skip_refused(c);
            if ((size_t)n < room) break; /* the socket is empty */
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n < 0 && errno == EINTR) continue;
        /* the client closed (or failed): a request with Python is still answered, then the connection closes */
        if (c->state == WITH_PYTHON && n == 0) {
            c->peer_closed = 1;
            struct epoll_event event = {.events = c->watching_out == 1 ? EPOLLOUT : 0, .data.u64 = (uint64_t)slot};
            epoll_ctl(s->epoll, EPOLL_CTL_MOD, c->fd, &event);
            c->watching_out = 2; /* neither: flush() closes the connection once the answer is out */
            return;
        }
        close_connection(s, slot);
        return;
    }
    parse(s, slot);
}

static void accept_all(nh_server *s) {
    for (;;) {
        struct sockaddr_storage address;
        socklen_t size = sizeof address;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&address, &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int slot = -1;
        for (int i = 0; i < s->slots; i++)
            if (s->connections[i].state == FREE) { slot = i; break; }
        if (slot < 0) { close(fd); return; }
        connection *c = &s->connections[slot];
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof one);
        c->fd = fd;
        c->state = READING;
        c->in_length = c->out_length = c->out_sent = c->head_length = c->body_length = 0;
        c->peer_closed = c->close_after = c->watching_out = c->queued = 0;
        c->skip = 0;
        c->peer[0] = 0;
        if (address.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&address)->sin_addr, c->peer, sizeof c->peer);
        else if (address.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&address)->sin6_addr, c->peer, sizeof c->peer);
        struct epoll_event event = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = (uint64_t)slot};
        epoll_ctl(s->epoll, EPOLL_CTL_ADD, fd, &event);
        s->open++;
        if (s->open >= s->slots && s->listening) {
            epoll_ctl(s->epoll, EPOLL_CTL_DEL, s->listen_fd, NULL);
            s->listening = 0;
        }
    }
}

static void *serve(void *argument) {
    nh_server *s = argument;
    struct epoll_event events[MAX_EVENTS];
    while (!s->stopping) {
        int n = epoll_wait(s->epoll, events, MAX_EVENTS, 200);
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < n; i++) {
            uint64_t key = events[i].data.u64;
            if (key == UINT64_MAX) {
                if (!s->stopping) accept_all(s);
            } else if (key == UINT64_MAX - 1) {
                uint64_t count;
                if (read(s->wake, &count, sizeof count) < 0) { /* nothing to read: another read took it */ }
            } else {
                int slot = (int)key;
                connection *c = &s->connections[slot];
                if (c->state == FREE) continue;
                if (events[i].events & EPOLLOUT) flush(s, slot);
                if (c->state != FREE && events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) receive(s, slot);
            }
        }
        for (int i = 0; i < s->resume_count; i++) {
            int slot = s->resume[i];
            if (s->connections[slot].state == READING) parse(s, slot);
        }
        s->resume_count = 0;
        pthread_mutex_unlock(&s->lock);
    }
    return NULL;
}

nh_server *nh_new(int listen_fd, int64_t max_body, int slots) {
    nh_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->listen_fd = listen_fd;
    s->max_body = max_body;
    s->slots = slots;
    s->connections = calloc((size_t)slots, sizeof(connection));
    s->resume = calloc((size_t)slots, sizeof(int));
    s->epoll = epoll_create1(EPOLL_CLOEXEC);
    s->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->notify = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->arrived, NULL);
    struct epoll_event event = {.events = EPOLLIN, .data.u64 = UINT64_MAX - 1};
    epoll_ctl(s->epoll, EPOLL_CTL_ADD, s->wake, &event);
    struct epoll_event listen_event = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (epoll_ctl(s->epoll, EPOLL_CTL_ADD, listen_fd, &listen_event) == 0) s->listening = 1;
    if (pthread_create(&s->thread, NULL, serve, s) != 0) {
        free(s->connections);
        free(s->resume);
        free(s);
        return NULL;
    }
    s->running = 1;
    return s;
}

/* Copy the queued requests into `buffer` (records, each: nh_record, head, peer, body, padded to 8), waiting up to
   `timeout_ms` for one. Returns the bytes written; 0: none came (or nh_wake); -N: the first request needs N
   bytes (call again with a buffer that large). */
int64_t nh_take(nh_server *s, char *buffer, int64_t capacity, int timeout_ms) {
    pthread_mutex_lock(&s->lock);
    if (s->ready_count == 0 && !s->woken && timeout_ms > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        while (s->ready_count == 0 && !s->woken)
            if (pthread_cond_timedwait(&s->arrived, &s->lock, &until) == ETIMEDOUT) break;
    }
    s->woken = 0;
    int64_t written = 0;
    while (s->ready_count > 0) {
        int slot = s->ready_head;
        connection *c = &s->connections[slot];
        size_t body_length = 0;
        const char *body = NULL;
        if (!(c->flags & (FLAG_TOO_LARGE | FLAG_BAD))) {
            if (c->declared >= 0) { body = c->in + c->head_length; body_length = (size_t)c->declared; }
            else { body = c->body; body_length = c->body_length; }
        }
        size_t peer_length = strlen(c->peer);
        size_t length = (sizeof(nh_record) + c->head_length + peer_length + body_length + 7) & ~(size_t)7;
        if (written + (int64_t)length > capacity) {
            if (written == 0) { pthread_mutex_unlock(&s->lock); return -(int64_t)length; }
            break;
        }
        nh_record *record = (nh_record *)(buffer + written);
        record->token = token_of(slot, c->generation);
        record->flags = c->flags;
        record->head_length = (uint32_t)c->head_length;
        record->body_length = body_length;
        record->peer_length = (uint32_t)peer_length;
        record->record_length = (uint32_t)length;
        record->arrived = c->arrived;
        memcpy(record->field, c->field, sizeof c->field);
        char *at = (char *)(record + 1);
        memcpy(at, c->in, c->head_length);
        memcpy(at + c->head_length, c->peer, peer_length);
        if (body_length) memcpy(at + c->head_length + peer_length, body, body_length);
        written += (int64_t)length;
        c->queued = 0;
        s->ready_head = c->next_ready;
        s->ready_count--;
    }
    pthread_mutex_unlock(&s->lock);
    return written;
}

/* Answer the request `token` holds with `length` bytes (a whole HTTP response); `close`: close the connection once
   it is out. Written at once as far as the socket takes it. 0; -1: the connection is gone (the answer dropped). */
int nh_reply(nh_server *s, uint64_t token, const char *data, int64_t length, int close) {
    int slot = (int)(token & 0xffffffffu);
    pthread_mutex_lock(&s->lock);
    connection *c = &s->connections[slot];
    if (slot >= s->slots || c->state != WITH_PYTHON || c->generation != (uint32_t)(token >> 32) || c->queued) {
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    /* the request's bytes leave the buffer: what follows them is the next request */
    size_t used;
    if (c->flags & FLAG_BAD || (c->flags & FLAG_TOO_LARGE && c->declared < 0)) {
        used = c->in_length; /* closed after the answer: the rest is drained, not parsed */
    } else if (c->flags & FLAG_TOO_LARGE) {
        used = c->head_length;
        c->skip = (size_t)c->declared;
    } else {
        used = c->declared >= 0 ? c->head_length + (size_t)c->declared : c->chunk_at;
    }
    if (used > c->in_length) used = c->in_length;
    memmove(c->in, c->in + used, c->in_length - used);
    c->in_length -= used;
    c->head_length = 0;
    c->state = READING;
    if (c->skip) skip_refused(c);
    if (close || !c->keep_alive || c->peer_closed || c->flags & (FLAG_CLOSE | FLAG_BAD)) c->close_after = 1;
    if (grow(&c->out, &c->out_capacity, c->out_length + (size_t)length) < 0) {
        close_connection(s, slot);
        pthread_mutex_unlock(&s->lock);
        return -1;
    }
    memcpy(c->out + c->out_length, data, (size_t)length);
    c->out_length += (size_t)length;
    flush(s, slot);
    if (c->state == READING && c->in_length > 0) { /* a pipelined request waits: the native thread parses it */
        s->resume[s->resume_count++] = slot;
        uint64_t one = 1;
        if (write(s->wake, &one, sizeof one) < 0) { /* the counter is full: a wake-up is already pending */ }
    }
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* Make a waiting nh_take return now (and a caller polling nh_notify's descriptor look). */
void nh_wake(nh_server *s) {
    pthread_mutex_lock(&s->lock);
    s->woken = 1;
    pthread_cond_signal(&s->arrived);
    uint64_t one = 1;
    if (s->notify >= 0 && write(s->notify, &one, sizeof one) < 0) { /* one is pending */ }
    pthread_mutex_unlock(&s->lock);
}

/* An eventfd, readable whenever requests wait to be taken (written when the queue stops being empty, and by
   nh_wake): for a caller that polls it beside other descriptors and takes with a timeout of 0. Created on the
   first call; -1 where it cannot be. */
int nh_notify(nh_server *s) {
    pthread_mutex_lock(&s->lock);
    if (s->notify < 0) {
        s->notify = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        uint64_t one = 1;
        if (s->notify >= 0 && s->ready_count > 0 && write(s->notify, &one, sizeof one) < 0) { /* pending */ }
    }
    int fd = s->notify;
    pthread_mutex_unlock(&s->lock);
    return fd;
}

/* Stop accepting connections (the listening socket stays the caller's). */
void nh_stop_accepting(nh_server *s) {
    pthread_mutex_lock(&s->lock);
    if (s->listening) epoll_ctl(s->epoll, EPOLL_CTL_DEL, s->listen_fd, NULL);
    s->listening = 0;
    s->listen_fd = -1;
    pthread_mutex_unlock(&s->lock);
}

/* Stop the native thread and close every connection. */
void nh_free(nh_server *s) {
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_mutex_unlock(&s->lock);
    uint64_t one = 1;
    if (write(s->wake, &one, sizeof one) < 0) { /* a wake-up is pending already */ }
    if (s->running) pthread_join(s->thread, NULL);
    for (int i = 0; i < s->slots; i++) {
        connection *c = &s->connections[i];
        if (c->state != FREE) close(c->fd);
        free(c->in);
        free(c->out);
        free(c->body);
    }
    close(s->epoll);
    close(s->wake);
    if (s->notify >= 0) close(s->notify);
    pthread_cond_destroy(&s->arrived);
    pthread_mutex_destroy(&s->lock);
    free(s->connections);
    free(s->resume);
    free(s);
}
