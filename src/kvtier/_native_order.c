/* kvtier._native.KeyOrder: LRU's recency order (kvtier.store.policies.queue.KeyQueue's
 * interface and behaviour) as a doubly linked list of nodes, oldest first, indexed by a
 * hash table of its own. A move to the new end relinks one node: nothing is left behind,
 * so nothing is ever compacted, and no Python object is made per key.
 *
 * Nodes live in one array (a freed node is reused); `prev`/`next` are node numbers, NIL
 * at the ends. The table maps a key to its node: open addressing, linear probing,
 * backward-shift deletion, an entry holding node number + 1 (0: empty), its home taken
 * from the node's cached hash. Keys compare by identity, then as bytes when both are
 * exact bytes (the store's keys), else by ==; a comparison that runs Python code may not
 * use the order it is comparing for (RuntimeError). */
#include "_native.h"

#define NIL UINT32_MAX
#define MAX_NODES (UINT32_MAX - 1)
#define ORDER_MIX 0x9E3779B97F4A7C15ULL

typedef struct {
    PyObject *key; /* owned; NULL while the node is free */
    Py_hash_t hash;
    uint32_t prev, next; /* a free node's next is the next free node */
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    uint32_t cap, used, free; /* nodes allocated, ever handed out, first free (NIL) */
    uint32_t head, tail;      /* oldest and newest, NIL when empty */
    uint32_t *table;
    size_t mask;
    Py_ssize_t len;
    int busy; /* inside a method: a reentrant call (from a key's __eq__) is refused */
} KeyOrder;

static size_t order_home(Py_hash_t h, size_t mask)
{
    uint64_t m = (uint64_t)h * ORDER_MIX;
    return (size_t)(m ^ (m >> 32)) & mask;
}

/* The table entry of node n (which is in the table): found without comparing keys. */
static size_t entry_of(const KeyOrder *q, uint32_t n)
{
    size_t i = order_home(q->nodes[n].hash, q->mask);
    while (q->table[i] != n + 1)
        i = (i + 1) & q->mask;
    return i;
}

/* Where an absent key of hash h goes: the first empty entry of its probe. */
static size_t empty_entry(const KeyOrder *q, Py_hash_t h)
{
    size_t i = order_home(h, q->mask);
    while (q->table[i])
        i = (i + 1) & q->mask;
    return i;
}

static int same_key(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    if (PyBytes_CheckExact(a) && PyBytes_CheckExact(b))
        return PyBytes_GET_SIZE(a) == PyBytes_GET_SIZE(b)
               && !memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                          (size_t)PyBytes_GET_SIZE(a));
    Py_INCREF(a);
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    Py_DECREF(a);
    return eq;
}

/* The table entry of `key` (1), or the empty entry where it would go (0); -1 on error. */
static int find(const KeyOrder *q, PyObject *key, Py_hash_t h, size_t *at)
{
    size_t i = order_home(h, q->mask);
    uint32_t e;
    while ((e = q->table[i])) {
        const Node *n = &q->nodes[e - 1];
        if (n->hash == h) {
            int eq = same_key(n->key, key);
            if (eq)
                return (*at = i, eq);
        }
        i = (i + 1) & q->mask;
    }
    *at = i;
    return 0;
}

static int grow_table(KeyOrder *q)
{
    size_t old_size = q->table ? q->mask + 1 : 0, size = old_size ? old_size * 2 : 64;
    uint32_t *old = q->table, *table = PyMem_Calloc(size, sizeof(uint32_t));
    if (!table) {
        PyErr_NoMemory();
        return -1;
    }
    q->table = table;
    q->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i])
            table[empty_entry(q, q->nodes[old[i] - 1].hash)] = old[i];
    }
    PyMem_Free(old);
    return 0;
}

