/* kvtier._native's reading of a transfer job's copies: read_job (what it returns: _native.c),
 * the Python passes of kvtier.transfer.plan's _Table.of and its checks in one C pass. */
#include "_native.h"
#include <structmember.h> /* T_OBJECT_EX: the kind of member a slotted dataclass field is */
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h> /* ob_digit (Python.h includes it from 3.11) */
#endif

enum { GROUP, FIRST, SLOT, IDS, FIELDS };
static const char *field_names[FIELDS] = {"group", "first_block", "slot", "block_ids"};

/* How a job's copies are read: each an instance of `kind` (ChunkCopy), its fields by their
 * offsets in the object where it is of that very class and the class keeps them in slots
 * (dataclass(slots=True), as ChunkCopy), else by getattr (a subclass). */
typedef struct {
    PyTypeObject *kind;
    PyTypeObject *type; /* the class whose slot offsets these are; NULL: getattr only */
    Py_ssize_t offset[FIELDS];
    PyObject *name[FIELDS];
} Reader;

static int
reader_init(Reader *r, PyTypeObject *kind)
{
    static PyObject *names[FIELDS];
    for (int k = 0; k < FIELDS; k++) {
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(field_names[k])) == NULL)
            return -1;
        r->name[k] = names[k];
    }
    r->kind = r->type = kind;
    for (int k = 0; r->type != NULL && k < FIELDS; k++) {
        PyObject *d = PyObject_GetAttr((PyObject *)r->type, names[k]);
        if (d == NULL)
            PyErr_Clear();
        int slot = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)
                   && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (slot)
            r->offset[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        else
            r->type = NULL;
        Py_XDECREF(d);
    }
    return 0;
}

/* An int field as int64: 0 where it is not an int, or not one that fits (error cleared). An
 * exact int of one digit, what block ids and slot rows are, is read in place. */
static inline int
as_int64(PyObject *v, int exact, int64_t *out)
{
    if (v != NULL && PyLong_CheckExact(v)) {
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
            *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)v);
            return 1;
        }
#else
        Py_ssize_t size = Py_SIZE(v); /* digits, negative for a negative int */
        if (size == 0 || size == 1) {
            *out = size ? (int64_t)((PyLongObject *)v)->ob_digit[0] : 0;
            return 1;
        }
#endif
    }
    int ok = v != NULL && (exact ? PyLong_CheckExact(v) : PyLong_Check(v));
    *out = ok ? PyLong_AsLongLong(v) : 0;
    if (ok && *out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        ok = 0;
    }
    return ok;
}

/* Warms copy `i + 24`'s object, `i + 12`'s slot and block ids, and `i + 6`'s ids, so that
 * the reads of a job's copies, cold in cache when a job is submitted, overlap instead of
 * waiting for memory one object at a time. */
static inline void
prefetch_copies(const Reader *r, PyObject *copies, Py_ssize_t i, Py_ssize_t n)
{
#if defined(__SSE2__)
    if (i + 24 < n)
        _mm_prefetch((const char *)PyList_GET_ITEM(copies, i + 24), _MM_HINT_T0);
    PyObject *c = i + 12 < n ? PyList_GET_ITEM(copies, i + 12) : NULL;
    if (c != NULL && Py_TYPE(c) == r->type) {
        _mm_prefetch(*(const char **)((char *)c + r->offset[IDS]), _MM_HINT_T0);
        _mm_prefetch(*(const char **)((char *)c + r->offset[SLOT]), _MM_HINT_T0);
    }
    c = i + 6 < n ? PyList_GET_ITEM(copies, i + 6) : NULL;
    if (c != NULL && Py_TYPE(c) == r->type) {
        PyObject *t = *(PyObject **)((char *)c + r->offset[IDS]);
        if (t != NULL && PyTuple_CheckExact(t))
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(t); j++)
                _mm_prefetch((const char *)PyTuple_GET_ITEM(t, j), _MM_HINT_T0);
    }
#endif
}

/* What read_job checks a job against: per group (`groups` of them), its engine blocks and
 * the blocks of one chunk; the registered slab's rows (0: none), its address and row bytes;
 * whether the job is a load (else a store). */
typedef struct {
    const int64_t *num_blocks, *per_slot;
    Py_ssize_t groups, slab_rows;
    long long slab_ptr, row_bytes;
    int load;
} Limits;

/* A job's table as it is read: the bytearray read_job returns (n copies: 5 columns, then the
 * ids, `total` so far), and the checks so far: `bad`; `uniform`, whether every copy so far
 * has copy 0's group, shape and run flag and a slab row, rows ascending; and `seen`, a bit
 * per engine block (load: group g's blocks from base[g]) or slab row (store) named so far,
 * NULL once `repeated` is known or cannot be (see read_job). */
typedef struct {
    PyObject *out;
    Py_ssize_t n, total, cap, bad;
    int ints, uniform, repeated;
    uint64_t *seen;
    int64_t *base;
} Table;

