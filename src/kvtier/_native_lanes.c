/* kvtier._native's copy of one transfer batch, its ranges computed from engine block ids
 * (copy_lanes), and the order it moves them in (block_order); see _native.c and
 * kvtier.transfer.native. */
#include "_native.h"

/* ---- copy_lanes: one batch, its ranges computed from block ids ---------------------- */

enum { KV_BASE, KV_STEP, SLOT_BASE, SLOT_STEP, LENGTH, POSITIONS, LANE_FIELDS };

/* A batch: lane l's item i moves LENGTH bytes between the engine block ids[f] of lane l's
 * tensor (KV_BASE + ids[f] * KV_STEP) and block position j of copy c's slot
 * (ptrs[c] + SLOT_BASE + j * SLOT_STEP), where f = order[i] = j * copies + c; items whose
 * position j is not below the lane's POSITIONS move nothing (a run lane moves a copy's
 * consecutive blocks as one range, at position 0). */
typedef struct {
    const int64_t *ids, *ptrs, *order, *lanes;
    Py_ssize_t copies, n, nlanes;
    int to_kv;
} Lanes;

static inline int64_t
lane_item(const Lanes *b, Py_ssize_t w, unsigned char **dst, const unsigned char **src)
{
    const int64_t *lane = b->lanes + (w / b->n) * LANE_FIELDS;
    int64_t f = b->order[w % b->n];
    int64_t j = f / b->copies, c = f - j * b->copies;
    if (j >= lane[POSITIONS])
        return 0;
    uintptr_t kv = (uintptr_t)(lane[KV_BASE] + b->ids[f] * lane[KV_STEP]);
    uintptr_t slot = (uintptr_t)(b->ptrs[c] + lane[SLOT_BASE] + j * lane[SLOT_STEP]);
    *dst = (unsigned char *)(b->to_kv ? kv : slot);
    *src = (const unsigned char *)(b->to_kv ? slot : kv);
    return lane[LENGTH];
}

/* The prefetch of copy_ranges (Ahead), over a batch's items [at, end). */
typedef struct {
    const Lanes *b;
    Py_ssize_t at, end;
    int64_t offset, len;
    const unsigned char *src;
} LaneAhead;

static inline void
lane_ahead_load(LaneAhead *a)
{
    unsigned char *unused;
    for (; a->at < a->end; a->at++)
        if ((a->len = lane_item(a->b, a->at, &unused, &a->src)) > 0)
            return;
}

static inline void
lane_ahead_step(LaneAhead *a, int64_t by)
{
    a->offset += by;
    while (a->at < a->end && a->offset >= a->len) {
        a->offset -= a->len;
        a->at++;
        lane_ahead_load(a);
    }
#if defined(__SSE2__)
    if (a->at < a->end)
        _mm_prefetch((const char *)a->src + a->offset, _MM_HINT_T1);
#endif
}

static void
copy_lane_items(const Lanes *b, Py_ssize_t from, Py_ssize_t to)
{ /* the caller fences (_mm_sfence) once its last item is copied */
    LaneAhead ahead = {b, from, to, 0, 0, NULL};
    lane_ahead_load(&ahead);
    for (int64_t k = 0; k < PREFETCH_BYTES; k += 64)
        lane_ahead_step(&ahead, 64);
    for (Py_ssize_t w = from; w < to; w++) {
        unsigned char *dst;
        const unsigned char *src;
        size_t left = (size_t)lane_item(b, w, &dst, &src);
        if (left == 0)
            continue;
#if defined(__SSE2__)
        if (left >= STREAM_BYTES) {
            size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
            memcpy(dst, src, head);
            lane_ahead_step(&ahead, (int64_t)head);
            dst += head, src += head, left -= head;
            size_t body = left & ~(size_t)63;
            for (size_t i = 0; i < body; i += 64) {
                lane_ahead_step(&ahead, 64);
                __m128i x0 = _mm_loadu_si128((const __m128i *)(src + i));
                __m128i x1 = _mm_loadu_si128((const __m128i *)(src + i + 16));
                __m128i x2 = _mm_loadu_si128((const __m128i *)(src + i + 32));
                __m128i x3 = _mm_loadu_si128((const __m128i *)(src + i + 48));
                _mm_stream_si128((__m128i *)(dst + i), x0);
                _mm_stream_si128((__m128i *)(dst + i + 16), x1);
                _mm_stream_si128((__m128i *)(dst + i + 32), x2);
                _mm_stream_si128((__m128i *)(dst + i + 48), x3);
            }
            dst += body, src += body, left -= body;
        }
#endif
        memcpy(dst, src, left);
        lane_ahead_step(&ahead, (int64_t)left);
    }
}

static void
copy_lanes_claimed(const Lanes *b, int64_t *cursor, Py_ssize_t grain)
{
    Py_ssize_t items = b->nlanes * b->n;
    if (cursor == NULL) {
        copy_lane_items(b, 0, items);
    }
    else {
        int64_t at; /* as in copy_claimed: grain <= items + 1 keeps the cursor from wrapping */
        while ((at = __atomic_fetch_add(cursor, (int64_t)grain, __ATOMIC_RELAXED)) >= 0
               && at < items)
            copy_lane_items(b, (Py_ssize_t)at, items - at < grain ? items : at + grain);
    }
#if defined(__SSE2__)
    _mm_sfence(); /* the streamed lines are visible before the job is reported done */
#endif
}

/* The checks that keep copy_lanes inside the batch's arrays: `order` a permutation's worth
 * of indices into `ids`, every lane's positions within the batch's blocks, no negative
 * length. (The addresses themselves are the caller's: kvtier.transfer.plan checks them.) */
