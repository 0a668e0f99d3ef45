/* kvtier._native.KeyOrder's methods and type (_native_order.h says what it is; its table
 * and list are in _native_order_core.c). */
#include "_native_order.h"

static PyObject *order_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "KeyOrder() takes no arguments");
        return NULL;
    }
    KeyOrder *q = (KeyOrder *)type->tp_alloc(type, 0);
    if (q)
        q->free = q->head = q->tail = NIL;
    return (PyObject *)q;
}

static int order_clear(KeyOrder *q)
{
    for (uint32_t n = 0; n < q->used; n++)
        Py_CLEAR(q->nodes[n].key);
    PyMem_Free(q->nodes);
    PyMem_Free(q->table);
    q->nodes = NULL;
    q->table = NULL;
    q->cap = q->used = 0;
    q->mask = 0;
    q->len = 0;
    q->free = q->head = q->tail = NIL;
    return 0;
}

static int order_traverse(KeyOrder *q, visitproc visit, void *arg)
{
    for (uint32_t n = 0; n < q->used; n++)
        Py_VISIT(q->nodes[n].key);
    return 0;
}

static void order_dealloc(KeyOrder *q)
{
    PyObject_GC_UnTrack(q);
    order_clear(q);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

/* push(keys): adds keys that are not here at the new end, in order (ValueError for a key
 * that is here, a repeated one included; nothing changes then). */
static PyObject *order_push(KeyOrder *q, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "push: a sequence of keys expected");
    if (!seq || order_enter(q) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), done = 0;
    for (; done < n; done++) {
        int added = order_add_or_move(q, PySequence_Fast_GET_ITEM(seq, done), 0);
        if (added > 0)
            continue;
        if (!added)
            PyErr_SetString(PyExc_ValueError,
                            "push: a key is already in the order (push only absent keys, "
                            "each once; move_from moves keys)");
        for (; done > 0; done--) /* undo: the keys added are the newest */
            Py_DECREF(order_remove_node(q, q->tail));
        Py_DECREF(seq);
        LEAVE(q, NULL);
    }
    Py_DECREF(seq);
    q->busy = 0;
    Py_RETURN_NONE;
}

/* Each of `keys` to the new end of q; a key in `other` (another order, or q itself) leaves
 * it once it is here, any other key is added (move_from and to_new_end). */
