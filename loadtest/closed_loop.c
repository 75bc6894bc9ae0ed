/* The closed loop's connections driven from one native thread, as wrk drives its own with epoll.

   A Python sender costs a request about twice what wrk does on the same server (docs/measurement.md, "Closed
   loop against wrk"), most of it the interpreter's per-answer work, on the cores the server under test needs. Here
   one thread per process (native_loop.py starts it) waits on every registered connection with epoll; the moment
   an answer is read whole it is recorded and the connection's next request is sent, with no Python in between.
   The users' greenlets take what finished (ll_take) a few times a second, register and drop connections, and
   time out a request that waits too long, as the Python loop sender's do.

   An answer is read as the Python senders read one (raw_http.py): its status, whether it asks to retry after a
   while, its body's length and whether the connection stays open; framed by Content-Length, chunks, or the
   connection's end. Built by native_loop.py with the system's C compiler and loaded with ctypes: no Python API. */

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 64
#define FIRST_BUFFER 16384
#define MAX_HEAD (1 << 20)

/* One finished request, as native_loop.py's numpy dtype reads it. */
typedef struct {
    double sent, done;
    int32_t status;      /* 0: no answer */
    int32_t retry_after; /* the answer carried Retry-After */
    int64_t received;    /* the body's length */
    int32_t error;       /* 0; an errno where a system call failed; ERROR_HTTP where the answer was not HTTP */
    int32_t padding;
} ll_record;

enum { ERROR_HTTP = -1, ERROR_CLOSED = -2 };

enum { STATE_RUNNING = 0, STATE_CLOSED = 1, STATE_FAILED = 2 };

typedef struct {
    int in_use;
    uint32_t generation;
    int fd;
    int state;
    const char *const *requests; /* the cycle of requests to send, owned by the caller */
    const int64_t *lengths;
    int64_t count, next;
    const char *pending; /* the unsent rest of the request in flight */
    int64_t pending_length;
    int writing; /* waiting for the socket to take the rest */
    int flying;
    double sent;
    char *buffer;
    int64_t size, capacity;
    ll_record *records;
    int64_t finished, room;
} connection;

typedef struct {
    int epoll, wake, notify; /* notify: counts the connections that stopped (closed or failed), for Python */
    pthread_t thread;
    pthread_mutex_t lock;
    int stopping;
    connection *connections;
    int slots;
} ll_driver;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t); /* time.time()'s clock: the Python side compares with it */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t key_of(int slot, uint32_t generation) { return ((uint64_t)generation << 32) | (uint32_t)slot; }

static int keep_record(connection *c, double done, int status, int retry_after, int64_t received, int error) {
    if (c->finished == c->room) {
        int64_t room = c->room ? 2 * c->room : 256;
        ll_record *grown = realloc(c->records, (size_t)room * sizeof(ll_record));
        if (!grown) return -1;
        c->records = grown;
        c->room = room;
    }
    ll_record *r = &c->records[c->finished++];
    r->sent = c->sent;
    r->done = done;
    r->status = status;
    r->retry_after = retry_after;
    r->received = received;
    r->error = error;
    r->padding = 0;
    return 0;
}

static void stop_watching(ll_driver *d, connection *c, int state) {
    epoll_ctl(d->epoll, EPOLL_CTL_DEL, c->fd, NULL);
    c->state = state;
    uint64_t one = 1;
    if (write(d->notify, &one, sizeof one) < 0) { /* full or closed: the users' greenlets see it at their tick */
    }
}

static void fail(ll_driver *d, connection *c, int error) {
    if (c->flying) keep_record(c, now(), 0, 0, 0, error);
    c->flying = 0;
    stop_watching(d, c, STATE_FAILED);
}

static void want_write(ll_driver *d, connection *c, int slot, int on) {
    struct epoll_event e = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.u64 = key_of(slot, c->generation)};
    epoll_ctl(d->epoll, EPOLL_CTL_MOD, c->fd, &e);
}

static void write_pending(ll_driver *d, connection *c, int slot) {
    while (c->pending_length > 0) {
        ssize_t n = send(c->fd, c->pending, (size_t)c->pending_length, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!c->writing) want_write(d, c, slot, 1);
                c->writing = 1;
                return;
            }
            if (errno == EINTR) continue;
            fail(d, c, errno);
            return;
        }
        c->pending += n;
        c->pending_length -= n;
    }
    if (c->writing) want_write(d, c, slot, 0);
    c->writing = 0;
}

static void send_next(ll_driver *d, connection *c, int slot) {
    int64_t which = c->next;
    c->next = (c->next + 1) % c->count;
    c->pending = c->requests[which];
    c->pending_length = c->lengths[which];
    c->size = 0;
    c->flying = 1;
    c->sent = now();
    write_pending(d, c, slot);
}

static const char *find_head_end(const char *at, int64_t size) {
    const char *end = memmem(at, (size_t)size, "\r\n\r\n", 4);
    return end ? end + 4 : NULL;
}

