/* kvtier._native: the two loops of kvtier that Python cannot run at memory speed.
 *
 * Built only in the compiled build (KVTIER_COMPILE=1, see setup.py); every caller falls back
 * to its pure-Python path when this module is missing, and both paths give the same bytes.
 *
 *   copy(dst, src, lengths[, cursor, grain])
 *                             Batched memcpy: entry i copies lengths[i] bytes from address
 *                             src[i] to address dst[i]. The three arguments are contiguous
 *                             buffers of 8-byte integers (numpy int64 arrays). The caller
 *                             has checked every address (kvtier.transfer.plan); the GIL is
 *                             released while the bytes move. With `cursor` (a writable
 *                             one-element int64 array, zero at first) several threads share
 *                             one copy: each calls copy with the same arrays and cursor, and
 *                             takes the next `grain` entries at a time until none are left,
 *                             so a thread that starts late takes fewer, never delays the rest.
 *
 *   copy_lanes(to_kv, blocks, lanes[, cursor, grain])
 *                             One batch of the transfer engine in one call: the byte ranges
 *                             are computed here from the batch's blocks (sorted_blocks) and
 *                             per-(layer, piece) lanes (kvtier.transfer.native, Lanes), not
 *                             read from address tables. Each lane's ranges move in the order
 *                             of `blocks`, ascending engine block, so that the engine's memory
 *                             (scattered blocks, small pages) is read or written in one
 *                             monotone sweep per lane. `cursor` and `grain` as for copy, in
 *                             (lane, block) items.
 *
 *   sorted_blocks(ids, ptrs, bound)
 *                             A batch's blocks (ids: int64 [positions x copies], each in
 *                             [0, bound); ptrs: each copy's slot address) sorted by engine
 *                             block id, stably, as a bytearray of int64 triples (id, slot
 *                             address, position): a counting sort when the ids are dense in
 *                             [0, bound), else a merge sort.
 *
 *   read_job(copies, kind, num_blocks, per_slot, slab_rows, slab_ptr, row_bytes, load)
 *                             A job's copies (a list of `kind`: kvtier.transfer.ChunkCopy)
 *                             read and checked in one pass (_native_plan.c): (table,
 *                             slots_are_ints, slots, bad, batch, repeated). The table is a
 *                             bytearray of int64: every copy's group, then every first_block,
 *                             every block count, every slot (0 where it is not a row index in
 *                             int64: then slots_are_ints is false), whether each copy's block
 *                             ids are consecutive (1 or 0), then every block id in copy
 *                             order; slots the list of the copies' slots. Checked against
 *                             num_blocks and per_slot (int64, one entry per group: its engine
 *                             blocks and the blocks of one chunk) and the registered slab
 *                             (slab_rows rows of row_bytes at slab_ptr; 0 rows: none): bad,
 *                             the first copy whose group, chunk positions or block ids are
 *                             out of range, else -1; repeated (only where bad is -1), for a
 *                             load (`load` true) whether an engine block is written twice,
 *                             for a store whether a slab row is named twice: 1 or 0, or -1
 *                             where not known; batch, where the job is one batch (every copy
 *                             of one group, shape and run flag, slots ascending slab rows)
 *                             that passed every check (bad -1, repeated 0), its block ids
 *                             [positions x copies] then its slot addresses, as a bytearray of
 *                             int64, else None. None where a copy is not a `kind` or a field
 *                             not what one holds (the caller then reads the copies in Python,
 *                             which says what is wrong).
 *
 *   recv_values(fd, timeout_s, pending, views, head, sends)
 *                             The replies of pipelined Redis GETs, each value received
 *                             straight into its view with the GIL released, sends[i] written
 *                             once reply i is taken (_native_resp.c).
 *
 *   cpu()                     The CPU the calling thread runs on (sched_getcpu), or -1
 *                             where the system cannot say.
 *
 *   sha256_blocks(prefix, heads, start, end, first, width, unit)
 *                             kvtier.replay.refs.ReplayChain's digests: for every multiple t
 *                             of `unit` in (start, end], in block b = (t - 1) // width,
 *                             sha256(P_b || head_b[:4 * min(off, 2)] || off as 8 bytes LE),
 *                             off = t - b * width; head_b is heads[8 * (b - first):][:8], P
 *                             is `prefix` for block `first` and the digest at each block's
 *                             end after it. Returns (digests, P at `end`'s block).
 *
 *   prefixed(prefix, items)   [prefix + item for item in items], for a list of bytes: a
 *                             group's keys from the spine's digests (kvtier.keys).
 *
 *   sha256_start(seed)        A fresh SHA-256 state that has absorbed `seed`, as a bytearray.
 *   sha256_spine(state, data, filled, step)
 *                             Feeds `data` into `state` (updated in place), reading the
 *                             digest each time the stream reaches a multiple of `step` bytes;
 *                             `filled` is how many bytes of the current step were fed before.
 *                             Returns (digests, filled). The digests equal hashlib.sha256's
 *                             over the same stream (tests/test_native.py).
 *
 * SHA-256 is OpenSSL's (the library CPython's hashlib uses): its state is a plain struct, so
 * reading a digest mid-stream is a struct copy and a final block, not the allocation and
 * context copy each hashlib `digest()` costs.
 */