static PyObject *move_keys(KeyOrder *q, KeyOrder *other, PyObject *keys, const char *fast_msg)
{
    PyObject *seq = PySequence_Fast(keys, fast_msg);
    if (!seq)
        return NULL;
    if (order_enter(q) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    if (other != q && order_enter(other) < 0) {
        q->busy = 0;
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        int err = 0;
        uint32_t there = other != q ? order_node_of(other, key, &err) : NIL;
        ok = err == 0 && order_add_or_move(q, key, 1) >= 0;
        if (ok && there != NIL) /* here now: only then does it leave the other order */
            Py_DECREF(order_remove_node(other, there));
    }
    Py_DECREF(seq);
    other->busy = 0;
    q->busy = 0;
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* move_from(other, keys): each key to the new end here; a key here keeps its place in the
 * count, a key in `other` (another KeyOrder, or this one) leaves it, others are added. */
static PyObject *order_move_from(KeyOrder *q, PyObject *args)
{
    PyObject *other, *keys;
    if (!PyArg_ParseTuple(args, "OO:move_from", &other, &keys))
        return NULL;
    if (Py_TYPE(other) != Py_TYPE(q)) {
        PyErr_SetString(PyExc_TypeError, "move_from: the other order must be a KeyOrder");
        return NULL;
    }
    return move_keys(q, (KeyOrder *)other, keys, "move_from: a sequence of keys expected");
}

/* to_new_end(keys): each key to the new end, in order (a key not here is added). */
static PyObject *order_to_new_end(KeyOrder *q, PyObject *keys)
{
    return move_keys(q, q, keys, "to_new_end: a sequence of keys expected");
}

/* take(keys) -> the keys found here, removed (a repeated key once). */
static PyObject *order_take(KeyOrder *q, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "take: a sequence of keys expected");
    if (!seq || order_enter(q) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    PyObject *found = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; found && i < n; i++) {
        int err = 0;
        uint32_t node = order_node_of(q, PySequence_Fast_GET_ITEM(seq, i), &err);
        if (err < 0) {
            Py_CLEAR(found);
            break;
        }
        if (node == NIL)
            continue;
        PyObject *key = order_remove_node(q, node);
        if (PyList_Append(found, key) < 0)
            Py_CLEAR(found);
        Py_DECREF(key);
    }
    Py_DECREF(seq);
    LEAVE(q, found);
}

/* remove(key): forgets a key that is here (KeyError if it is not). */
static PyObject *order_remove(KeyOrder *q, PyObject *key)
{
    if (order_enter(q) < 0)
        return NULL;
    int err = 0;
    uint32_t node = order_node_of(q, key, &err);
    if (err < 0)
        LEAVE(q, NULL);
    if (node == NIL) {
        PyErr_SetObject(PyExc_KeyError, key);
        LEAVE(q, NULL);
    }
    Py_DECREF(order_remove_node(q, node));
    q->busy = 0;
    Py_RETURN_NONE;
}

/* pop_unprotected(n, protected) -> the n oldest keys not in `protected`, removed; the
 * protected keys met on the way move to the new end, in the order met. ValueError (and
 * nothing changes) when fewer than n unprotected keys are here. */
static PyObject *order_pop_unprotected(KeyOrder *q, PyObject *args)
{
    Py_ssize_t want;
    PyObject *protected;
    if (!PyArg_ParseTuple(args, "nO:pop_unprotected", &want, &protected))
        return NULL;
    if (want < 0 || want > q->len) {
        PyErr_Format(PyExc_ValueError, "pop_unprotected: %zd keys asked of %zd", want, q->len);
        return NULL;
    }
    Py_ssize_t guarded = PyObject_Length(protected);
    if (guarded < 0 || order_enter(q) < 0)
        return NULL;
    uint32_t *passed = NULL, num_passed = 0, room = 0, stop = q->head;
    Py_ssize_t chosen = 0;
    /* first a read-only walk: how far the n-th unprotected key is, and which protected
     * keys come before it */
    for (; chosen < want; stop = q->nodes[stop].next) {
        if (stop == NIL) {
            PyMem_Free(passed);
            PyErr_Format(PyExc_ValueError,
                         "pop_unprotected: fewer than %zd unprotected keys", want);
            LEAVE(q, NULL);
        }
        int is = guarded ? PySequence_Contains(protected, q->nodes[stop].key) : 0;
        if (is < 0) {
            PyMem_Free(passed);
            LEAVE(q, NULL);
        }
        if (!is) {
            chosen++;
            continue;
        }
        if (num_passed == room) {
            room = room ? 2 * room : 16;
            uint32_t *more = PyMem_Realloc(passed, (size_t)room * sizeof(uint32_t));
            if (!more) {
                PyMem_Free(passed);
                PyErr_NoMemory();
                LEAVE(q, NULL);
            }
            passed = more;
        }
        passed[num_passed++] = stop;
    }
    PyObject *out = PyList_New(want);
    if (!out) {
        PyMem_Free(passed);
        LEAVE(q, NULL);
    }
    for (uint32_t p = 0; p < num_passed; p++) { /* protected ones: to the new end */
        order_unlink(q, passed[p]);
        order_link_newest(q, passed[p]);
    }
    PyMem_Free(passed);
    for (Py_ssize_t i = 0; i < want; i++) /* now the n oldest are the chosen */
        PyList_SET_ITEM(out, i, order_remove_node(q, q->head));
    LEAVE(q, out);
}

/* The keys, oldest first, as a new list. */
static PyObject *order_keys(KeyOrder *q)
{
    PyObject *out = PyList_New(q->len);
    Py_ssize_t i = 0;
    for (uint32_t n = q->head; out && n != NIL; n = q->nodes[n].next, i++) {
        Py_INCREF(q->nodes[n].key);
        PyList_SET_ITEM(out, i, q->nodes[n].key);
    }
    return out;
}

static PyObject *order_iter(KeyOrder *q)
{
    PyObject *keys = order_keys(q);
    if (!keys)
        return NULL;
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static int order_contains(KeyOrder *q, PyObject *key)
{
    if (order_enter(q) < 0)
        return -1;
    int err = 0;
    uint32_t node = order_node_of(q, key, &err);
    q->busy = 0;
    return err < 0 ? -1 : node != NIL;
}

/* live_among(keys) -> the keys that are here, in order. */
static PyObject *order_live_among(KeyOrder *q, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "live_among: a sequence of keys expected");
    if (!seq)
        return NULL;
    PyObject *out = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        int here = order_contains(q, key);
        if (here < 0 || (here && PyList_Append(out, key) < 0))
            Py_CLEAR(out);
    }
    Py_DECREF(seq);
    return out;
}