/* The value of header `name` (lower case, with its colon) in the head [start, end); NULL where absent. */
static const char *header(const char *start, const char *end, const char *name, size_t length) {
    const char *line = memchr(start, '\n', (size_t)(end - start));
    while (line && line + 1 + length < end) {
        line++;
        if (strncasecmp(line, name, length) == 0) {
            const char *value = line + length;
            while (value < end && (*value == ' ' || *value == '\t')) value++;
            return value;
        }
        line = memchr(line, '\n', (size_t)(end - line));
    }
    return NULL;
}

/* The body length of a complete chunked body in [at, end); -1 while incomplete, -2 where malformed. */
static int64_t chunked_length(const char *at, const char *end) {
    int64_t length = 0;
    for (;;) {
        const char *eol = memmem(at, (size_t)(end - at), "\r\n", 2);
        if (!eol) return -1;
        char *stop;
        long long size = strtoll(at, &stop, 16);
        if (stop == at || size < 0) return -2;
        at = eol + 2;
        if (size == 0) return memmem(at - 2, (size_t)(end - at + 2), "\r\n\r\n", 4) ? length : -1;
        if (end - at < size + 2) return -1;
        length += size;
        at += size + 2;
    }
}

/* Whether the answer in the buffer is whole (1; its figures set), incomplete (0) or not HTTP (-1). At the
   connection's end (`closed`) an answer without framing ends there; one whose framing wanted more is cut. */
static int parse(connection *c, int closed, int *status, int *retry_after, int64_t *received, int *keep) {
    const char *start = c->buffer, *end = find_head_end(start, c->size);
    if (!end) return c->size > MAX_HEAD || (closed && c->size) ? -1 : 0;
    if (end - start < 12 || strncasecmp(start, "http/", 5) != 0) return -1;
    if (start[9] < '0' || start[9] > '9' || start[10] < '0' || start[10] > '9' || start[11] < '0' || start[11] > '9')
        return -1;
    *status = (start[9] - '0') * 100 + (start[10] - '0') * 10 + (start[11] - '0');
    *keep = strncasecmp(start, "http/1.1", 8) == 0;
    const char *value = header(start, end, "connection:", 11);
    if (value && strncasecmp(value, "close", 5) == 0) *keep = 0;
    *retry_after = header(start, end, "retry-after:", 12) != NULL;
    int64_t body = c->size - (end - start);
    value = header(start, end, "transfer-encoding:", 18);
    if (value && memmem(value, (size_t)(end - value), "chunked", 7)) {
        int64_t length = chunked_length(end, start + c->size);
        if (length == -2) return -1;
        if (length < 0) return closed ? -1 : 0;
        *received = length;
        return 1;
    }
    value = header(start, end, "content-length:", 15);
    if (value) {
        char *stop;
        long long length = strtoll(value, &stop, 10);
        if (stop == value || length < 0) return -1;
        if (body < length) return closed ? -1 : 0;
        *received = length;
        return 1;
    }
    if (*status == 204 || *status == 304 || *status < 200) {
        *received = 0;
        return 1;
    }
    if (!closed) return 0;
    *received = body;
    *keep = 0;
    return 1;
}

static void readable(ll_driver *d, connection *c, int slot) {
    for (;;) {
        if (c->capacity - c->size < 4096) {
            int64_t capacity = c->capacity ? 2 * c->capacity : FIRST_BUFFER;
            char *grown = realloc(c->buffer, (size_t)capacity);
            if (!grown) {
                fail(d, c, ENOMEM);
                return;
            }
            c->buffer = grown;
            c->capacity = capacity;
        }
        ssize_t n = recv(c->fd, c->buffer + c->size, (size_t)(c->capacity - c->size), 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            fail(d, c, errno);
            return;
        }
        if (!c->flying) { /* between requests: the server closed it, or spoke out of turn */
            stop_watching(d, c, STATE_CLOSED);
            return;
        }
        c->size += n;
        int status = 0, retry_after = 0, keep = 0;
        int64_t received = 0;
        int found = parse(c, n == 0, &status, &retry_after, &received, &keep);
        if (found < 0) {
            fail(d, c, n == 0 ? ERROR_CLOSED : ERROR_HTTP);
            return;
        }
        if (found == 0) {
            if (n == 0) { /* closed with nothing of the answer read */
                fail(d, c, ERROR_CLOSED);
                return;
            }
            continue;
        }
        c->flying = 0;
        if (keep_record(c, now(), status, retry_after, received, 0) < 0) {
            fail(d, c, ENOMEM);
            return;
        }
        if (!keep) {
            stop_watching(d, c, STATE_CLOSED);
            return;
        }
        send_next(d, c, slot);
        return;
    }
}

static void *drive(void *argument) {
    ll_driver *d = argument;
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(d->epoll, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        pthread_mutex_lock(&d->lock);
        if (d->stopping) {
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            uint64_t key = events[i].data.u64;
            if (key == UINT64_MAX) { /* the wake-up: drained, then the stopping flag above decides */
                uint64_t ignored;
                if (read(d->wake, &ignored, sizeof ignored) < 0) continue;
                continue;
            }
            int slot = (int)(uint32_t)key;
            if (slot >= d->slots) continue;
            connection *c = &d->connections[slot];
            if (!c->in_use || c->generation != (uint32_t)(key >> 32) || c->state != STATE_RUNNING)
                continue; /* dropped or reused since epoll_wait returned */
            if (events[i].events & EPOLLOUT) write_pending(d, c, slot);
            if (c->state == STATE_RUNNING && events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) readable(d, c, slot);
        }
        pthread_mutex_unlock(&d->lock);
    }
}

