/* kvtier._native's batched memcpy over address tables: copy(dst, src, lengths[, cursor,
 * grain]) (what each argument means: _native.c). */
#include "_native.h"

/* Where the prefetches are: PREFETCH_BYTES ahead of the copy in the concatenation of all
 * the source ranges, into L2, so that the next blocks' lines are on their way before the
 * copy reaches them (the hardware prefetchers stop at every 4 KiB page and restart slowly on
 * a block somewhere else). Measured with 16 KiB blocks from random places, against a
 * contiguous streaming copy: 0.70 without, 0.74 prefetching into L1, 0.91 into L2; 1 KiB
 * blocks 0.53 and 0.68; 128 KiB blocks 1.0 either way. */
typedef struct {
    const int64_t *src, *len;
    Py_ssize_t n, at;
    int64_t offset;
} Ahead;

static inline void
ahead_step(Ahead *a, int64_t by)
{
    a->offset += by;
    while (a->at < a->n && a->offset >= a->len[a->at])
        a->offset -= a->len[a->at++];
#if defined(__SSE2__)
    if (a->at < a->n)
        _mm_prefetch((const char *)(uintptr_t)a->src[a->at] + a->offset, _MM_HINT_T1);
#endif
}

/* Copies of KV are written once and not read back soon, and each range is too short for
 * memcpy to choose non-temporal stores itself (it does above megabytes), so its ordinary
 * stores would first read every destination line into the cache: a third of the memory
 * traffic wasted. Streaming stores write the lines without reading them. */
void
copy_ranges(const int64_t *dst_at, const int64_t *src_at, const int64_t *len, Py_ssize_t n)
{ /* the caller fences (_mm_sfence) once its last range is copied */
    Ahead ahead = {src_at, len, n, 0, 0};
    for (int64_t k = 0; k < PREFETCH_BYTES; k += 64)
        ahead_step(&ahead, 64);
    for (Py_ssize_t e = 0; e < n; e++) {
        unsigned char *dst = (unsigned char *)(uintptr_t)dst_at[e];
        const unsigned char *src = (const unsigned char *)(uintptr_t)src_at[e];
        size_t left = (size_t)len[e];
#if defined(__SSE2__)
        if (left >= STREAM_BYTES) {
            size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
            memcpy(dst, src, head);
            ahead_step(&ahead, (int64_t)head);
            dst += head, src += head, left -= head;
            size_t body = left & ~(size_t)63;
            for (size_t i = 0; i < body; i += 64) {
                ahead_step(&ahead, 64);
                __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
                __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
                __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
                __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
                _mm_stream_si128((__m128i *)(dst + i), a);
                _mm_stream_si128((__m128i *)(dst + i + 16), b);
                _mm_stream_si128((__m128i *)(dst + i + 32), c);
                _mm_stream_si128((__m128i *)(dst + i + 48), d);
            }
            dst += body, src += body, left -= body;
        }
#endif
        memcpy(dst, src, left);
        ahead_step(&ahead, (int64_t)left);
    }
}

/* Entries [0, n), `grain` at a time from the shared `cursor` when there is one. */
static void
copy_claimed(const int64_t *dst, const int64_t *src, const int64_t *len, Py_ssize_t n,
             int64_t *cursor, Py_ssize_t grain)
{
    if (cursor == NULL) {
        copy_ranges(dst, src, len, n);
    }
    else {
        /* The cursor only grows from where the caller checked it (>= 0); grain <= n + 1 keeps
         * every thread's last, failed claim from wrapping it past INT64_MAX. */
        int64_t at;
        while ((at = __atomic_fetch_add(cursor, (int64_t)grain, __ATOMIC_RELAXED)) >= 0
               && at < n) {
            Py_ssize_t count = n - at < grain ? (Py_ssize_t)(n - at) : grain;
            copy_ranges(dst + at, src + at, len + at, count);
        }
    }
#if defined(__SSE2__)
    _mm_sfence(); /* the streamed lines are visible before the job is reported done */
#endif
}

int
int64_buffer(PyObject *obj, Py_buffer *view, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++; /* native order (these copies only run on little-endian x86 and ARM) */
    int integer = f[1] == '\0' && strchr("qQlL", f[0]) != NULL;
    if (view->itemsize != 8 || view->ndim != 1 || !integer) {
        PyErr_Format(PyExc_ValueError, "copy: %s must be a 1-D buffer of 8-byte integers "
                     "(numpy int64), got format '%s' with %zd-byte items", name,
                     view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int
negative(const int64_t *len, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (len[i] < 0)
            return 1;
    return 0;
}

PyObject *
native_copy(PyObject *self, PyObject *args)
{
    PyObject *dst_obj, *src_obj, *len_obj, *cursor_obj = Py_None;
    Py_ssize_t grain = 1;
    Py_buffer dst, src, len, cursor = {0};
    if (!PyArg_ParseTuple(args, "OOO|On:copy", &dst_obj, &src_obj, &len_obj, &cursor_obj,
                          &grain))
        return NULL;
    if (grain < 1) {
        PyErr_Format(PyExc_ValueError, "copy: grain must be at least 1, got %zd", grain);
        return NULL;
    }
    if (cursor_buffer(cursor_obj, &cursor, "copy") < 0)
        return NULL;
    if (int64_buffer(dst_obj, &dst, "dst") < 0)
        goto cursor_out;
    if (int64_buffer(src_obj, &src, "src") < 0) {
        PyBuffer_Release(&dst);
        goto cursor_out;
    }
    if (int64_buffer(len_obj, &len, "lengths") < 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        goto cursor_out;
    }
    Py_ssize_t n = dst.len / 8;
    if (grain > n)
        grain = n > 0 ? n : 1; /* one claim takes every range: see copy_claimed */
    if (src.len / 8 != n || len.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "copy: dst, src and lengths differ in length");
    }
    else if (negative((const int64_t *)len.buf, n)) {
        PyErr_SetString(PyExc_ValueError, "copy: a length is negative");
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        copy_claimed((const int64_t *)dst.buf, (const int64_t *)src.buf,
                     (const int64_t *)len.buf, n, (int64_t *)cursor.buf, grain);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&len);
cursor_out:
    if (cursor.obj != NULL)
        PyBuffer_Release(&cursor);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

int
cursor_buffer(PyObject *obj, Py_buffer *view, const char *fn)
{
    if (obj == Py_None)
        return 0;
    if (int64_buffer(obj, view, "cursor") < 0)
        return -1;
    if (view->readonly || view->len != 8 || (uintptr_t)view->buf % 8
        || *(const int64_t *)view->buf < 0) {
        PyErr_Format(PyExc_ValueError, "%s: cursor must be one aligned, writable, "
                     "non-negative int64 (np.zeros(1, np.int64))", fn);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}