static inline int64_t *
table_cols(Table *t)
{
    return (int64_t *)PyByteArray_AS_STRING(t->out);
}

/* Marks `v` in t->seen; a second mark settles `repeated`. */
static inline void
table_mark(Table *t, int64_t v)
{
    uint64_t bit = (uint64_t)1 << (v & 63);
    if (t->seen[v >> 6] & bit) {
        t->repeated = 1;
        PyMem_Free(t->seen);
        t->seen = NULL;
    }
    else {
        t->seen[v >> 6] |= bit;
    }
}

/* The checks of copy i (read into the table): in range, like copy 0, no repeat so far. */
static void
table_check(Table *t, const Limits *lim, Py_ssize_t i, const int64_t *ids)
{
    int64_t *c = table_cols(t), n = t->n, g = c[i], m = c[2 * n + i];
    if (t->bad >= 0)
        return;
    int ok = g >= 0 && g < lim->groups && c[n + i] + m <= lim->per_slot[g];
    for (int64_t j = 0; ok && j < m; j++)
        ok = ids[j] >= 0 && ids[j] < lim->num_blocks[g];
    if (!ok) {
        t->bad = i, t->uniform = 0;
        return;
    }
    if (t->uniform)
        t->uniform = t->ints && c[3 * n + i] < lim->slab_rows
                     && (i == 0 || (g == c[0] && c[n + i] == c[n] && m == c[2 * n]
                                    && c[4 * n + i] == c[4 * n]
                                    && c[3 * n + i] >= c[3 * n + i - 1]));
    if (t->seen == NULL)
        return;
    if (lim->load) {
        for (int64_t j = 0; j < m && t->seen != NULL; j++)
            table_mark(t, t->base[g] + ids[j]);
    }
    else if (t->ints && c[3 * n + i] < lim->slab_rows) {
        table_mark(t, c[3 * n + i]);
    }
    else { /* not a row (slot_addresses says why): the caller checks the slot bytes */
        PyMem_Free(t->seen);
        t->seen = NULL;
        t->repeated = -1;
    }
}

/* Reads copy i's fields into the table (its ids from t->total on); 1, or 0 where a field is
 * not a ChunkCopy's, or -1 with an exception set. Fields are borrowed from a copy of the
 * reader's slotted class (held by the caller; no Python code runs meanwhile), else got by
 * getattr. */
static int
read_one(const Reader *r, PyObject *copy, Py_ssize_t i, Table *t, PyObject *slots)
{
    PyObject *v[FIELDS];
    int owned = Py_TYPE(copy) != r->type;
    for (int k = 0; k < FIELDS; k++) {
        v[k] = owned ? PyObject_GetAttr(copy, r->name[k]) : *(PyObject **)((char *)copy
                                                                          + r->offset[k]);
        if (v[k] == NULL)
            PyErr_Clear();
    }
    Py_ssize_t n = t->n, m = v[IDS] != NULL && PyTuple_CheckExact(v[IDS])
                                 ? PyTuple_GET_SIZE(v[IDS]) : -1;
    int ok = m >= 0 && v[SLOT] != NULL;
    if (ok && 5 * n + t->total + m > t->cap) {
        t->cap = 2 * (5 * n + t->total + m);
        ok = PyByteArray_Resize(t->out, t->cap * 8) < 0 ? -1 : 1;
    }
    int64_t *c = table_cols(t), *at = c + 5 * n + t->total, run = 1;
    if (ok == 1) {
        ok = as_int64(v[GROUP], 0, &c[i]) && as_int64(v[FIRST], 0, &c[n + i]);
        if (!as_int64(v[SLOT], 1, &c[3 * n + i]) || c[3 * n + i] < 0)
            t->ints = 0, c[3 * n + i] = 0; /* a buffer, no row, or an index past int64 */
    }
    for (Py_ssize_t j = 0; ok == 1 && j < m; j++) {
        ok = as_int64(PyTuple_GET_ITEM(v[IDS], j), 1, &at[j]);
        run = run && (j == 0 || at[j] == at[j - 1] + 1);
    }
    if (ok == 1) {
        c[2 * n + i] = m;
        c[4 * n + i] = run;
        t->total += m;
        Py_INCREF(v[SLOT]);
        PyList_SET_ITEM(slots, i, v[SLOT]);
    }
    for (int k = 0; owned && k < FIELDS; k++)
        Py_XDECREF(v[k]);
    return ok;
}

/* Starts a table for n copies: the bytearray (room for 4 ids a copy, more as needed) and the
 * bitmap of read_job's repeat check, where it is worth one (a bit per engine block or slab row
 * against a sort of the ids in Python). 0, or -1 with an exception set. */