ll_driver *ll_new(void) {
    ll_driver *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->epoll = epoll_create1(EPOLL_CLOEXEC);
    d->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    d->notify = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&d->lock, NULL);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (d->epoll < 0 || d->wake < 0 || d->notify < 0 || epoll_ctl(d->epoll, EPOLL_CTL_ADD, d->wake, &e) < 0 ||
        pthread_create(&d->thread, NULL, drive, d) != 0) {
        if (d->epoll >= 0) close(d->epoll);
        if (d->wake >= 0) close(d->wake);
        if (d->notify >= 0) close(d->notify);
        free(d);
        return NULL;
    }
    return d;
}

/* The eventfd that becomes readable when a connection stops (the server closed it, or it failed): Python's event
   loop watches it, so that the user whose connection it was opens the next one at once. */
int ll_notify_fd(ll_driver *d) { return d->notify; }

/* Watch connected, non-blocking socket `fd` (now the driver's: ll_drop closes it) and send request `first` of
   its `count` requests, sent in turn and again from the first after the last. The requests stay the caller's and must
   outlive the connection. The connection's slot; -1 where there is no memory for it. */
int ll_add(ll_driver *d, int fd, const char *const *requests, const int64_t *lengths, int64_t count, int64_t first) {
    pthread_mutex_lock(&d->lock);
    int slot = 0;
    while (slot < d->slots && d->connections[slot].in_use) slot++;
    if (slot == d->slots) {
        int slots = d->slots ? 2 * d->slots : 16;
        connection *grown = realloc(d->connections, (size_t)slots * sizeof(connection));
        if (!grown) {
            pthread_mutex_unlock(&d->lock);
            return -1;
        }
        memset(grown + d->slots, 0, (size_t)(slots - d->slots) * sizeof(connection));
        d->connections = grown;
        d->slots = slots;
    }
    connection *c = &d->connections[slot];
    uint32_t generation = c->generation + 1;
    char *buffer = c->buffer;
    ll_record *records = c->records;
    int64_t capacity = c->capacity, room = c->room;
    *c = (connection){.in_use = 1, .generation = generation, .fd = fd, .requests = requests, .lengths = lengths,
                      .count = count, .next = first % count, .buffer = buffer, .capacity = capacity, .records = records, .room = room};
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = key_of(slot, generation)};
    if (epoll_ctl(d->epoll, EPOLL_CTL_ADD, fd, &e) < 0) {
        c->state = STATE_FAILED;
        c->sent = now();
        c->flying = 1;
        keep_record(c, c->sent, 0, 0, 0, errno);
        c->flying = 0;
    } else {
        send_next(d, c, slot);
    }
    pthread_mutex_unlock(&d->lock);
    return slot;
}

/* Copy up to `room` of the slot's finished requests, oldest first, into `out` and forget them; their number.
   `*sent` is the send time of the request in flight (0 where none is) and `*state` the connection's. */
int64_t ll_take(ll_driver *d, int slot, ll_record *out, int64_t room, double *sent, int *state) {
    pthread_mutex_lock(&d->lock);
    connection *c = &d->connections[slot];
    int64_t n = c->finished < room ? c->finished : room;
    memcpy(out, c->records, (size_t)n * sizeof(ll_record));
    memmove(c->records, c->records + n, (size_t)(c->finished - n) * sizeof(ll_record));
    c->finished -= n;
    *sent = c->flying && c->state == STATE_RUNNING ? c->sent : 0.0;
    *state = c->state;
    pthread_mutex_unlock(&d->lock);
    return n;
}

/* Stop watching the slot's connection and close it; what it had not handed on is dropped (take it first), and a
   request in flight is the caller's to record. The index of the request it would have sent next. */
int64_t ll_drop(ll_driver *d, int slot) {
    pthread_mutex_lock(&d->lock);
    connection *c = &d->connections[slot];
    int64_t next = c->next;
    if (c->in_use) {
        if (c->state == STATE_RUNNING) epoll_ctl(d->epoll, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->in_use = 0;
        c->flying = 0;
        c->finished = 0;
        c->state = STATE_CLOSED;
    }
    pthread_mutex_unlock(&d->lock);
    return next;
}

/* Stop the thread, close every connection still watched and free the driver. */
void ll_free(ll_driver *d) {
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    pthread_mutex_unlock(&d->lock);
    uint64_t one = 1;
    if (write(d->wake, &one, sizeof one) < 0) { /* the thread then wakes on its next event */
    }
    pthread_join(d->thread, NULL);
    for (int slot = 0; slot < d->slots; slot++) {
        connection *c = &d->connections[slot];
        if (c->in_use) close(c->fd);
        free(c->buffer);
        free(c->records);
    }
    free(d->connections);
    close(d->epoll);
    close(d->wake);
    close(d->notify);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