/* Empties table entry i, moving back the entries after it in its run. */
static void clear_entry(KeyOrder *q, size_t i)
{
    size_t j = i;
    q->table[i] = 0;
    for (;;) {
        j = (j + 1) & q->mask;
        uint32_t e = q->table[j];
        if (!e)
            return;
        size_t k = order_home(q->nodes[e - 1].hash, q->mask);
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
            q->table[i] = e;
            q->table[j] = 0;
            i = j;
        }
    }
}

static void unlink_node(KeyOrder *q, uint32_t n)
{
    Node *node = &q->nodes[n];
    if (node->prev != NIL)
        q->nodes[node->prev].next = node->next;
    else
        q->head = node->next;
    if (node->next != NIL)
        q->nodes[node->next].prev = node->prev;
    else
        q->tail = node->prev;
}

static void link_newest(KeyOrder *q, uint32_t n)
{
    Node *node = &q->nodes[n];
    node->prev = q->tail;
    node->next = NIL;
    if (q->tail != NIL)
        q->nodes[q->tail].next = n;
    else
        q->head = n;
    q->tail = n;
}

/* A node for absent `key` (a new reference taken) at the new end; the table grows first
 * if it would be over half full. */
static int add_newest(KeyOrder *q, PyObject *key, Py_hash_t h)
{
    if ((size_t)(q->len + 1) * 2 > q->mask + 1 && grow_table(q) < 0)
        return -1;
    size_t at = empty_entry(q, h);
    uint32_t n = q->free;
    if (n != NIL) {
        q->free = q->nodes[n].next;
    } else {
        if (q->used == q->cap) {
            if (q->cap == MAX_NODES) {
                PyErr_SetString(PyExc_OverflowError, "KeyOrder: too many keys");
                return -1;
            }
            uint64_t want = q->cap ? (uint64_t)q->cap * 2 : 32;
            uint32_t cap = want > MAX_NODES ? MAX_NODES : (uint32_t)want;
            Node *nodes = PyMem_Realloc(q->nodes, (size_t)cap * sizeof(Node));
            if (!nodes) {
                PyErr_NoMemory();
                return -1;
            }
            q->nodes = nodes;
            q->cap = cap;
        }
        n = q->used++;
    }
    Py_INCREF(key);
    q->nodes[n].key = key;
    q->nodes[n].hash = h;
    link_newest(q, n);
    q->table[at] = n + 1;
    q->len++;
    return 0;
}

/* Removes node n and returns its key (the order's reference). */
static PyObject *remove_node(KeyOrder *q, uint32_t n)
{
    PyObject *key = q->nodes[n].key;
    unlink_node(q, n);
    clear_entry(q, entry_of(q, n));
    q->nodes[n].key = NULL;
    q->nodes[n].next = q->free;
    q->free = n;
    q->len--;
    return key;
}

/* The node of `key`, NIL if absent; -1 in *err on error. */
static uint32_t node_of(KeyOrder *q, PyObject *key, int *err)
{
    Py_hash_t h = PyObject_Hash(key);
    size_t at;
    int found = h == -1 ? -1 : q->table ? find(q, key, h, &at) : 0;
    if (found < 0)
        *err = -1;
    return found > 0 ? q->table[at] - 1 : NIL;
}

static int enter(KeyOrder *q)
{
    if (q->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "KeyOrder used from inside one of its own key comparisons");
        return -1;
    }
    q->busy = 1;
    return 0;
}

#define LEAVE(q, value) return ((q)->busy = 0, (value))

/* Adds `key` at the new end unless it is here; 1 if added, 0 if here, -1 on error. When
 * `move` is set, a key that is here moves to the new end. */