static int
table_start(Table *t, const Limits *lim, Py_ssize_t n)
{
    *t = (Table){NULL, n, 0, 9 * n + 16, -1, 1, 1, -1, NULL, NULL};
    if ((t->out = PyByteArray_FromStringAndSize(NULL, t->cap * 8)) == NULL)
        return -1;
    int64_t bits = lim->slab_rows;
    if (lim->load) {
        if ((t->base = PyMem_Malloc((size_t)(lim->groups + 1) * 8)) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->base[0] = 0;
        for (Py_ssize_t g = 0; g < lim->groups; g++)
            t->base[g + 1] = t->base[g] + lim->num_blocks[g];
        bits = t->base[lim->groups];
    }
    if (bits > 0 && bits <= 64 * (int64_t)n + (1 << 23)) {
        t->seen = PyMem_Calloc((size_t)(bits / 64 + 1), 8);
        t->repeated = t->seen != NULL ? 0 : -1;
    }
    return 0;
}

/* A uniform job of n copies (m blocks each, ids flat by copy) as one batch: a bytearray of
 * int64, ids[p, i] (block position p of copy i), then each copy's slot address. */
static PyObject *
one_batch(const Limits *lim, const int64_t *c, Py_ssize_t n)
{
    Py_ssize_t m = c[2 * n];
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (m + 1) * n * 8);
    if (out == NULL)
        return NULL;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    const int64_t *ids = c + 5 * n, *rows = c + 3 * n;
    for (Py_ssize_t i = 0; i < n; i++) {
        for (Py_ssize_t p = 0; p < m; p++)
            o[p * n + i] = ids[i * m + p];
        o[m * n + i] = lim->slab_ptr + rows[i] * lim->row_bytes;
    }
    return out;
}

/* (table, slots_are_ints, slots, bad, batch, repeated) as read_job returns them, or None
 * where a copy is not a `kind` or not what one holds, or NULL with an exception set. */
static PyObject *
read_all(PyObject *copies, PyTypeObject *kind, const Limits *lim)
{
    Py_ssize_t n = PyList_GET_SIZE(copies);
    Reader r;
    Table t;
    if (reader_init(&r, kind) < 0)
        return NULL;
    PyObject *slots = PyList_New(n), *out = NULL;
    int ok = table_start(&t, lim, n) == 0 && slots != NULL ? 1 : -1;
    for (Py_ssize_t i = 0; ok == 1 && i < n; i++) {
        if (i >= PyList_GET_SIZE(copies)) { /* a getattr shortened the list meanwhile */
            ok = 0;
            break;
        }
        prefetch_copies(&r, copies, i, PyList_GET_SIZE(copies));
        PyObject *copy = PyList_GET_ITEM(copies, i);
        if (!PyObject_TypeCheck(copy, kind)) {
            ok = 0;
            break;
        }
        Py_INCREF(copy);
        ok = read_one(&r, copy, i, &t, slots);
        if (ok == 1)
            table_check(&t, lim, i, table_cols(&t) + 5 * n + t.total - table_cols(&t)[2 * n + i]);
        Py_DECREF(copy);
    }
    PyMem_Free(t.seen);
    PyMem_Free(t.base);
    PyObject *batch = NULL;
    if (ok == 1 && n > 0 && t.uniform && t.bad < 0 && t.repeated == 0
        && (batch = one_batch(lim, table_cols(&t), n)) == NULL)
        ok = -1;
    if (ok == 1 && PyByteArray_Resize(t.out, (5 * n + t.total) * 8) == 0)
        out = Py_BuildValue("(OOOnOn)", t.out, t.ints ? Py_True : Py_False, slots, t.bad,
                            batch != NULL ? batch : Py_None,
                            (Py_ssize_t)(t.bad >= 0 ? -1 : t.repeated));
    Py_XDECREF(batch);
    Py_XDECREF(t.out);
    Py_XDECREF(slots);
    if (ok == 0 && !PyErr_Occurred())
        Py_RETURN_NONE; /* not what a ChunkCopy holds: the caller reads the copies in Python */
    return out;
}

PyObject *
native_read_job(PyObject *self, PyObject *args)
{
    PyObject *copies, *objs[2], *out = NULL;
    PyTypeObject *kind;
    Py_buffer views[2];
    Limits lim;
    if (!PyArg_ParseTuple(args, "O!O!OOnLLp:read_job", &PyList_Type, &copies, &PyType_Type,
                          &kind, &objs[0], &objs[1], &lim.slab_rows, &lim.slab_ptr,
                          &lim.row_bytes, &lim.load))
        return NULL;
    if (int64_buffer(objs[0], &views[0], "num_blocks") < 0)
        return NULL;
    if (int64_buffer(objs[1], &views[1], "per_slot") < 0) {
        PyBuffer_Release(&views[0]);
        return NULL;
    }
    lim.num_blocks = views[0].buf, lim.per_slot = views[1].buf, lim.groups = views[0].len / 8;
    if (views[1].len != views[0].len)
        PyErr_SetString(PyExc_ValueError, "read_job: num_blocks and per_slot differ in length");
    else
        out = read_all(copies, kind, &lim);
    PyBuffer_Release(&views[0]);
    PyBuffer_Release(&views[1]);
    return out;
}
