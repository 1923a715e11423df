/* The resolver's passes over whole columns of a batch, without the GIL (see cltrace.timeline.passes).
 *
 * Arrays in, arrays out (any contiguous buffer; ``passes.py`` passes numpy arrays):
 *   group(keys, width, first, inverse) -> m
 *       keys int64[width, n]: rows grouped by their tuple of ``width`` keys, groups numbered in order of
 *       first appearance; first[g] (int64, m used) is a group's first row, inverse[i] (int64) a row's group.
 *   first_fit(starts, ends, lane_ends, used, lanes) -> used
 *       commands in start order, each on the first lane free at its start; lane_ends (int64, room for
 *       used + n) holds the end of the last command on each lane and is updated; lanes[i] (int64) out.
 *   Extents()                          the device extents of children whose parent is not resolved yet,
 *                                      per (parent id, device track), kept from batch to batch
 *     .nest(kind, ids, parent, track, off, off_end, raw_start, raw_end)
 *       widens regions' raw_start/raw_end (in place) to their children's: leaves (kind 1) pass their
 *       extents to their parent; regions (kind 2 placed, 3 not placed), in record order, take their own
 *       children's extents (placed ones widen, then pass theirs up).
 *     len(extents)                     (parent, track) extents kept
 *
 * Everything but argument parsing runs with the GIL released; an Extents object is used by one
 * thread at a time (its own lock).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "pythread.h"
#include <stdint.h>
#include <string.h>

static uint64_t
mix(uint64_t x)
{ /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static int
buffers_ok(const char *fn, Py_buffer *b, const Py_ssize_t *len, int k)
{
    for (int i = 0; i < k; i++) {
        if (b[i].len != len[i] * (Py_ssize_t)sizeof(int64_t)) {
            PyErr_Format(PyExc_ValueError, "%s: argument %d holds %zd bytes, need int64[%zd]", fn, i + 1, b[i].len,
                         len[i]);
            return 0;
        }
    }
    return 1;
}

static void
release(Py_buffer *b, int k)
{
    for (int i = 0; i < k; i++)
        PyBuffer_Release(&b[i]);
}

/* --- group ------------------------------------------------------------------------------------ */

static PyObject *
resolve_group(PyObject *self, PyObject *args)
{
    Py_buffer b[3];
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*nw*w*:group", &b[0], &width, &b[1], &b[2]))
        return NULL;
    Py_ssize_t n = b[1].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t len[3] = {width * n, n, n};
    if (width < 1 || !buffers_ok("group", b, len, 3)) {
        if (width < 1)
            PyErr_SetString(PyExc_ValueError, "group: width must be at least 1");
        release(b, 3);
        return NULL;
    }
    const int64_t *keys = (const int64_t *)b[0].buf;
    int64_t *first = (int64_t *)b[1].buf, *inverse = (int64_t *)b[2].buf;
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap <<= 1;
    int64_t *slot = PyMem_RawMalloc(cap * sizeof(int64_t)); /* group + 1, 0: empty */
    if (slot == NULL) {
        release(b, 3);
        return PyErr_NoMemory();
    }
    Py_ssize_t m = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(slot, 0, cap * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h = 0;
        for (Py_ssize_t w = 0; w < width; w++)
            h = mix(h ^ (uint64_t)keys[w * n + i]);
        size_t s = (size_t)h & (cap - 1);
        for (;;) {
            int64_t g = slot[s];
            if (g == 0) {
                slot[s] = m + 1;
                first[m] = i;
                inverse[i] = m++;
                break;
            }
            Py_ssize_t r = (Py_ssize_t)first[g - 1], w = 0;
            while (w < width && keys[w * n + r] == keys[w * n + i])
                w++;
            if (w == width) {
                inverse[i] = g - 1;
                break;
            }
            s = (s + 1) & (cap - 1);
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(slot);
    release(b, 3);
    return PyLong_FromSsize_t(m);
}

/* --- first_fit -------------------------------------------------------------------------------- */

static PyObject *
resolve_first_fit(PyObject *self, PyObject *args)
{
    Py_buffer b[4];
    Py_ssize_t used;
    if (!PyArg_ParseTuple(args, "y*y*w*nw*:first_fit", &b[0], &b[1], &b[2], &used, &b[3]))
        return NULL;
    Py_ssize_t n = b[0].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t room = b[2].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t len[4] = {n, n, room, n};
    if (!buffers_ok("first_fit", b, len, 4) || used < 0 || room < used + n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "first_fit: lane_ends holds %zd lanes, need used + n = %zd", room, used + n);
        release(b, 4);
        return NULL;
    }
    const int64_t *s = (const int64_t *)b[0].buf, *e = (const int64_t *)b[1].buf;
    int64_t *ends = (int64_t *)b[2].buf, *lanes = (int64_t *)b[3].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = 0;
        while (j < used && ends[j] > s[i])
            j++;
        if (j == used)
            used++;
        ends[j] = e[i];
        lanes[i] = j;
    }
    Py_END_ALLOW_THREADS
    release(b, 4);
    return PyLong_FromSsize_t(used);
}