static int add_or_move(KeyOrder *q, PyObject *key, int move)
{
    Py_hash_t h = PyObject_Hash(key);
    if (h == -1)
        return -1;
    size_t at = 0;
    int found = q->table ? find(q, key, h, &at) : 0;
    if (found < 0)
        return -1;
    if (found) {
        if (move) {
            uint32_t n = q->table[at] - 1;
            if (n != q->tail) {
                unlink_node(q, n);
                link_newest(q, n);
            }
        }
        return 0;
    }
    return add_newest(q, key, h) < 0 ? -1 : 1;
}

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
    if (!seq || enter(q) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), done = 0;
    for (; done < n; done++) {
        int added = add_or_move(q, PySequence_Fast_GET_ITEM(seq, done), 0);
        if (added > 0)
            continue;
        if (!added)
            PyErr_SetString(PyExc_ValueError,
                            "push: a key is already in the order (push only absent keys, "
                            "each once; move_from moves keys)");
        for (; done > 0; done--) /* undo: the keys added are the newest */
            Py_DECREF(remove_node(q, q->tail));
        Py_DECREF(seq);
        LEAVE(q, NULL);
    }
    Py_DECREF(seq);
    q->busy = 0;
    Py_RETURN_NONE;
}

/* move_from(other, keys): each key to the new end here; a key here keeps its place in the
 * count, a key in `other` (another KeyOrder, or this one) leaves it, others are added. */
static PyObject *order_move_from(KeyOrder *q, PyObject *args)
{
    PyObject *other_obj, *keys;
    if (!PyArg_ParseTuple(args, "OO:move_from", &other_obj, &keys))
        return NULL;
    if (Py_TYPE(other_obj) != Py_TYPE(q)) {
        PyErr_SetString(PyExc_TypeError, "move_from: the other order must be a KeyOrder");
        return NULL;
    }
    KeyOrder *other = (KeyOrder *)other_obj;
    PyObject *seq = PySequence_Fast(keys, "move_from: a sequence of keys expected");
    if (!seq)
        return NULL;
    if (enter(q) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    if (other != q && enter(other) < 0) {
        q->busy = 0;
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(seq, i);
        int err = 0;
        uint32_t there = other != q ? node_of(other, key, &err) : NIL;
        ok = err == 0 && add_or_move(q, key, 1) >= 0;
        if (ok && there != NIL) /* here now: only then does it leave the other order */
            Py_DECREF(remove_node(other, there));
    }
    Py_DECREF(seq);
    other->busy = 0;
    q->busy = 0;
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* to_new_end(keys): each key to the new end, in order (a key not here is added). */
static PyObject *order_to_new_end(KeyOrder *q, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "to_new_end: a sequence of keys expected");
    if (!seq || enter(q) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (add_or_move(q, PySequence_Fast_GET_ITEM(seq, i), 1) < 0) {
            Py_DECREF(seq);
            LEAVE(q, NULL);
        }
    }
    Py_DECREF(seq);
    q->busy = 0;
    Py_RETURN_NONE;
}

/* take(keys) -> the keys found here, removed (a repeated key once). */
static PyObject *order_take(KeyOrder *q, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "take: a sequence of keys expected");
    if (!seq || enter(q) < 0) {
        Py_XDECREF(seq);
        return NULL;
    }
    PyObject *found = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; found && i < n; i++) {
        int err = 0;
        uint32_t node = node_of(q, PySequence_Fast_GET_ITEM(seq, i), &err);
        if (err < 0) {
            Py_CLEAR(found);
            break;
        }
        if (node == NIL)
            continue;
        PyObject *key = remove_node(q, node);
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
    if (enter(q) < 0)
        return NULL;
    int err = 0;
    uint32_t node = node_of(q, key, &err);
    if (err < 0)
        LEAVE(q, NULL);
    if (node == NIL) {
        PyErr_SetObject(PyExc_KeyError, key);
        LEAVE(q, NULL);
    }
    Py_DECREF(remove_node(q, node));
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
    if (guarded < 0 || enter(q) < 0)
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
        unlink_node(q, passed[p]);
        link_newest(q, passed[p]);
    }
    PyMem_Free(passed);
    for (Py_ssize_t i = 0; i < want; i++) /* now the n oldest are the chosen */
        PyList_SET_ITEM(out, i, remove_node(q, q->head));
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
    if (enter(q) < 0)
        return -1;
    int err = 0;
    uint32_t node = node_of(q, key, &err);
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