#include "_native.h"
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_Init & co: the copyable state we need */
#include <openssl/sha.h>
#include <sched.h> /* sched_getcpu: Python.h defines _GNU_SOURCE */

#define GIL_FREE_BYTES (64 * 1024) /* hash at least this much without the GIL */

static PyObject *
native_cpu(PyObject *self, PyObject *unused)
{
#if defined(__linux__)
    return PyLong_FromLong(sched_getcpu());
#else
    return PyLong_FromLong(-1);
#endif
}

static PyObject *
native_sha256_start(PyObject *self, PyObject *args)
{
    Py_buffer seed;
    if (!PyArg_ParseTuple(args, "y*:sha256_start", &seed))
        return NULL;
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, seed.buf, (size_t)seed.len);
    PyBuffer_Release(&seed);
    return PyByteArray_FromStringAndSize((const char *)&ctx, sizeof ctx);
}

/* A bytearray of a SHA-256 state's size whose buffered-byte count and digest length are
 * what sha256_start and SHA256_Update leave: OpenSSL trusts both, and a forged count would
 * make its next update write past the state. */
static int
valid_state(PyObject *obj)
{
    if (!PyByteArray_Check(obj) || PyByteArray_GET_SIZE(obj) != (Py_ssize_t)sizeof(SHA256_CTX))
        return 0;
    SHA256_CTX ctx;
    memcpy(&ctx, PyByteArray_AS_STRING(obj), sizeof ctx);
    return ctx.num < SHA256_CBLOCK && ctx.md_len == SHA256_DIGEST_LENGTH;
}

static PyObject *
native_sha256_spine(PyObject *self, PyObject *args)
{
    PyObject *state_obj;
    Py_buffer data;
    Py_ssize_t filled, step;
    if (!PyArg_ParseTuple(args, "Oy*nn:sha256_spine", &state_obj, &data, &filled, &step))
        return NULL;
    if (!valid_state(state_obj)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "sha256_spine: state must come from sha256_start");
        return NULL;
    }
    if (step <= 0 || filled < 0 || filled >= step) {
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_ValueError, "sha256_spine: need 0 <= filled < step, got %zd, %zd",
                     filled, step);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)data.buf;
    Py_ssize_t n = data.len, first = step - filled;
    Py_ssize_t count = n < first ? 0 : 1 + (n - first) / step;
    unsigned char *out = count ? PyMem_Malloc((size_t)count * SHA256_DIGEST_LENGTH) : NULL;
    if (count && out == NULL) {
        PyBuffer_Release(&data);
        return PyErr_NoMemory();
    }
    SHA256_CTX ctx;
    memcpy(&ctx, PyByteArray_AS_STRING(state_obj), sizeof ctx);
    Py_ssize_t pos = 0;
    /* Long feeds (a prompt) hash without the GIL; short ones (decoding) keep it. */
    PyThreadState *released = n >= GIL_FREE_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t upto = k == 0 ? first : pos + step;
        SHA256_Update(&ctx, p + pos, (size_t)(upto - pos));
        SHA256_CTX done = ctx;
        SHA256_Final(out + k * SHA256_DIGEST_LENGTH, &done);
        pos = upto;
    }
    SHA256_Update(&ctx, p + pos, (size_t)(n - pos));
    if (released != NULL)
        PyEval_RestoreThread(released);
    if (PyByteArray_GET_SIZE(state_obj) != (Py_ssize_t)sizeof ctx) {
        PyBuffer_Release(&data);
        PyMem_Free(out);
        PyErr_SetString(PyExc_RuntimeError, "sha256_spine: the state was resized meanwhile");
        return NULL;
    }
    memcpy(PyByteArray_AS_STRING(state_obj), &ctx, sizeof ctx);
    PyBuffer_Release(&data);
    Py_ssize_t now = count ? n - pos : filled + n;

    PyObject *digests = PyList_New(count);
    if (digests == NULL) {
        PyMem_Free(out);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *d = PyBytes_FromStringAndSize(
            (const char *)out + k * SHA256_DIGEST_LENGTH, SHA256_DIGEST_LENGTH);
        if (d == NULL) {
            Py_DECREF(digests);
            PyMem_Free(out);
            return NULL;
        }
        PyList_SET_ITEM(digests, k, d);
    }
    PyMem_Free(out);
    return Py_BuildValue("(Nn)", digests, now);
}

