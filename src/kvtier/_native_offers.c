/* kvtier._native.OfferCounts and offer_fingerprints: admission's offer window
 * (kvtier.store.offers.OfferWindow) over 64-bit fingerprints, with no Python object per
 * offer. The ring holds the last `window` fingerprints (oldest at `pos` once full); the
 * table counts each distinct fingerprint among them: open addressing, linear probing,
 * backward-shift deletion (no tombstones), a count of 0 marking an empty entry. */
#include "_native.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "offer_fingerprints reads keys as little-endian words, as offers.fingerprint does"
#endif

#define FP_MIX 0x9E3779B97F4A7C15ULL /* as offers._MIX: spreads the tag before the digest */

typedef struct {
    PyObject_HEAD
    uint64_t *ring;
    Py_ssize_t len, cap, pos, window;
    uint64_t *keys;
    uint32_t *counts;
    size_t mask, used;
} OfferCounts;

static size_t home(uint64_t fp, size_t mask) { return (size_t)((fp * FP_MIX) >> 32) & mask; }

/* Where fp is, or the empty entry where it would go. */
static size_t find(const OfferCounts *t, uint64_t fp)
{
    size_t i = home(fp, t->mask);
    while (t->counts[i] && t->keys[i] != fp)
        i = (i + 1) & t->mask;
    return i;
}

static int grow(OfferCounts *t)
{
    size_t old_size = t->mask + 1, size = old_size * 2;
    uint64_t *old_keys = t->keys;
    uint32_t *old_counts = t->counts;
    uint64_t *keys = PyMem_Malloc(size * sizeof(uint64_t));
    uint32_t *counts = PyMem_Calloc(size, sizeof(uint32_t));
    if (!keys || !counts) {
        PyMem_Free(keys);
        PyMem_Free(counts);
        PyErr_NoMemory();
        return -1;
    }
    t->keys = keys;
    t->counts = counts;
    t->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old_counts[i]) {
            size_t j = find(t, old_keys[i]);
            keys[j] = old_keys[i];
            counts[j] = old_counts[i];
        }
    }
    PyMem_Free(old_keys);
    PyMem_Free(old_counts);
    return 0;
}

/* The table's first 64 entries, at the first offer (nothing is allocated up front). */
static int start_table(OfferCounts *t)
{
    t->keys = PyMem_Malloc(64 * sizeof(uint64_t));
    t->counts = PyMem_Calloc(64, sizeof(uint32_t));
    t->mask = 63;
    if (!t->keys || !t->counts) {
        PyMem_Free(t->keys);
        PyMem_Free(t->counts);
        t->keys = NULL;
        t->counts = NULL;
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int inc(OfferCounts *t, uint64_t fp)
{
    if (!t->keys && start_table(t) < 0)
        return -1;
    size_t i = find(t, fp);
    if (!t->counts[i]) {
        t->keys[i] = fp;
        t->counts[i] = 1;
        if (++t->used * 2 > t->mask + 1)
            return grow(t);
        return 0;
    }
    t->counts[i]++;
    return 0;
}

/* One offer of fp fewer (fp is counted): at 0 the entry empties, and the entries after it
 * in its run move back to where a probe from their home finds them. */
static void dec(OfferCounts *t, uint64_t fp)
{
    size_t i = find(t, fp), j = i;
    if (--t->counts[i])
        return;
    t->used--;
    for (;;) {
        j = (j + 1) & t->mask;
        if (!t->counts[j])
            return;
        size_t k = home(t->keys[j], t->mask);
        /* j's entry may fill the hole at i when its home is not within (i, j] */
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            t->keys[i] = t->keys[j];
            t->counts[i] = t->counts[j];
            t->counts[j] = 0;
            i = j;
        }
    }
}

static uint32_t get(const OfferCounts *t, uint64_t fp)
{
    return t->keys ? t->counts[find(t, fp)] : 0;
}

static int fp_buffer(PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "fingerprints: a multiple of 8 bytes expected");
        return -1;
    }
    return 0;
}

static uint64_t fp_at(const Py_buffer *view, Py_ssize_t i)
{
    uint64_t fp;
    memcpy(&fp, (const char *)view->buf + 8 * i, 8);
    return fp;
}

static PyObject *offers_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Py_ssize_t window;
    static char *names[] = {"window", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n:OfferCounts", names, &window))
        return NULL;
    if (window < 1) {
        PyErr_SetString(PyExc_ValueError, "OfferCounts: window must be at least 1");
        return NULL;
    }
    OfferCounts *t = (OfferCounts *)type->tp_alloc(type, 0);
    if (!t)
        return NULL;
    t->window = window;
    return (PyObject *)t;
}

