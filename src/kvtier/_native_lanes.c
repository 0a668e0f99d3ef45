/* kvtier._native's copy of one transfer batch, its ranges computed from its blocks
 * (copy_lanes), and those blocks in the order it moves them (sorted_blocks); see _native.c
 * and kvtier.transfer.native. */
#include "_native.h"

/* ---- copy_lanes: one batch, its ranges computed from sorted blocks ------------------ */

enum { KV_BASE, KV_STEP, SLOT_BASE, SLOT_STEP, LENGTH, POSITIONS, LANE_FIELDS };
enum { B_ID, B_SLOT, B_POS, BLOCK_FIELDS };

/* A batch: lane l's item i moves LENGTH bytes between engine block blocks[i].id of lane l's
 * tensor (KV_BASE + id * KV_STEP) and block position j = blocks[i].pos of the slot at
 * blocks[i].slot (slot + SLOT_BASE + j * SLOT_STEP); items whose position is not below the
 * lane's POSITIONS move nothing (a run lane moves a copy's consecutive blocks as one range,
 * at position 0). Items go lane after lane, each lane's in the order of `blocks`
 * (sorted_blocks: ascending engine block). Every address is a multiply and an add from the
 * blocks table, which sorted_blocks built once for the batch: no division per item. */
typedef struct {
    const int64_t *blocks, *lanes;
    Py_ssize_t n, nlanes;
    int to_kv, tables; /* tables: every lane's ranges are short (TABLE_BELOW) */
} Lanes;

/* Where a walk over a batch's items is: lane `l`, block `i`. */
typedef struct {
    Py_ssize_t l, i;
} Item;

static inline Item
item_at(const Lanes *b, Py_ssize_t w)
{
    Item it = {w / b->n, w % b->n};
    return it;
}

static inline void
item_next(const Lanes *b, Item *it)
{
    if (++it->i == b->n)
        it->i = 0, it->l++;
}

static inline int64_t
lane_item(const Lanes *b, Item it, unsigned char **dst, const unsigned char **src)
{
    const int64_t *lane = b->lanes + it.l * LANE_FIELDS;
    const int64_t *block = b->blocks + it.i * BLOCK_FIELDS;
    int64_t j = block[B_POS];
    if (j >= lane[POSITIONS])
        return 0;
    uintptr_t kv = (uintptr_t)(lane[KV_BASE] + block[B_ID] * lane[KV_STEP]);
    uintptr_t slot = (uintptr_t)(block[B_SLOT] + lane[SLOT_BASE] + j * lane[SLOT_STEP]);
    *dst = (unsigned char *)(b->to_kv ? kv : slot);
    *src = (const unsigned char *)(b->to_kv ? slot : kv);
    return lane[LENGTH];
}

/* The prefetch of copy_ranges (Ahead), over a batch's items [at, end), for copy_lane_walk. */
typedef struct {
    const Lanes *b;
    Item it;
    Py_ssize_t at, end;
    int64_t offset, len;
    const unsigned char *src;
} LaneAhead;

static inline void
lane_ahead_load(LaneAhead *a)
{
    unsigned char *unused;
    for (; a->at < a->end; a->at++, item_next(a->b, &a->it))
        if ((a->len = lane_item(a->b, a->it, &unused, &a->src)) > 0)
            return;
}

static inline void
lane_ahead_step(LaneAhead *a, int64_t by)
{
    a->offset += by;
    while (a->at < a->end && a->offset >= a->len) {
        a->offset -= a->len;
        a->at++;
        item_next(a->b, &a->it);
        lane_ahead_load(a);
    }
#if defined(__SSE2__)
    if (a->at < a->end)
        _mm_prefetch((const char *)a->src + a->offset, _MM_HINT_T1);
#endif
}

/* Items [from, to) of a batch, each range computed as the walk reaches it: how ranges of
 * TABLE_BELOW bytes and longer move (see copy_lane_items). */
