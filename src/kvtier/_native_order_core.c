/* kvtier._native.KeyOrder's table and list (_native_order.h says what it is).
 *
 * Nodes live in one array (a freed node is reused); `prev`/`next` are node numbers, NIL
 * at the ends. The table maps a key to its node: open addressing, linear probing,
 * backward-shift deletion, an entry holding node number + 1 (0: empty), its home taken
 * from the node's cached hash. Keys compare by identity, then as bytes when both are
 * exact bytes (the store's keys), else by ==; a comparison that runs Python code may not
 * use the order it is comparing for (RuntimeError). */
#include "_native_order.h"

size_t order_home(Py_hash_t h, size_t mask)
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

void order_unlink(KeyOrder *q, uint32_t n)
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

void order_link_newest(KeyOrder *q, uint32_t n)
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
    order_link_newest(q, n);
    q->table[at] = n + 1;
    q->len++;
    return 0;
}

/* Removes node n and returns its key (the order's reference). */
PyObject *order_remove_node(KeyOrder *q, uint32_t n)
{
    PyObject *key = q->nodes[n].key;
    order_unlink(q, n);
    clear_entry(q, entry_of(q, n));
    q->nodes[n].key = NULL;
    q->nodes[n].next = q->free;
    q->free = n;
    q->len--;
    return key;
}

/* The node of `key`, NIL if absent; -1 in *err on error. */
uint32_t order_node_of(KeyOrder *q, PyObject *key, int *err)
{
    Py_hash_t h = PyObject_Hash(key);
    size_t at;
    int found = h == -1 ? -1 : q->table ? find(q, key, h, &at) : 0;
    if (found < 0)
        *err = -1;
    return found > 0 ? q->table[at] - 1 : NIL;
}

int order_enter(KeyOrder *q)
{
    if (q->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "KeyOrder used from inside one of its own key comparisons");
        return -1;
    }
    q->busy = 1;
    return 0;
}


/* Adds `key` at the new end unless it is here; 1 if added, 0 if here, -1 on error. When
 * `move` is set, a key that is here moves to the new end. */
int order_add_or_move(KeyOrder *q, PyObject *key, int move)
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
                order_unlink(q, n);
                order_link_newest(q, n);
            }
        }
        return 0;
    }
    return add_newest(q, key, h) < 0 ? -1 : 1;
}