static void offers_dealloc(OfferCounts *t)
{
    PyMem_Free(t->ring);
    PyMem_Free(t->keys);
    PyMem_Free(t->counts);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* split(fps, need) -> bytes, one per fingerprint: 1 when, were the fingerprints offered
 * one after another now, at least `need` offers of it would be among the last `window`
 * before it (the offers that leave the window before it no longer count). Changes
 * nothing: the offers dropped on the way are counted again before it returns. */
static PyObject *offers_split(OfferCounts *t, PyObject *args)
{
    PyObject *obj;
    unsigned int need;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "OI:split", &obj, &need) || fp_buffer(obj, &view) < 0)
        return NULL;
    Py_ssize_t n = view.len / 8, dropped = 0, late = t->len - t->window;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *admit = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++, late++) {
        if (late > dropped && dropped < t->len) {
            dec(t, t->ring[(t->pos + dropped) % t->window]);
            dropped++;
        }
        admit[i] = get(t, fp_at(&view, i)) >= need;
    }
    PyBuffer_Release(&view);
    for (Py_ssize_t d = 0; d < dropped; d++) {
        if (inc(t, t->ring[(t->pos + d) % t->window]) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* record(fps): one offer of each, the oldest offers past the window forgotten. */
static PyObject *offers_record(OfferCounts *t, PyObject *args)
{
    PyObject *obj;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "O:record", &obj) || fp_buffer(obj, &view) < 0)
        return NULL;
    Py_ssize_t n = view.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t fp = fp_at(&view, i);
        if (inc(t, fp) < 0)
            goto fail;
        if (t->len < t->window) {
            if (t->len == t->cap) {
                Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
                if (cap > t->window)
                    cap = t->window;
                uint64_t *ring = PyMem_Realloc(t->ring, (size_t)cap * sizeof(uint64_t));
                if (!ring) {
                    dec(t, fp);
                    PyErr_NoMemory();
                    goto fail;
                }
                t->ring = ring;
                t->cap = cap;
            }
            t->ring[t->len++] = fp;
            continue;
        }
        uint64_t old = t->ring[t->pos];
        t->ring[t->pos] = fp;
        t->pos = (t->pos + 1) % t->window;
        dec(t, old);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *offers_num_distinct(OfferCounts *t, PyObject *unused)
{
    return PyLong_FromSize_t(t->used);
}

/* check() -> None: recounts the ring into a fresh table and compares; AssertionError. */
static PyObject *offers_check(OfferCounts *t, PyObject *unused)
{
    size_t used = 0, total = 0;
    for (size_t i = 0; t->keys && i <= t->mask; i++) {
        if (t->counts[i]) {
            used++;
            total += t->counts[i];
            if (find(t, t->keys[i]) != i) {
                PyErr_SetString(PyExc_AssertionError, "OfferCounts: an entry a probe misses");
                return NULL;
            }
        }
    }
    if (used != t->used || total != (size_t)t->len || t->len > t->window) {
        PyErr_SetString(PyExc_AssertionError, "OfferCounts: counts disagree with the ring");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < t->len; i++) {
        if (!get(t, t->ring[i])) {
            PyErr_SetString(PyExc_AssertionError, "OfferCounts: a remembered offer uncounted");
            return NULL;
        }
    }
    Py_RETURN_NONE;
}

static Py_ssize_t offers_len(OfferCounts *t) { return t->len; }

static PyMethodDef offers_methods[] = {
    {"split", (PyCFunction)offers_split, METH_VARARGS,
     "split(fps, need) -> bytes: 1 for each fingerprint an offer now would admit."},
    {"record", (PyCFunction)offers_record, METH_VARARGS,
     "record(fps): count one offer of each fingerprint, forgetting the oldest."},
    {"num_distinct", (PyCFunction)offers_num_distinct, METH_NOARGS,
     "num_distinct() -> int: distinct fingerprints among the remembered offers."},
    {"check", (PyCFunction)offers_check, METH_NOARGS,
     "check(): AssertionError unless the counts are the ring's."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods offers_sequence = {.sq_length = (lenfunc)offers_len};

PyTypeObject OfferCountsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._native.OfferCounts",
    .tp_basicsize = sizeof(OfferCounts),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OfferCounts(window): the last `window` offers' fingerprints and their counts.",
    .tp_new = offers_new,
    .tp_dealloc = (destructor)offers_dealloc,
    .tp_methods = offers_methods,
    .tp_as_sequence = &offers_sequence,
};

/* offer_fingerprints(keys) -> bytes: offers.fingerprint of each key (a list of bytes of
 * at least 16: its first 8 bytes the tag, the next 8 the digest's), 8 bytes each. */
PyObject *native_offer_fingerprints(PyObject *self, PyObject *keys)
{
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "offer_fingerprints: a list of keys expected");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!out)
        return NULL;
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) < 16) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError,
                            "offer_fingerprints: each key must be bytes of at least 16");
            return NULL;
        }
        uint64_t tag, digest, fp;
        memcpy(&tag, PyBytes_AS_STRING(key), 8);
        memcpy(&digest, PyBytes_AS_STRING(key) + 8, 8);
        fp = (tag * FP_MIX) ^ digest;
        memcpy(dst + 8 * i, &fp, 8);
    }
    return out;
}