/* The digest at offset `off` of a block: P || the head's first min(off, 2) tokens || off. */
static void
block_digest(const unsigned char *prefix, const unsigned char *head, Py_ssize_t off,
             unsigned char *out)
{
    unsigned char buf[SHA256_DIGEST_LENGTH + 16];
    size_t used = SHA256_DIGEST_LENGTH + (size_t)(off < 2 ? 4 * off : 8);
    memcpy(buf, prefix, SHA256_DIGEST_LENGTH);
    memcpy(buf + SHA256_DIGEST_LENGTH, head, used - SHA256_DIGEST_LENGTH);
    for (int k = 0; k < 8; k++)
        buf[used + (size_t)k] = (unsigned char)(((unsigned long long)off >> (8 * k)) & 0xff);
    SHA256_CTX ctx; /* not SHA256(): OpenSSL 3 looks the algorithm up on every call */
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, buf, used + 8);
    SHA256_Final(out, &ctx);
}

static PyObject *
native_sha256_blocks(PyObject *self, PyObject *args)
{
    Py_buffer prefix, heads;
    Py_ssize_t start, end, first, width, unit;
    if (!PyArg_ParseTuple(args, "y*y*nnnnn:sha256_blocks", &prefix, &heads, &start, &end,
                          &first, &width, &unit))
        return NULL;
    PyObject *digests = NULL;
    const Py_ssize_t limit = PY_SSIZE_T_MAX / 4;
    if (prefix.len != SHA256_DIGEST_LENGTH || width <= 0 || width > limit || unit <= 0
        || unit > limit || first < 0
        || first > limit / width || start < first * width || start >= (first + 1) * width
        || end <= start || end > limit) {
        PyErr_SetString(PyExc_ValueError, "sha256_blocks: need a 32-byte prefix, width > 0, "
                        "unit > 0 and first * width <= start < (first + 1) * width, start < end");
        goto done;
    }
    if ((heads.len / 8) < (end - 1) / width - first + 1) {
        PyErr_SetString(PyExc_ValueError, "sha256_blocks: need 8 head bytes per block");
        goto done;
    }
    digests = PyList_New(end / unit - start / unit);
    if (digests == NULL)
        goto done;
    unsigned char carry[SHA256_DIGEST_LENGTH], d[SHA256_DIGEST_LENGTH];
    memcpy(carry, prefix.buf, SHA256_DIGEST_LENGTH);
    const unsigned char *head = (const unsigned char *)heads.buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t b0 = first * width; b0 < end; b0 += width, head += 8) {
        Py_ssize_t block_end = b0 + width, stop = end < block_end ? end : block_end;
        Py_ssize_t t = ((start > b0 ? start : b0) / unit + 1) * unit;
        for (; t <= stop; t += unit) {
            block_digest(carry, head, t - b0, d);
            PyObject *item = PyBytes_FromStringAndSize((const char *)d, SHA256_DIGEST_LENGTH);
            if (item == NULL) {
                Py_CLEAR(digests);
                goto done;
            }
            PyList_SET_ITEM(digests, k++, item);
        }
        if (stop == block_end) { /* the block is whole: its end's digest carries on */
            if (block_end % unit == 0)
                memcpy(carry, d, SHA256_DIGEST_LENGTH); /* just read at t == block_end */
            else
                block_digest(carry, head, width, carry);
        }
    }
    PyObject *result = Py_BuildValue("(Ny#)", digests, (const char *)carry,
                                     (Py_ssize_t)SHA256_DIGEST_LENGTH);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&heads);
    return result;
