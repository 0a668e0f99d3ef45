/* kvtier._native.KeyOrder, shared between its table and list (_native_order_core.c) and
 * its methods (_native_order.c): LRU's recency order, kvtier.store.policies.queue.KeyQueue's
 * interface and behaviour, as a doubly linked list of nodes, oldest first, indexed by a
 * hash table of its own. A move to the new end relinks one node: nothing is left behind,
 * so nothing is ever compacted, and no Python object is made per key. */
#ifndef KVTIER_NATIVE_ORDER_H
#define KVTIER_NATIVE_ORDER_H

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

/* Returns `value` from a method after marking the order free again (see order_enter). */
#define LEAVE(q, value) return ((q)->busy = 0, (value))

size_t order_home(Py_hash_t h, size_t mask);
/* Marks the order busy; -1 (RuntimeError) if it already is: a reentrant call. */
int order_enter(KeyOrder *q);
/* Adds `key` at the new end unless it is here (1 if added, 0 if here, -1 on error); with
 * `move`, a key that is here moves to the new end. */
int order_add_or_move(KeyOrder *q, PyObject *key, int move);
/* The node of `key`, NIL if absent; -1 in *err on error. */
uint32_t order_node_of(KeyOrder *q, PyObject *key, int *err);
/* Removes node n and returns its key (the order's reference). */
PyObject *order_remove_node(KeyOrder *q, uint32_t n);
void order_unlink(KeyOrder *q, uint32_t n);
void order_link_newest(KeyOrder *q, uint32_t n);

#endif
