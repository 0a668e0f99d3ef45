/* kvtier._native's Redis value reader: recv_values(fd, timeout_s, pending, views, head, sends)
 * (kvtier.tiers.redis.into says why and how the tier uses it).
 *
 * Reads the replies of pipelined GETs off a connected socket, reply i into views[i], with
 * the GIL released for the whole of it: a promotion's megabytes arrive in many pieces, and
 * a Python loop gives the GIL back and must win it again for every piece, which beside an
 * engine's stepping loop costs up to the switch interval each time.
 *
 * `pending` holds bytes already read off the socket (the start of the first reply). A reply
 * `$n\r\n` with 0 <= n <= head + len(views[i]) is taken: its first min(n, head) bytes are
 * returned as bytes, the rest is received straight into views[i], then `\r\n` must follow.
 * `$-1\r\n` (no such key) is taken as None. At the first reply of any other kind (an error,
 * an integer, a value too long for its view, a length that does not parse) reading stops
 * before it, and its bytes are handed back unread, for the Python reader.
 *
 * `sends[i]` (bytes, often empty) is written to the socket once reply i is taken, before its
 * value is read: the GETs the caller paces out as their replies arrive.
 *
 * Returns (heads, bodies, leftover): for each reply taken, its head (None for a missing
 * key) and how many bytes went into its view (-1 for a missing key), and the bytes read
 * past the last reply taken. Every wait is bounded by `timeout_s` for the whole call:
 * TimeoutError past it, ConnectionError if the peer closes the connection, OSError for a
 * socket error, ValueError (the caller fails the node) for a value whose `\r\n` is not
 * where its length says.
 */
#include "_native.h"
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#define LINE_CAP 65536 /* bytes read at a time for a reply's line and head */
#define MAX_DIGITS 18  /* a longer length is no value of a Redis server's */

enum { OK = 0, CLOSED = -1, FAILED = -2, LATE = -3, STOP = -4, TORN = -5 };

typedef struct {
    int fd;
    double deadline;
    int err;
    char *buf;
    size_t pos, len;
    size_t line; /* where the last length line read starts in buf (have() moves bytes) */
} Wire;

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* After a socket call that failed with errno: wait (poll for `events`) until the deadline,
 * OK to try again, or why not. */
static int
wait_for(Wire *w, short events)
{
    if (errno == EINTR)
        return OK;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        w->err = errno;
        return FAILED;
    }
    double left = w->deadline - now_s();
    if (left <= 0)
        return LATE;
    struct pollfd p = {w->fd, events, 0};
    int ms = left > 3600.0 ? 3600000 : (int)(left * 1000.0) + 1;
    if (poll(&p, 1, ms) < 0 && errno != EINTR) {
        w->err = errno;
        return FAILED;
    }
    return OK;
}

/* One recv of at most `n` bytes into `dst`, waiting until the deadline for some. */
static Py_ssize_t
recv_some(Wire *w, char *dst, size_t n)
{
    for (;;) {
        ssize_t got = recv(w->fd, dst, n, MSG_DONTWAIT);
        if (got > 0)
            return got;
        if (got == 0)
            return CLOSED;
        int rc = wait_for(w, POLLIN);
        if (rc != OK)
            return rc;
    }
}

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* Python ignores SIGPIPE: a closed peer is EPIPE either way */
#endif