/* check(): AssertionError unless the list, the table and the count agree. */
static PyObject *order_check(KeyOrder *q, PyObject *unused)
{
    Py_ssize_t walked = 0, entries = 0;
    uint32_t prev = NIL;
    const char *bad = NULL;
    for (uint32_t n = q->head; n != NIL && !bad; prev = n, n = q->nodes[n].next, walked++) {
        if (walked > q->len || q->nodes[n].prev != prev || !q->nodes[n].key)
            bad = "KeyOrder: the list is broken";
    }
    if (!bad && (walked != q->len || prev != q->tail))
        bad = "KeyOrder: the list and the count disagree";
    for (size_t i = 0; !bad && q->table && i <= q->mask; i++) {
        if (!q->table[i])
            continue;
        entries++;
        const Node *node = &q->nodes[q->table[i] - 1];
        size_t j = order_home(node->hash, q->mask);
        while (j != i && q->table[j])
            j = (j + 1) & q->mask;
        if (!node->key || j != i)
            bad = "KeyOrder: a table entry a probe misses";
    }
    if (!bad && entries != q->len)
        bad = "KeyOrder: the table and the count disagree";
    if (bad) {
        PyErr_SetString(PyExc_AssertionError, bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static Py_ssize_t order_len(KeyOrder *q) { return q->len; }

static PyMethodDef order_methods[] = {
    {"push", (PyCFunction)order_push, METH_O,
     "push(keys): add keys that are not here at the new end."},
    {"move_from", (PyCFunction)order_move_from, METH_VARARGS,
     "move_from(other, keys): each key to the new end here, leaving `other` if there."},
    {"to_new_end", (PyCFunction)order_to_new_end, METH_O,
     "to_new_end(keys): each key to the new end, in order (a key not here is added)."},
    {"take", (PyCFunction)order_take, METH_O,
     "take(keys) -> the keys found here, removed (a repeated key once)."},
    {"remove", (PyCFunction)order_remove, METH_O,
     "remove(key): forget a key that is here (KeyError if not)."},
    {"pop_unprotected", (PyCFunction)order_pop_unprotected, METH_VARARGS,
     "pop_unprotected(n, protected) -> the n oldest keys not in protected, removed; "
     "protected keys met move to the new end."},
    {"live_among", (PyCFunction)order_live_among, METH_O,
     "live_among(keys) -> the keys that are here, in order."},
    {"check", (PyCFunction)order_check, METH_NOARGS,
     "check(): AssertionError unless the list, the table and the count agree."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods order_sequence = {
    .sq_length = (lenfunc)order_len,
    .sq_contains = (objobjproc)order_contains,
};

PyTypeObject KeyOrderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvtier._native.KeyOrder",
    .tp_basicsize = sizeof(KeyOrder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "KeyOrder(): keys in recency order, oldest first (KeyQueue's interface).",
    .tp_new = order_new,
    .tp_dealloc = (destructor)order_dealloc,
    .tp_traverse = (traverseproc)order_traverse,
    .tp_clear = (inquiry)order_clear,
    .tp_iter = (getiterfunc)order_iter,
    .tp_methods = order_methods,
    .tp_as_sequence = &order_sequence,
};
