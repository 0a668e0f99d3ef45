/* kvtier._native's reading of a transfer job's copies: read_copies(copies) (what it returns:
 * _native.c), the Python passes of kvtier.transfer.plan's _Table.of in one C pass. */
#include "_native.h"
#include <structmember.h> /* T_OBJECT_EX: the kind of member a slotted dataclass field is */

enum { GROUP, FIRST, SLOT, IDS, FIELDS };
static const char *field_names[FIELDS] = {"group", "first_block", "slot", "block_ids"};

/* How a job's copies are read: each field by its offset in the object where the copies' class
 * keeps it in a slot (dataclass(slots=True), as ChunkCopy), else by getattr. */
typedef struct {
    PyTypeObject *type; /* the class whose slot offsets these are; NULL: getattr only */
    Py_ssize_t offset[FIELDS];
    PyObject *name[FIELDS];
} Reader;

static int
reader_init(Reader *r, PyObject *first)
{
    static PyObject *names[FIELDS];
    for (int k = 0; k < FIELDS; k++) {
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(field_names[k])) == NULL)
            return -1;
        r->name[k] = names[k];
    }
    r->type = first != NULL ? Py_TYPE(first) : NULL;
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

/* A copy's field `k`, a new reference; NULL, with no exception set, where it has none. */
static PyObject *
reader_get(const Reader *r, PyObject *copy, int k)
{
    if (Py_TYPE(copy) == r->type) {
        PyObject *v = *(PyObject **)((char *)copy + r->offset[k]);
        Py_XINCREF(v);
        return v;
    }
    PyObject *v = PyObject_GetAttr(copy, r->name[k]);
    if (v == NULL)
        PyErr_Clear();
    return v;
}

/* An int field as int64: 0 where it is not an int, or not one that fits (error cleared). */
static int
as_int64(PyObject *v, int exact, int64_t *out)
{
    int ok = v != NULL && (exact ? PyLong_CheckExact(v) : PyLong_Check(v));
    *out = ok ? PyLong_AsLongLong(v) : 0;
    if (ok && *out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        ok = 0;
    }
    return ok;
}

/* Copy i's fields into the table's columns (n copies) and its block ids at ids[*total...];
 * 0 where a field is not a ChunkCopy's, -1 where memory ran out. */
static int
read_one(const Reader *r, PyObject *copy, Py_ssize_t i, Py_ssize_t n, int64_t *cols,
         int64_t **ids, Py_ssize_t *cap, Py_ssize_t *total, int *ints, PyObject *slots)
{
    PyObject *v[FIELDS];
    for (int k = 0; k < FIELDS; k++)
        v[k] = reader_get(r, copy, k);
    int ok = as_int64(v[GROUP], 0, &cols[i]) && as_int64(v[FIRST], 0, &cols[n + i])
             && v[SLOT] != NULL && v[IDS] != NULL && PyTuple_CheckExact(v[IDS]);
    if (ok && (!as_int64(v[SLOT], 1, &cols[3 * n + i]) || cols[3 * n + i] < 0))
        *ints = 0, cols[3 * n + i] = 0; /* a buffer, no row, or an index past int64 */
    Py_ssize_t m = ok ? PyTuple_GET_SIZE(v[IDS]) : 0;
    if (ok && *total + m > *cap) {
        *cap = 2 * (*total + m);
        int64_t *more = PyMem_Realloc(*ids, (size_t)*cap * 8);
        if (more == NULL)
            ok = -1;
        else
            *ids = more;
    }
    int64_t *at = *ids + *total, run = 1;
    for (Py_ssize_t j = 0; ok == 1 && j < m; j++) {
        ok = as_int64(PyTuple_GET_ITEM(v[IDS], j), 1, &at[j]);
        run = run && (j == 0 || at[j] == at[j - 1] + 1);
    }
    cols[2 * n + i] = m;
    cols[4 * n + i] = run;
    *total += m;
    if (ok == 1) {
        PyList_SET_ITEM(slots, i, v[SLOT]);
        v[SLOT] = NULL;
    }
    for (int k = 0; k < FIELDS; k++)
        Py_XDECREF(v[k]);
    return ok;
}

PyObject *
native_read_copies(PyObject *self, PyObject *args)
{
    PyObject *copies;
    if (!PyArg_ParseTuple(args, "O!:read_copies", &PyList_Type, &copies))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(copies), total = 0, cap = 4 * n + 16;
    Reader r;
    if (reader_init(&r, n > 0 ? PyList_GET_ITEM(copies, 0) : NULL) < 0)
        return NULL;
    int64_t *cols = PyMem_Malloc((size_t)(5 * n + 1) * 8), *ids = PyMem_Malloc((size_t)cap * 8);
    PyObject *slots = PyList_New(n), *table = NULL;
    int ints = 1, ok = cols != NULL && ids != NULL && slots != NULL ? 1 : -1;
    for (Py_ssize_t i = 0; ok == 1 && i < n; i++) {
        if (i >= PyList_GET_SIZE(copies)) { /* a getattr shortened the list meanwhile */
            ok = 0;
            break;
        }
        PyObject *copy = PyList_GET_ITEM(copies, i);
        Py_INCREF(copy);
        ok = read_one(&r, copy, i, n, cols, &ids, &cap, &total, &ints, slots);
        Py_DECREF(copy);
    }
    if (ok == 1 && (table = PyByteArray_FromStringAndSize(NULL, (5 * n + total) * 8)) != NULL) {
        memcpy(PyByteArray_AS_STRING(table), cols, (size_t)(5 * n) * 8);
        memcpy(PyByteArray_AS_STRING(table) + 5 * n * 8, ids, (size_t)total * 8);
    }
    PyMem_Free(cols);
    PyMem_Free(ids);
    if (table == NULL) {
        Py_XDECREF(slots);
        if (ok == 1 || ok == -1)
            return PyErr_Occurred() ? NULL : PyErr_NoMemory();
        Py_RETURN_NONE; /* not what a ChunkCopy holds: the caller reads the copies in Python */
    }
    return Py_BuildValue("(NON)", table, ints ? Py_True : Py_False, slots);
}