static void
copy_lane_walk(const Lanes *b, Py_ssize_t from, Py_ssize_t to)
{ /* the caller fences (_mm_sfence) once its last item is copied */
    LaneAhead ahead = {b, item_at(b, from), from, to, 0, 0, NULL};
    lane_ahead_load(&ahead);
    for (int64_t k = 0; k < PREFETCH_BYTES; k += 64)
        lane_ahead_step(&ahead, 64);
    Item it = item_at(b, from);
    for (Py_ssize_t w = from; w < to; w++, item_next(b, &it)) {
        unsigned char *dst;
        const unsigned char *src;
        size_t left = (size_t)lane_item(b, it, &dst, &src);
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

#define TABLE_ITEMS 2048 /* items whose ranges are written out at a time (48 KiB) */
#define TABLE_BELOW 4096 /* batches whose ranges are all shorter move by tables */

/* Items [from, to) of a batch: their ranges written out TABLE_ITEMS at a time, then moved
 * by copy_ranges. Measured one thread at a time with shuffled 1 KiB blocks, that took
 * 0.8-0.9 of the time of copy_lane_walk, which computes each range as it reaches it (the
 * prefetch walks plain arrays); with 16 KiB and 128 KiB blocks, 1.05-1.2 of it (not
 * understood), hence TABLE_BELOW. */
static void
copy_lane_items(const Lanes *b, Py_ssize_t from, Py_ssize_t to)
{ /* the caller fences (_mm_sfence) once its last item is copied */
    int64_t dst[TABLE_ITEMS], src[TABLE_ITEMS], len[TABLE_ITEMS];
    Item it = item_at(b, from);
    for (Py_ssize_t w = from; w < to;) {
        Py_ssize_t k = 0;
        for (; k < TABLE_ITEMS && w < to; w++, item_next(b, &it)) {
            unsigned char *d;
            const unsigned char *s;
            int64_t n = lane_item(b, it, &d, &s);
            if (n > 0) {
                dst[k] = (int64_t)(uintptr_t)d, src[k] = (int64_t)(uintptr_t)s, len[k] = n;
                k++;
            }
        }
        copy_ranges(dst, src, len, k);
    }
}

/* Items [from, to): short ranges by tables, long ones by the walk (b->tables). */
static void
copy_items(const Lanes *b, Py_ssize_t from, Py_ssize_t to)
{
    if (b->tables)
        copy_lane_items(b, from, to);
    else
        copy_lane_walk(b, from, to);
}

static void
copy_lanes_claimed(const Lanes *b, int64_t *cursor, Py_ssize_t grain)
{
    Py_ssize_t items = b->nlanes * b->n;
    if (cursor == NULL) {
        copy_items(b, 0, items);
    }
    else {
        int64_t at; /* as in copy_claimed: grain <= items + 1 keeps the cursor from wrapping */
        while ((at = __atomic_fetch_add(cursor, (int64_t)grain, __ATOMIC_RELAXED)) >= 0
               && at < items)
            copy_items(b, (Py_ssize_t)at, items - at < grain ? items : at + grain);
    }
#if defined(__SSE2__)
    _mm_sfence(); /* the streamed lines are visible before the job is reported done */
#endif
}

/* The checks that keep copy_lanes to the batch's arrays: whole blocks and lanes, no
 * negative position, positions count or length. (The addresses themselves are the
 * caller's: kvtier.transfer.plan checks them, and sorted_blocks builds the table.) */
static const char *
lanes_invalid(const Lanes *b)
{
    for (Py_ssize_t i = 0; i < b->n; i++)
        if (b->blocks[i * BLOCK_FIELDS + B_POS] < 0 || b->blocks[i * BLOCK_FIELDS + B_ID] < 0)
            return "copy_lanes: a block has a negative id or position";
    for (Py_ssize_t l = 0; l < b->nlanes; l++) {
        const int64_t *lane = b->lanes + l * LANE_FIELDS;
        if (lane[LENGTH] < 0 || lane[POSITIONS] < 0)
            return "copy_lanes: a lane has a negative length or positions count";
    }
    return NULL;
}

PyObject *
native_copy_lanes(PyObject *self, PyObject *args)
{
    int to_kv;
    PyObject *objs[2], *cursor_obj = Py_None;
    Py_ssize_t grain = 1;
    static const char *names[2] = {"blocks", "lanes"};
    Py_buffer views[2], cursor = {0};
    if (!PyArg_ParseTuple(args, "pOO|On:copy_lanes", &to_kv, &objs[0], &objs[1], &cursor_obj,
                          &grain))
        return NULL;
    if (grain < 1) {
        PyErr_Format(PyExc_ValueError, "copy_lanes: grain must be at least 1, got %zd", grain);
        return NULL;
    }
    if (cursor_buffer(cursor_obj, &cursor, "copy_lanes") < 0)
        return NULL;
    int got = 0;
    for (; got < 2; got++)
        if (int64_buffer(objs[got], &views[got], names[got]) < 0)
            break;
    if (got == 2) {
        Lanes b = {views[0].buf, views[1].buf, views[0].len / 8 / BLOCK_FIELDS,
                   views[1].len / 8 / LANE_FIELDS, to_kv, 1};
        for (Py_ssize_t l = 0; l < b.nlanes; l++)
            if (b.lanes[l * LANE_FIELDS + LENGTH] >= TABLE_BELOW)
                b.tables = 0;
        const char *bad = views[0].len % (8 * BLOCK_FIELDS) ? "copy_lanes: blocks must hold 3 "
                          "int64 fields per block" : views[1].len % (8 * LANE_FIELDS) ?
                          "copy_lanes: lanes must hold 6 int64 fields per lane" :
                          lanes_invalid(&b);
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

/* ---- sorted_blocks: a batch's blocks in ascending engine block order ----------------- */

/* `idx`, n entries: the indices of `key` sorted by value, stably; `scratch` holds
 * max(n, bound + 1) entries. A counting sort when the keys are dense in [0, bound), else a
 * merge sort. */
static void
stable_order(const int64_t *key, Py_ssize_t n, Py_ssize_t bound, int64_t *idx, int64_t *scratch)
{
    if (n <= bound / 4) { /* sparse: a merge sort, ping-ponging into idx at the end */
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
    else { /* dense: counting sort over [0, bound) */
        memset(scratch, 0, (size_t)(bound + 1) * 8);
        for (Py_ssize_t i = 0; i < n; i++)
            scratch[key[i] + 1]++;
        for (Py_ssize_t v = 0; v < bound; v++)
            scratch[v + 1] += scratch[v];
        for (Py_ssize_t i = 0; i < n; i++)
            idx[scratch[key[i]]++] = i;
    }
}

PyObject *
native_sorted_blocks(PyObject *self, PyObject *args)
{
    PyObject *ids_obj, *ptrs_obj;
    Py_ssize_t bound;
    Py_buffer ids, ptrs;
    if (!PyArg_ParseTuple(args, "OOn:sorted_blocks", &ids_obj, &ptrs_obj, &bound))
        return NULL;
    if (int64_buffer(ids_obj, &ids, "ids") < 0)
        return NULL;
    if (int64_buffer(ptrs_obj, &ptrs, "ptrs") < 0) {
        PyBuffer_Release(&ids);
        return NULL;
    }
    const int64_t *key = ids.buf, *slot = ptrs.buf;
    Py_ssize_t n = ids.len / 8, copies = ptrs.len / 8;
    PyObject *out = NULL;
    int64_t *scratch = NULL;
    if (copies < 1 || n % copies) {
        PyErr_SetString(PyExc_ValueError, "sorted_blocks: ids must hold blocks x copies "
                        "entries (copies = len(ptrs) >= 1)");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (key[i] < 0 || key[i] >= bound) {
            PyErr_Format(PyExc_ValueError, "sorted_blocks: id %lld at %zd is outside [0, %zd)",
                         (long long)key[i], i, bound);
            goto done;
        }
    }
    out = PyByteArray_FromStringAndSize(NULL, n * 8 * BLOCK_FIELDS);
    if (out == NULL || n == 0)
        goto done;
    Py_ssize_t need = n <= bound / 4 ? n : bound + 1;
    int64_t *idx = PyMem_Malloc((size_t)(n + need) * 8);
    if (idx == NULL) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    scratch = idx + n;
    stable_order(key, n, bound, idx, scratch);
    int64_t *row = (int64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, row += BLOCK_FIELDS) {
        int64_t f = idx[i], j = f / copies;
        row[B_ID] = key[f];
        row[B_SLOT] = slot[f - j * copies];
        row[B_POS] = j;
    }
    PyMem_Free(idx);
done:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&ptrs);
    return out;
}