/* --- Extents ---------------------------------------------------------------------------------- */

enum { EMPTY, LIVE, GONE };

typedef struct {
    int64_t parent, track, lo, hi;
    int64_t state;
} entry;

/* Open addressing on the parent id alone, linear probing: every entry of one parent lies between its
 * home slot and the next empty slot, so a parent's entries on all tracks are found (and popped) in
 * one scan. Removed entries stay as GONE until the next rebuild. */
typedef struct {
    PyObject_HEAD
    entry *slots;
    size_t cap, live, used; /* used: LIVE + GONE */
    PyThread_type_lock lock;
} Extents;

static int
rebuild(Extents *x, size_t cap)
{
    entry *old = x->slots;
    size_t oldcap = x->cap;
    entry *slots = PyMem_RawCalloc(cap, sizeof(entry));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i].state != LIVE)
            continue;
        size_t s = (size_t)mix((uint64_t)old[i].parent) & (cap - 1);
        while (slots[s].state != EMPTY)
            s = (s + 1) & (cap - 1);
        slots[s] = old[i];
    }
    PyMem_RawFree(old);
    x->slots = slots;
    x->cap = cap;
    x->used = x->live;
    return 0;
}

/* Widen (parent, track)'s extent to [lo, hi], adding it where there is none. */
static int
merge(Extents *x, int64_t parent, int64_t track, int64_t lo, int64_t hi)
{
    if (2 * (x->used + 1) > x->cap) {
        size_t cap = 64;
        while (cap < 4 * (x->live + 1))
            cap <<= 1;
        if (rebuild(x, cap) < 0)
            return -1;
    }
    size_t mask = x->cap - 1, s = (size_t)mix((uint64_t)parent) & mask, free_at = (size_t)-1;
    for (;; s = (s + 1) & mask) {
        entry *e = &x->slots[s];
        if (e->state == EMPTY)
            break;
        if (e->state == GONE) {
            if (free_at == (size_t)-1)
                free_at = s;
        } else if (e->parent == parent && e->track == track) {
            if (lo < e->lo)
                e->lo = lo;
            if (hi > e->hi)
                e->hi = hi;
            return 0;
        }
    }
    if (free_at == (size_t)-1) {
        free_at = s;
        x->used++;
    }
    entry *e = &x->slots[free_at];
    e->parent = parent;
    e->track = track;
    e->lo = lo;
    e->hi = hi;
    e->state = LIVE;
    x->live++;
    return 0;
}

/* Remove every extent of ``parent``; 1 with [lo, hi] set where it had one on ``track``. */
static int
pop(Extents *x, int64_t parent, int64_t track, int64_t *lo, int64_t *hi)
{
    if (x->live == 0)
        return 0;
    size_t mask = x->cap - 1, s = (size_t)mix((uint64_t)parent) & mask;
    int found = 0;
    for (; x->slots[s].state != EMPTY; s = (s + 1) & mask) {
        entry *e = &x->slots[s];
        if (e->state == LIVE && e->parent == parent) {
            if (e->track == track) {
                *lo = e->lo;
                *hi = e->hi;
                found = 1;
            }
            e->state = GONE;
            x->live--;
        }
    }
    return found;
}