static const char *
lanes_invalid(const Lanes *b)
{
    if (b->copies < 1 || b->n % b->copies)
        return "copy_lanes: ids must hold blocks x copies entries (copies = len(ptrs) >= 1)";
    for (Py_ssize_t i = 0; i < b->n; i++)
        if (b->order[i] < 0 || b->order[i] >= b->n)
            return "copy_lanes: order must index ids";
    for (Py_ssize_t l = 0; l < b->nlanes; l++) {
        const int64_t *lane = b->lanes + l * LANE_FIELDS;
        if (lane[LENGTH] < 0 || lane[POSITIONS] < 0 || lane[POSITIONS] > b->n / b->copies)
            return "copy_lanes: a lane has a negative length or more positions than blocks";
    }
    return NULL;
}

PyObject *
native_copy_lanes(PyObject *self, PyObject *args)
{
    int to_kv;
    PyObject *objs[4], *cursor_obj = Py_None;
    Py_ssize_t grain = 1;
    static const char *names[4] = {"ids", "ptrs", "order", "lanes"};
    Py_buffer views[4], cursor = {0};
    if (!PyArg_ParseTuple(args, "pOOOO|On:copy_lanes", &to_kv, &objs[0], &objs[1], &objs[2],
                          &objs[3], &cursor_obj, &grain))
        return NULL;
    if (grain < 1) {
        PyErr_Format(PyExc_ValueError, "copy_lanes: grain must be at least 1, got %zd", grain);
        return NULL;
    }
    if (cursor_buffer(cursor_obj, &cursor, "copy_lanes") < 0)
        return NULL;
    int got = 0;
    for (; got < 4; got++)
        if (int64_buffer(objs[got], &views[got], names[got]) < 0)
            break;
    if (got == 4) {
        Lanes b = {views[0].buf, views[1].buf, views[2].buf, views[3].buf,
                   views[1].len / 8, views[2].len / 8, views[3].len / 8 / LANE_FIELDS, to_kv};
        const char *bad = views[0].len != views[2].len ? "copy_lanes: order and ids differ in "
                          "length" : views[3].len % (8 * LANE_FIELDS) ? "copy_lanes: lanes "
                          "must hold 6 int64 fields per lane" : lanes_invalid(&b);
        if (bad != NULL) {
            PyErr_SetString(PyExc_ValueError, bad);
        }
        else if (b.n > 0 && b.nlanes > 0) {
            Py_ssize_t items = b.nlanes * b.n;
            if (grain > items)
                grain = items; /* one claim takes every item: see copy_lanes_claimed */
            Py_BEGIN_ALLOW_THREADS
            copy_lanes_claimed(&b, (int64_t *)cursor.buf, grain);
            Py_END_ALLOW_THREADS
        }
    }
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    if (cursor.obj != NULL)
        PyBuffer_Release(&cursor);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyObject *
native_block_order(PyObject *self, PyObject *args)
{
    PyObject *ids_obj;
    Py_ssize_t bound;
    Py_buffer ids;
    if (!PyArg_ParseTuple(args, "On:block_order", &ids_obj, &bound))
        return NULL;
    if (int64_buffer(ids_obj, &ids, "ids") < 0)
        return NULL;
    const int64_t *key = ids.buf;
    Py_ssize_t n = ids.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (key[i] < 0 || key[i] >= bound) {
            PyBuffer_Release(&ids);
            PyErr_Format(PyExc_ValueError, "block_order: id %lld at %zd is outside [0, %zd)",
                         (long long)key[i], i, bound);
            return NULL;
        }
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 8);
    int64_t *scratch = out != NULL && n > 0 ? PyMem_Malloc(
        (size_t)(n <= bound / 4 ? n : bound + 1) * 8) : NULL;
    if (out == NULL || (n > 0 && scratch == NULL)) {
        PyBuffer_Release(&ids);
        Py_XDECREF(out);
        return out == NULL ? NULL : PyErr_NoMemory();
    }
    int64_t *idx = (int64_t *)PyByteArray_AS_STRING(out);
    if (n > 0 && n <= bound / 4) { /* sparse: a merge sort, ping-ponging into idx at the end */
        for (Py_ssize_t i = 0; i < n; i++)
            idx[i] = i;
        int64_t *a = idx, *t = scratch;
        for (Py_ssize_t width = 1; width < n; width *= 2) {
            for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
                Py_ssize_t mid = lo + width < n ? lo + width : n;
                Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
                Py_ssize_t i = lo, j = mid, k = lo;
                while (i < mid && j < hi)
                    t[k++] = key[a[j]] < key[a[i]] ? a[j++] : a[i++];
                while (i < mid)
                    t[k++] = a[i++];
                while (j < hi)
                    t[k++] = a[j++];
            }
            int64_t *swap = a;
            a = t, t = swap;
        }
        if (a != idx)
            memcpy(idx, a, (size_t)n * 8);
    }
    else if (n > 0) { /* dense: counting sort over [0, bound) */
        memset(scratch, 0, (size_t)(bound + 1) * 8);
        for (Py_ssize_t i = 0; i < n; i++)
            scratch[key[i] + 1]++;
        for (Py_ssize_t v = 0; v < bound; v++)
            scratch[v + 1] += scratch[v];
        for (Py_ssize_t i = 0; i < n; i++)
            idx[scratch[key[i]]++] = i;
    }
    PyMem_Free(scratch);
    PyBuffer_Release(&ids);
    return out;
}
