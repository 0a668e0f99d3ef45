/* kvtier._native's shared declarations: the module (_native.c) and its copy loops
 * (_native_copy.c: copy over address tables; _native_lanes.c: copy_lanes and sorted_blocks
 * over a transfer batch; _native_plan.c: read_job over a transfer job;
 * _native_resp.c: recv_values, Redis values read into place; _native_offers.c: admission's
 * offer window; _native_order*.c: LRU's recency order). Built only by KVTIER_COMPILE=1
 * (setup.py, NATIVE). */
#ifndef KVTIER_NATIVE_H
#define KVTIER_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#define STREAM_BYTES 256    /* ranges this long are written with non-temporal stores */
#define PREFETCH_BYTES 65536 /* how far ahead of the copy its source is prefetched */

/* `obj` as a 1-D buffer of native int64 (numpy int64), else ValueError naming `name`. */
int int64_buffer(PyObject *obj, Py_buffer *view, const char *name);
/* A writable, aligned, non-negative one-element int64 (see copy); nothing for None. */
int cursor_buffer(PyObject *obj, Py_buffer *view, const char *fn);

/* Copies range i: len[i] bytes from address src[i] to dst[i], streaming stores, the
 * sources prefetched ahead; the caller fences (_mm_sfence) after its last call. */
void copy_ranges(const int64_t *dst, const int64_t *src, const int64_t *len, Py_ssize_t n);

PyObject *native_copy(PyObject *self, PyObject *args);
PyObject *native_copy_lanes(PyObject *self, PyObject *args);
PyObject *native_sorted_blocks(PyObject *self, PyObject *args);
PyObject *native_read_job(PyObject *self, PyObject *args);
PyObject *native_recv_values(PyObject *self, PyObject *args);
PyObject *native_offer_fingerprints(PyObject *self, PyObject *keys);
extern PyTypeObject OfferCountsType;
extern PyTypeObject KeyOrderType;

#endif