static int
nest_rows(Extents *x, Py_ssize_t n, const int64_t *kind, const int64_t *ids, const int64_t *parent,
          const int64_t *track, const int64_t *off, const int64_t *off_end, int64_t *rs, int64_t *re)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (kind[i] == 1 && merge(x, parent[i], track[i], rs[i] - off[i], re[i] - off_end[i]) < 0)
            return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kind[i] != 2 && kind[i] != 3)
            continue;
        int64_t lo, hi;
        int had = pop(x, ids[i], track[i], &lo, &hi);
        if (kind[i] == 3)
            continue;
        if (had) {
            if (lo + off[i] < rs[i])
                rs[i] = lo + off[i];
            if (hi + off_end[i] > re[i])
                re[i] = hi + off_end[i];
        }
        if (parent[i] && merge(x, parent[i], track[i], rs[i] - off[i], re[i] - off_end[i]) < 0)
            return -1;
    }
    return 0;
}

static PyObject *
extents_nest(Extents *x, PyObject *args)
{
    Py_buffer b[8];
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*w*w*:nest", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7]))
        return NULL;
    Py_ssize_t n = b[0].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t len[8] = {n, n, n, n, n, n, n, n};
    if (!buffers_ok("nest", b, len, 8)) {
        release(b, 8);
        return NULL;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(x->lock, WAIT_LOCK);
    err = nest_rows(x, n, b[0].buf, b[1].buf, b[2].buf, b[3].buf, b[4].buf, b[5].buf, b[6].buf, b[7].buf);
    PyThread_release_lock(x->lock);
    Py_END_ALLOW_THREADS
    release(b, 8);
    if (err < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static Py_ssize_t
extents_len(Extents *x)
{
    return (Py_ssize_t)x->live;
}

static PyObject *
extents_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Extents() takes no arguments");
        return NULL;
    }
    Extents *x = (Extents *)type->tp_alloc(type, 0);
    if (x == NULL)
        return NULL;
    x->lock = PyThread_allocate_lock();
    if (x->lock == NULL) {
        Py_DECREF(x);
        return PyErr_NoMemory();
    }
    return (PyObject *)x;
}

static void
extents_dealloc(Extents *x)
{
    PyMem_RawFree(x->slots);
    if (x->lock != NULL)
        PyThread_free_lock(x->lock);
    Py_TYPE(x)->tp_free((PyObject *)x);
}

static PyMethodDef extents_methods[] = {
    {"nest", (PyCFunction)extents_nest, METH_VARARGS,
     "nest(kind, ids, parent, track, off, off_end, raw_start, raw_end): widen regions to their children."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods extents_seq = {.sq_length = (lenfunc)extents_len};

static PyTypeObject ExtentsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cltrace.timeline._resolve.Extents",
    .tp_basicsize = sizeof(Extents),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Device extents of children whose parent is not resolved yet, per (parent id, device track).",
    .tp_new = extents_new,
    .tp_dealloc = (destructor)extents_dealloc,
    .tp_methods = extents_methods,
    .tp_as_sequence = &extents_seq,
};

static PyMethodDef methods[] = {
    {"group", resolve_group, METH_VARARGS, "group(keys, width, first, inverse) -> m: rows grouped by their keys."},
    {"first_fit", resolve_first_fit, METH_VARARGS,
     "first_fit(starts, ends, lane_ends, used, lanes) -> used: commands on the first free lane."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace.timeline._resolve",
    "The resolver's passes over whole columns, without the GIL (see cltrace.timeline.passes).", -1, methods,
};

PyMODINIT_FUNC
PyInit__resolve(void)
{
    if (PyType_Ready(&ExtentsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ExtentsType);
    if (PyModule_AddObject(m, "Extents", (PyObject *)&ExtentsType) < 0) {
        Py_DECREF(&ExtentsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