/* All `n` bytes of `src` written, waiting until the deadline for room. */
static int
send_all(Wire *w, const char *src, size_t n)
{
    while (n > 0) {
        ssize_t put = send(w->fd, src, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (put > 0) {
            src += put;
            n -= (size_t)put;
            continue;
        }
        int rc = wait_for(w, POLLOUT);
        if (rc != OK)
            return rc;
    }
    return OK;
}

/* At least `n` unread bytes in the buffer (n <= LINE_CAP). */
static int
have(Wire *w, size_t n)
{
    while (w->len - w->pos < n) {
        if (w->pos) {
            memmove(w->buf, w->buf + w->pos, w->len - w->pos);
            w->len -= w->pos;
            w->pos = 0;
        }
        Py_ssize_t got = recv_some(w, w->buf + w->len, LINE_CAP - w->len);
        if (got < 0)
            return (int)got;
        w->len += (size_t)got;
    }
    return OK;
}

/* Reply i's length line: n >= 0, -1 for a missing key; STOP where it is something else. */
static int
length_line(Wire *w, long long *n)
{
    int rc = have(w, 1);
    if (rc != OK)
        return rc;
    if (w->buf[w->pos] != '$')
        return STOP;
    size_t at = w->pos + 1, end;
    for (;;) { /* the line's end, within a length's digits */
        for (end = at; end + 1 < w->len && end - at <= MAX_DIGITS + 1; end++)
            if (w->buf[end] == '\r' && w->buf[end + 1] == '\n')
                goto found;
        if (w->len - at > MAX_DIGITS + 2)
            return STOP;
        rc = have(w, w->len - w->pos + 1);
        if (rc != OK)
            return rc;
        at = w->pos + 1;
    }
found:
    if (end - at == 2 && w->buf[at] == '-' && w->buf[at + 1] == '1') {
        *n = -1;
    } else {
        if (end == at || end - at > MAX_DIGITS)
            return STOP;
        long long v = 0;
        for (size_t k = at; k < end; k++) {
            if (w->buf[k] < '0' || w->buf[k] > '9')
                return STOP;
            v = v * 10 + (w->buf[k] - '0');
        }
        *n = v;
    }
    w->line = w->pos;
    w->pos = end + 2;
    return OK;
}

/* `n` bytes into `dst`: first what the buffer holds, then straight from the socket. */
static int
take(Wire *w, char *dst, size_t n)
{
    size_t from_buf = w->len - w->pos < n ? w->len - w->pos : n;
    memcpy(dst, w->buf + w->pos, from_buf);
    w->pos += from_buf;
    for (size_t done = from_buf; done < n;) {
        Py_ssize_t got = recv_some(w, dst + done, n - done);
        if (got < 0)
            return (int)got;
        done += (size_t)got;
    }
    return OK;
}

static void
raise_for(int rc, int err)
{
    if (rc == LATE)
        PyErr_SetString(PyExc_TimeoutError, "no reply within the call's deadline (timeout_s)");
    else if (rc == CLOSED)
        PyErr_SetString(PyExc_ConnectionError, "the server closed the connection mid-reply");
    else if (rc == TORN)
        PyErr_SetString(PyExc_ValueError, "the server's value does not end where its length says");
    else {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    }
}

PyObject *
native_recv_values(PyObject *self, PyObject *args)
{
    int fd, head;
    double timeout_s;
    Py_buffer pending;
    PyObject *views, *sends;
    if (!PyArg_ParseTuple(args, "idy*O!iO!:recv_values", &fd, &timeout_s, &pending,
                          &PyList_Type, &views, &head, &PyList_Type, &sends))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(views);
    PyObject *result = NULL;
    Py_buffer *bufs = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    Py_buffer *outs = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    long long *bodies = PyMem_Calloc((size_t)count + 1, sizeof(long long));
    long long *hlens = PyMem_Calloc((size_t)count + 1, sizeof(long long));
    char *heads = PyMem_Malloc((size_t)(count + 1) * (size_t)(head > 0 ? head : 1));
    Wire w = {fd, now_s() + timeout_s, 0, PyMem_Malloc(LINE_CAP), 0, 0, 0};
    Py_ssize_t got = 0, outs_got = 0;
    if (bufs == NULL || outs == NULL || bodies == NULL || hlens == NULL || heads == NULL
        || w.buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (head < 0 || pending.len > LINE_CAP || PyList_GET_SIZE(sends) != count) {
        PyErr_SetString(PyExc_ValueError,
                        "recv_values: head < 0, pending too long, or not one send per view");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(views, i), &bufs[got], PyBUF_WRITABLE) < 0)
            goto done;
        got++;
        if (PyObject_GetBuffer(PyList_GET_ITEM(sends, i), &outs[outs_got], PyBUF_SIMPLE) < 0)
            goto done;
        outs_got++;
    }
    memcpy(w.buf, pending.buf, (size_t)pending.len);
    w.len = (size_t)pending.len;
    int rc = OK;
    Py_ssize_t taken = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; taken < count; taken++) {
        long long n;
        rc = length_line(&w, &n);
        if (rc != OK)
            break;
        size_t h = n < 0 ? 0 : n < head ? (size_t)n : (size_t)head;
        if (n >= 0 && (unsigned long long)n - h > (unsigned long long)bufs[taken].len) {
            w.pos = w.line; /* too long for its view: the Python reader reads past it */
            rc = STOP;
            break;
        }
        rc = send_all(&w, outs[taken].buf, (size_t)outs[taken].len);
        if (rc != OK)
            break;
        if (n == -1) {
            hlens[taken] = bodies[taken] = -1;
            continue;
        }
        rc = take(&w, heads + (size_t)taken * (size_t)head, h);
        if (rc == OK)
            rc = take(&w, bufs[taken].buf, (size_t)n - h);
        if (rc == OK)
            rc = have(&w, 2);
        if (rc != OK)
            break;
        if (w.buf[w.pos] != '\r' || w.buf[w.pos + 1] != '\n') {
            rc = TORN;
            break;
        }
        w.pos += 2;
        hlens[taken] = (long long)h;
        bodies[taken] = n - (long long)h;
    }
    Py_END_ALLOW_THREADS
    if (rc != OK && rc != STOP) {
        raise_for(rc, w.err);
        goto done;
    }
    PyObject *hs = PyList_New(taken), *bs = PyList_New(taken);
    PyObject *left = PyBytes_FromStringAndSize(w.buf + w.pos, (Py_ssize_t)(w.len - w.pos));
    for (Py_ssize_t i = 0; hs && bs && left && i < taken; i++) {
        PyObject *hd = hlens[i] < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(
            heads + (size_t)i * (size_t)head, (Py_ssize_t)hlens[i]);
        PyObject *bd = PyLong_FromLongLong(bodies[i]);
        if (hd == NULL || bd == NULL) {
            Py_XDECREF(hd);
            Py_XDECREF(bd);
            Py_CLEAR(hs);
            break;
        }
        PyList_SET_ITEM(hs, i, hd);
        PyList_SET_ITEM(bs, i, bd);
    }
    if (hs && bs && left)
        result = PyTuple_Pack(3, hs, bs, left);
    Py_XDECREF(hs);
    Py_XDECREF(bs);
    Py_XDECREF(left);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    for (Py_ssize_t i = 0; i < outs_got; i++)
        PyBuffer_Release(&outs[i]);
    PyBuffer_Release(&pending);
    PyMem_Free(bufs);
    PyMem_Free(outs);
    PyMem_Free(bodies);
    PyMem_Free(hlens);
    PyMem_Free(heads);
    PyMem_Free(w.buf);
    return result;
}