done:
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&heads);
    return digests;
}

static PyObject *
native_prefixed(PyObject *self, PyObject *args)
{
    Py_buffer prefix;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "y*O!:prefixed", &prefix, &PyList_Type, &items))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "prefixed: item %zd is not bytes", i);
            Py_CLEAR(out);
            break;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(item);
        PyObject *joined = PyBytes_FromStringAndSize(NULL, prefix.len + size);
        if (joined == NULL) {
            Py_CLEAR(out);
            break;
        }
        memcpy(PyBytes_AS_STRING(joined), prefix.buf, (size_t)prefix.len);
        memcpy(PyBytes_AS_STRING(joined) + prefix.len, PyBytes_AS_STRING(item), (size_t)size);
        PyList_SET_ITEM(out, i, joined);
    }
    PyBuffer_Release(&prefix);
    return out;
}

static PyMethodDef methods[] = {
    {"copy", native_copy, METH_VARARGS,
     "copy(dst, src, lengths[, cursor, grain]): batched memcpy over int64 address arrays "
     "(GIL released); threads sharing `cursor` take `grain` entries at a time."},
    {"copy_lanes", native_copy_lanes, METH_VARARGS,
     "copy_lanes(to_kv, blocks, lanes[, cursor, grain]): one transfer batch, its ranges "
     "computed from its sorted blocks, each lane in their order."},
    {"sorted_blocks", native_sorted_blocks, METH_VARARGS,
     "sorted_blocks(ids, ptrs, bound) -> bytearray of int64 (id, slot, position) triples, "
     "by engine block id."},
    {"read_job", native_read_job, METH_VARARGS,
     "read_job(copies, kind, num_blocks, per_slot, slab_rows, slab_ptr, row_bytes, load) -> "
     "(table, slots_are_ints, slots, bad, batch, repeated) or None: a job's copies as int64, "
     "checked."},
    {"cpu", native_cpu, METH_NOARGS,
     "cpu() -> int: the CPU the calling thread runs on, or -1 where unknown."},
    {"sha256_start", native_sha256_start, METH_VARARGS,
     "sha256_start(seed) -> bytearray: a SHA-256 state that has absorbed seed."},
    {"sha256_spine", native_sha256_spine, METH_VARARGS,
     "sha256_spine(state, data, filled, step) -> (digests, filled)."},
    {"sha256_blocks", native_sha256_blocks, METH_VARARGS,
     "sha256_blocks(prefix, heads, start, end, first, width, unit) -> (digests, prefix)."},
    {"prefixed", native_prefixed, METH_VARARGS,
     "prefixed(prefix, items) -> [prefix + item for item in items] (items: a list of bytes)."},
    {"recv_values", native_recv_values, METH_VARARGS,
     "recv_values(fd, timeout_s, pending, views, head, sends) -> (heads, bodies, leftover): "
     "the replies of pipelined GETs read into views with the GIL released, sends[i] written "
     "once reply i is taken (_native_resp.c)."},
    {"offer_fingerprints", native_offer_fingerprints, METH_O,
     "offer_fingerprints(keys) -> bytes: kvtier.store.offers.fingerprint of each key, "
     "8 bytes each (_native_offers.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvtier._native",
    "Batched byte copies, SHA-256 prefix digests, Redis values read into place, admission's offer counts and LRU's recency order (compiled build only).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&OfferCountsType) < 0 || PyType_Ready(&KeyOrderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "OfferCounts", (PyObject *)&OfferCountsType) < 0
              || PyModule_AddObjectRef(m, "KeyOrder", (PyObject *)&KeyOrderType) < 0))
        Py_CLEAR(m);
    return m;
}
