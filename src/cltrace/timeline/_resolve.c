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
#include "../_ext.h"
#include "pythread.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "../_mix.h"

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

/* Remove every extent of ``from``: the one on track ``own`` into [lo, hi] (*had set), the others moved to
 * ``to`` where it is not 0 (a region's descendants on other tracks than its own, or on every track where it has
 * no device span: they count for its parent). */
static int
take(Extents *x, int64_t from, int64_t own, int64_t to, int64_t *lo, int64_t *hi, int *had)
{
    *had = 0;
    if (x->live == 0)
        return 0;
    entry moved[16];
    size_t k = 0, mask = x->cap - 1, s = (size_t)mix((uint64_t)from) & mask;
    int more = 0;
    for (; x->slots[s].state != EMPTY; s = (s + 1) & mask) {
        entry *e = &x->slots[s];
        if (e->state != LIVE || e->parent != from)
            continue;
        if (e->track == own) {
            *lo = e->lo;
            *hi = e->hi;
            *had = 1;
        } else if (to) {
            if (k == 16) { /* more tracks than this holds: the rest in another pass */
                more = 1;
                continue;
            }
            moved[k++] = *e;
        }
        e->state = GONE;
        x->live--;
    }
    for (size_t j = 0; j < k; j++)
        if (merge(x, to, moved[j].track, moved[j].lo, moved[j].hi) < 0)
            return -1;
    if (more) {
        int64_t l2, h2;
        int h;
        return take(x, from, INT64_MIN, to, &l2, &h2, &h);
    }
    return 0;
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
        int had;
        if (take(x, ids[i], kind[i] == 2 ? track[i] : INT64_MIN, parent[i], &lo, &hi, &had) < 0)
            return -1;
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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cltrace._ext.resolve.Extents",
    .tp_basicsize = sizeof(Extents),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Device extents of children whose parent is not resolved yet, per (parent id, device track).",
    .tp_new = extents_new,
    .tp_dealloc = (destructor)extents_dealloc,
    .tp_methods = extents_methods,
    .tp_as_sequence = &extents_seq,
};

/* --- the tail: a batch's final columns (see Resolver._native_columns) ---------------------------- */

/* The first pass's int64 rows and flag bits (cltrace.timeline.stamps: C_*, F_*). */
enum { G_THREAD, G_SITE, G_QUEUE, G_PATH, N_GROUPS };              /* scan's groupings */
enum { Q_CMDS, Q_CMD_MAX, Q_REGIONS, Q_REGION_MAX, N_QSTATS };      /* per queue group */
#define RAW(i, k) raw[4 * (i) + (k)]                                  /* QUEUED, SUBMIT, START, END */

/* Rows grouped by a pair of int64 keys, groups numbered in order of first appearance; a run of rows with
 * the key of the row before costs one comparison. */
typedef struct {
    int32_t *slot; /* group + 1, 0: empty */
    size_t cap;    /* a power of two, more than twice the groups */
    int64_t *ka, *kb, *first, *stat;
    Py_ssize_t m, room;
    int64_t la, lb;
    int32_t lg; /* the last key's group, -1: none */
} grouper;

static void
grouper_free(grouper *g)
{
    PyMem_RawFree(g->slot);
    PyMem_RawFree(g->ka);
    PyMem_RawFree(g->kb);
    PyMem_RawFree(g->first);
    PyMem_RawFree(g->stat);
    memset(g, 0, sizeof(*g));
}

static int
grouper_room(grouper *g, Py_ssize_t room, int stats)
{
    int64_t *ka = PyMem_RawRealloc(g->ka, room * sizeof(int64_t)), *kb, *first, *stat = NULL;
    if (ka == NULL)
        return -1;
    g->ka = ka;
    if ((kb = PyMem_RawRealloc(g->kb, room * sizeof(int64_t))) == NULL)
        return -1;
    g->kb = kb;
    if ((first = PyMem_RawRealloc(g->first, room * sizeof(int64_t))) == NULL)
        return -1;
    g->first = first;
    if (stats) {
        if ((stat = PyMem_RawRealloc(g->stat, room * N_QSTATS * sizeof(int64_t))) == NULL)
            return -1;
        g->stat = stat;
    }
    g->room = room;
    return 0;
}

static int
grouper_rehash(grouper *g, size_t cap)
{
    int32_t *slot = PyMem_RawCalloc(cap, sizeof(int32_t));
    if (slot == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < g->m; k++) {
        size_t s = (size_t)mix(mix((uint64_t)g->ka[k]) ^ (uint64_t)g->kb[k]) & (cap - 1);
        while (slot[s])
            s = (s + 1) & (cap - 1);
        slot[s] = (int32_t)(k + 1);
    }
    PyMem_RawFree(g->slot);
    g->slot = slot;
    g->cap = cap;
    return 0;
}

static int
grouper_init(grouper *g, int stats)
{
    memset(g, 0, sizeof(*g));
    g->lg = -1;
    if (grouper_rehash(g, 64) < 0 || grouper_room(g, 32, stats) < 0) {
        grouper_free(g);
        return -1;
    }
    return 0;
}

/* The group of (a, b), added with ``row`` as its first row where new; -1: out of memory. */
static inline int32_t
grouper_add(grouper *g, int64_t a, int64_t b, Py_ssize_t row)
{
    if (g->lg >= 0 && a == g->la && b == g->lb)
        return g->lg;
    size_t mask = g->cap - 1, s = (size_t)mix(mix((uint64_t)a) ^ (uint64_t)b) & mask;
    int32_t v;
    while ((v = g->slot[s]) != 0) {
        if (g->ka[v - 1] == a && g->kb[v - 1] == b)
            goto found;
        s = (s + 1) & mask;
    }
    if (g->m >= INT32_MAX - 1)
        return -1;
    if (g->m == g->room && grouper_room(g, 2 * g->room, g->stat != NULL) < 0)
        return -1;
    v = (int32_t)(++g->m);
    g->ka[v - 1] = a;
    g->kb[v - 1] = b;
    g->first[v - 1] = row;
    if (g->stat != NULL) {
        int64_t *st = &g->stat[N_QSTATS * (v - 1)];
        st[Q_CMDS] = st[Q_REGIONS] = 0;
        st[Q_CMD_MAX] = st[Q_REGION_MAX] = INT64_MIN;
    }
    g->slot[s] = v;
    if (2 * (size_t)g->m >= g->cap && grouper_rehash(g, 2 * g->cap) < 0)
        return -1;
found:
    g->la = a;
    g->lb = b;
    g->lg = v - 1;
    return v - 1;
}

static PyObject *
int_list(const int64_t *v, Py_ssize_t m)
{
    PyObject *out = PyList_New(m);
    for (Py_ssize_t k = 0; out != NULL && k < m; k++) {
        PyObject *x = PyLong_FromLongLong(v[k]);
        if (x == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, x);
    }
    return out;
}

static inline int
is_region(const uint8_t *lut, Py_ssize_t nlut, int64_t cat)
{
    return cat >= 0 && cat < nlut && lut[cat];
}

/* scan(ints, status, raw, lut, groups) -> (misses, big, failed, errors, attrs, thread_rows, site_rows,
 * queue_rows, path_rows, queue_stats): see Resolver._native_columns (resolve.py). */
static PyObject *
resolve_scan(PyObject *self, PyObject *args)
{
    Py_buffer b[5];
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*:scan", &b[0], &b[1], &b[2], &b[3], &b[4]))
        return NULL;
    Py_ssize_t n = b[1].len / (Py_ssize_t)sizeof(int32_t);
    if (b[1].len % (Py_ssize_t)sizeof(int32_t) || b[0].len != N_COLS * n * (Py_ssize_t)sizeof(int64_t) ||
        b[2].len != 4 * n * (Py_ssize_t)sizeof(int64_t) || b[4].len != N_GROUPS * n * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_Format(PyExc_ValueError, "scan: need int64[%d, N], int32[N], int64[N, 4], a lookup table and "
                     "int32[%d, N] for N=%zd", N_COLS, N_GROUPS, n);
        release(b, 5);
        return NULL;
    }
    const int64_t *c = b[0].buf, *raw = b[2].buf;
    const int32_t *status = b[1].buf;
    const uint8_t *lut = b[3].buf;
    Py_ssize_t nlut = b[3].len;
    int32_t *grp = b[4].buf;
    grouper g[N_GROUPS];
    int made = 0, oom = 0;
    for (; made < N_GROUPS; made++)
        if (grouper_init(&g[made], made == G_QUEUE) < 0)
            break;
    int64_t count[5] = {0, 0, 0, 0, 0}; /* misses, big thread keys, failed commands, errors, attrs */
    if (made == N_GROUPS) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t flags = c[C_FLAGS * n + i], name = c[C_NAME * n + i], cat = c[C_CAT * n + i];
            int64_t pid = c[C_PATH * n + i], thr = c[C_THREAD * n + i];
            count[0] += name < 0 || cat < 0 || pid < 0;
            count[1] += (flags & F_BIG_THREAD) != 0;
            count[3] += (flags & F_ERROR) != 0;
            count[4] += (flags & F_ATTRS) != 0;
            int region = is_region(lut, nlut, cat), dev = (flags & F_DEV) != 0;
            count[2] += dev && status[i] < 0;
            int32_t gt = grouper_add(&g[G_THREAD], thr, 0, i), gs = grouper_add(&g[G_SITE], c[C_SITE * n + i], 0, i);
            int32_t gq = -1, gp = -1;
            if (dev && status[i] == 0) {
                gq = grouper_add(&g[G_QUEUE], c[C_QUEUE * n + i], thr, i);
                if (gq >= 0) {
                    int64_t *st = &g[G_QUEUE].stat[N_QSTATS * gq], s = RAW(i, 2);
                    st[region ? Q_REGIONS : Q_CMDS]++;
                    int64_t *mx = &st[region ? Q_REGION_MAX : Q_CMD_MAX];
                    if (s > *mx)
                        *mx = s;
                }
            }
            if (!region)
                gp = grouper_add(&g[G_PATH], pid, name, i);
            if (gt < 0 || gs < 0 || (dev && status[i] == 0 && gq < 0) || (!region && gp < 0)) {
                oom = 1;
                break;
            }
            grp[G_THREAD * n + i] = gt;
            grp[G_SITE * n + i] = gs;
            grp[G_QUEUE * n + i] = gq;
            grp[G_PATH * n + i] = gp;
        }
        Py_END_ALLOW_THREADS
    }
    PyObject *out = NULL;
    if (made < N_GROUPS || oom) {
        PyErr_NoMemory();
    } else {
        PyObject *stats = int_list(g[G_QUEUE].stat, N_QSTATS * g[G_QUEUE].m);
        out = Py_BuildValue("(LLLLLNNNNN)", (long long)count[0], (long long)count[1], (long long)count[2],
                            (long long)count[3], (long long)count[4], int_list(g[G_THREAD].first, g[G_THREAD].m),
                            int_list(g[G_SITE].first, g[G_SITE].m), int_list(g[G_QUEUE].first, g[G_QUEUE].m),
                            int_list(g[G_PATH].first, g[G_PATH].m), stats);
    }
    for (int k = 0; k < made; k++)
        grouper_free(&g[k]);
    release(b, 5);
    return out;
}

/* One device clock's map and placement for ``finish`` (clock.py, placement.py). */
enum { S_HAS_LAST, S_LAST_START, S_HAS_MAX, S_MAX_END, S_WORST, S_CHANGES, S_THRESHOLD, S_ADDED, N_STATE };

typedef struct {
    const int64_t *kd, *ko, *t, *o;
    const double *sl;
    Py_ssize_t nk, nt;
    int64_t *nt_out, *no_out; /* steps added by this batch */
    Py_ssize_t room;
    int64_t *state;
    Py_buffer b[8];
} clockst;

/* The last index whose value is <= x (bisect_right - 1), -1 where none. */
static inline Py_ssize_t
at_or_before(const int64_t *v, Py_ssize_t n, int64_t x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (v[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

/* The offset the map applies at device time d (DeviceClock.offsets). */
static inline int64_t
map_offset(const clockst *k, int64_t d)
{
    Py_ssize_t i = at_or_before(k->kd, k->nk, d);
    if (i < 0)
        return k->ko[0];
    return k->ko[i] + (int64_t)rint(k->sl[i] * (double)(d - k->kd[i]));
}

/* The placement's offset in force at device time x: its committed steps, then this batch's (Placement.lookup). */
static inline int64_t
step_at(const clockst *k, int64_t x)
{
    Py_ssize_t added = k->state[S_ADDED];
    if (added > 0 && (k->nt == 0 || k->nt_out[0] <= x)) {
        Py_ssize_t i = at_or_before(k->nt_out, added, x);
        return k->no_out[i < 0 ? 0 : i];
    }
    Py_ssize_t i = at_or_before(k->t, k->nt, x);
    return k->o[i < 0 ? 0 : i];
}

static inline void
add_step(clockst *k, int64_t t, int64_t o)
{
    Py_ssize_t a = k->state[S_ADDED]++;
    k->nt_out[a] = t;
    k->no_out[a] = o;
}

/* rows[0..m) sorted stably by their START: a natural merge sort (ascending runs merged pairwise, one pass
 * when they are in order already). tmp: room for m. */
static void
sort_by_start(int64_t *rows, Py_ssize_t m, const int64_t *raw, int64_t *tmp)
{
    Py_ssize_t k = 1;
    while (k < m && RAW(rows[k], 2) >= RAW(rows[k - 1], 2))
        k++;
    if (k >= m)
        return;
    int64_t *src = rows, *dst = tmp;
    for (;;) {
        Py_ssize_t a = 0, runs = 0;
        while (a < m) {
            Py_ssize_t b = a + 1;
            while (b < m && RAW(src[b], 2) >= RAW(src[b - 1], 2))
                b++;
            Py_ssize_t c = b < m ? b + 1 : m;
            while (c < m && RAW(src[c], 2) >= RAW(src[c - 1], 2))
                c++;
            Py_ssize_t i = a, j = b, o = a;
            while (i < b && j < c)
                dst[o++] = RAW(src[j], 2) < RAW(src[i], 2) ? src[j++] : src[i++];
            while (i < b)
                dst[o++] = src[i++];
            while (j < c)
                dst[o++] = src[j++];
            runs++;
            a = c;
        }
        int64_t *swap = src;
        src = dst;
        dst = swap;
        if (runs == 1)
            break;
    }
    if (src != rows)
        memcpy(rows, src, (size_t)m * sizeof(int64_t));
}

/* Placement.place for rows[0..m) (sorted by START): one committed offset each, into off[]. */
static void
place_rows(clockst *k, const int64_t *rows, Py_ssize_t m, const int64_t *raw, int64_t *off)
{
    int64_t *st = k->state, thr = st[S_THRESHOLD], worst = st[S_WORST];
    Py_ssize_t j = 0;
    if (st[S_HAS_LAST]) /* ran before what is already drawn (another queue, resolved later): no new steps */
        for (; j < m && RAW(rows[j], 2) < st[S_LAST_START]; j++) {
            int64_t s = RAW(rows[j], 2), o = step_at(k, s), d = o - map_offset(k, s);
            off[rows[j]] = o;
            if ((d < 0 ? -d : d) > worst)
                worst = d < 0 ? -d : d;
        }
    if (j < m) { /* Placement._walk: stepping towards the map's target where the device's idle gaps allow */
        int64_t prev0 = st[S_HAS_MAX] ? st[S_MAX_END] : INT64_MIN / 2, before = INT64_MIN;
        if (k->nt == 0 && st[S_ADDED] == 0)
            add_step(k, RAW(rows[j], 2), map_offset(k, RAW(rows[j], 2)));
        int64_t cur = st[S_ADDED] ? k->no_out[st[S_ADDED] - 1] : k->o[k->nt - 1];
        for (Py_ssize_t q = j; q < m; q++) {
            int64_t r = rows[q], s = RAW(r, 2), e = RAW(r, 3), tg = map_offset(k, s);
            int64_t prev_end = q == j ? prev0 : (before > prev0 ? before : prev0), gap = s - prev_end;
            before = q == j || e > before ? e : before;
            int64_t d = tg - cur;
            if (d < -thr || (d > thr && gap > 1)) {
                cur = d < 0 ? cur + d : cur + (d < gap - 1 ? d : gap - 1);
                add_step(k, s, cur);
                st[S_CHANGES]++;
            }
            off[r] = cur;
            d = cur - tg;
            if ((d < 0 ? -d : d) > worst)
                worst = d < 0 ? -d : d;
        }
        st[S_LAST_START] = RAW(rows[m - 1], 2);
        st[S_HAS_LAST] = 1;
        st[S_MAX_END] = st[S_HAS_MAX] && st[S_MAX_END] > before ? st[S_MAX_END] : before;
        st[S_HAS_MAX] = 1;
    }
    st[S_WORST] = worst;
}

static int
clock_parse(PyObject *item, clockst *k)
{
    memset(k, 0, sizeof(*k));
    if (!PyArg_ParseTuple(item, "y*y*y*y*y*w*w*w*:finish clock", &k->b[0], &k->b[1], &k->b[2], &k->b[3], &k->b[4],
                          &k->b[5], &k->b[6], &k->b[7]))
        return -1;
    k->nk = k->b[0].len / (Py_ssize_t)sizeof(int64_t);
    k->nt = k->b[3].len / (Py_ssize_t)sizeof(int64_t);
    k->room = k->b[5].len / (Py_ssize_t)sizeof(int64_t);
    if (k->nk < 1 || k->b[1].len != k->b[0].len || k->b[2].len != k->nk * (Py_ssize_t)sizeof(double) ||
        k->b[4].len != k->b[3].len || k->b[6].len != k->b[5].len || k->b[7].len != N_STATE * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "finish: a clock is (knots int64[K>0], offsets int64[K], slopes float64[K], "
                        "steps int64[S], offsets int64[S], new steps int64[R], new offsets int64[R], state int64[8])");
        release(k->b, 8);
        return -1;
    }
    k->kd = k->b[0].buf;
    k->ko = k->b[1].buf;
    k->sl = k->b[2].buf;
    k->t = k->b[3].buf;
    k->o = k->b[4].buf;
    k->nt_out = k->b[5].buf;
    k->no_out = k->b[6].buf;
    k->state = k->b[7].buf;
    k->state[S_ADDED] = 0;
    return 0;
}

enum { O_THREAD, O_TRACK, O_QUEUED, O_SUBMIT, O_START, O_END, O_RAW_START, O_RAW_END, N_OUT64 };

/* finish(*, ints, status, raw, lut, groups, thread_track, site_id, queue_track, queue_clock, queue_lane, path_id,
 *        clocks, extents, out64, name, cat, path, site, status_out): see Resolver._native_columns (resolve.py) and _ext.pyi. */
static PyObject *
resolve_finish(PyObject *self, PyObject *args, PyObject *kw)
{
    enum { NB = 17 };
    Py_buffer b[NB];
    PyObject *clocks = NULL, *ext = NULL;
    memset(b, 0, sizeof(b));
    static char *names[] = {"ints", "status", "raw", "lut", "groups", "thread_track", "site_id", "queue_track",
                            "queue_clock", "queue_lane", "path_id", "clocks", "extents", "out64", "name", "cat", "path",
                            "site", "status_out", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$y*y*y*y*y*y*y*y*y*y*y*O!O!w*w*w*w*w*w*:finish", names, &b[0], &b[1],
                                     &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &PyList_Type,
                                     &clocks, &ExtentsType, &ext, &b[11], &b[12], &b[13], &b[14], &b[15], &b[16]))
        return NULL;
    for (int j = 0; j < NB + 2; j++) { /* every argument is required */
        int given = j < 11 ? b[j].obj != NULL : j == 11 ? clocks != NULL : j == 12 ? ext != NULL : b[j - 2].obj != NULL;
        if (!given) {
            PyErr_Format(PyExc_TypeError, "finish() missing keyword argument '%s'", names[j]);
            for (int i = 0; i < NB; i++)
                if (b[i].obj)
                    PyBuffer_Release(&b[i]);
            return NULL;
        }
    }
    Py_ssize_t n = b[1].len / (Py_ssize_t)sizeof(int32_t), nclk = PyList_GET_SIZE(clocks);
    Py_ssize_t m_thr = b[5].len / 8, m_site = b[6].len / 4, m_q = b[7].len / 8, m_path = b[10].len / 4;
    if (b[0].len != N_COLS * n * 8 || b[2].len != 4 * n * 8 || b[4].len != N_GROUPS * n * 4 || b[8].len != m_q * 8 ||
        b[9].len != m_q || b[11].len != N_OUT64 * n * 8 || b[12].len != n * 4 || b[13].len != n * 2 ||
        b[14].len != n * 4 || b[15].len != n * 4 || b[16].len != n) {
        PyErr_Format(PyExc_ValueError, "finish: buffers of the wrong size for N=%zd (see Resolver._native_columns)", n);
        release(b, NB);
        return NULL;
    }
    clockst *ck = PyMem_RawCalloc(nclk ? nclk : 1, sizeof(clockst));
    int64_t *scratch = PyMem_RawMalloc((size_t)(5 * n + 4 * nclk + 2) * sizeof(int64_t));
    if (ck == NULL || scratch == NULL) {
        PyMem_RawFree(ck);
        PyMem_RawFree(scratch);
        release(b, NB);
        return PyErr_NoMemory();
    }
    Py_ssize_t parsed = 0;
    for (; parsed < nclk; parsed++)
        if (clock_parse(PyList_GET_ITEM(clocks, parsed), &ck[parsed]) < 0)
            break;
    const char *bad = NULL;
    if (parsed == nclk) {
        const int64_t *c = b[0].buf, *raw = b[2].buf, *thr_track = b[5].buf, *q_track = b[7].buf, *q_clock = b[8].buf;
        const int32_t *status = b[1].buf, *grp = b[4].buf, *site_id = b[6].buf, *path_id = b[10].buf;
        const uint8_t *lut = b[3].buf, *q_lane = b[9].buf;
        Py_ssize_t nlut = b[3].len;
        int64_t *out = b[11].buf;
        int32_t *name = b[12].buf, *path = b[14].buf, *site = b[15].buf;
        int16_t *cat = b[13].buf;
        int8_t *err = b[16].buf;
        /* scratch: off, off_end, kind, rows by clock (commands, then regions), sort room; places per clock */
        int64_t *off = scratch, *off_end = off + n, *kind = off_end + n, *rows = kind + n, *tmp = rows + n;
        int64_t *cmd_at = tmp + n, *reg_at = cmd_at + nclk + 1, *fill = reg_at + nclk + 1;
        Extents *x = (Extents *)ext;
        int nest_err = 0;
        Py_BEGIN_ALLOW_THREADS
        memset(cmd_at, 0, (size_t)(2 * nclk + 2) * sizeof(int64_t));
        for (Py_ssize_t i = 0; i < n && bad == NULL; i++) {
            int64_t flags = c[C_FLAGS * n + i], ct = c[C_CAT * n + i];
            int32_t gt = grp[G_THREAD * n + i], gs = grp[G_SITE * n + i], gq = grp[G_QUEUE * n + i];
            int32_t gp = grp[G_PATH * n + i];
            int region = is_region(lut, nlut, ct), ok = (flags & F_DEV) && status[i] == 0;
            if (gt < 0 || gt >= m_thr || gs < 0 || gs >= m_site || (ok ? gq < 0 || gq >= m_q : gq != -1) ||
                (region ? gp != -1 : gp < 0 || gp >= m_path) || (ok && (q_clock[gq] < 0 || q_clock[gq] >= nclk))) {
                bad = "finish: a row's groups do not match the tables given (scan's output, for these columns)";
                break;
            }
            name[i] = (int32_t)c[C_NAME * n + i];
            cat[i] = (int16_t)ct;
            path[i] = region ? (int32_t)c[C_PATH * n + i] : path_id[gp];
            site[i] = site_id[gs];
            out[O_THREAD * n + i] = thr_track[gt];
            err[i] = (flags & F_ERROR) != 0;
            off[i] = off_end[i] = 0;
            if (ok)
                (region ? reg_at : cmd_at)[q_clock[gq] + 1]++;
        }
        if (bad == NULL) {
            /* Rows of each clock, commands then regions, in row order: a counting sort on the clock. */
            for (Py_ssize_t k = 0; k < nclk; k++)
                cmd_at[k + 1] += cmd_at[k];
            reg_at[0] = cmd_at[nclk];
            for (Py_ssize_t k = 0; k < nclk; k++)
                reg_at[k + 1] += reg_at[k];
            /* fill: the next free place per clock, commands [0, nclk), regions [nclk, 2 nclk) */
            for (Py_ssize_t k = 0; k < nclk; k++) {
                fill[k] = cmd_at[k];
                fill[nclk + k] = reg_at[k];
            }
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t flags = c[C_FLAGS * n + i];
                if (!((flags & F_DEV) && status[i] == 0))
                    continue;
                int64_t k = q_clock[grp[G_QUEUE * n + i]];
                rows[fill[is_region(lut, nlut, c[C_CAT * n + i]) ? nclk + k : k]++] = i;
            }
            for (Py_ssize_t k = 0; k < nclk; k++) {
                clockst *q = &ck[k];
                int64_t *cr = rows + cmd_at[k], *rr = rows + reg_at[k];
                Py_ssize_t nc = cmd_at[k + 1] - cmd_at[k], nr = reg_at[k + 1] - reg_at[k];
                if (nc + nr + 1 > q->room) {
                    bad = "finish: a clock's room for new steps is smaller than its rows + 1";
                    break;
                }
                if (nc) {
                    sort_by_start(cr, nc, raw, tmp);
                    place_rows(q, cr, nc, raw, off);
                    for (Py_ssize_t j = 0; j < nc; j++)
                        off_end[cr[j]] = off[cr[j]];
                }
                if (!nr)
                    continue;
                if (q->nt + q->state[S_ADDED] > 0) { /* a region's edges take the offset in force where they fall */
                    for (Py_ssize_t j = 0; j < nr; j++) {
                        off[rr[j]] = step_at(q, RAW(rr[j], 2));
                        off_end[rr[j]] = step_at(q, RAW(rr[j], 3));
                    }
                } else { /* regions before any command on this device: they start the placement */
                    sort_by_start(rr, nr, raw, tmp);
                    place_rows(q, rr, nr, raw, off);
                    for (Py_ssize_t j = 0; j < nr; j++)
                        off_end[rr[j]] = off[rr[j]];
                }
            }
        }
        if (bad == NULL) {
            int64_t *track = out + O_TRACK * n, *rs = out + O_RAW_START * n, *re = out + O_RAW_END * n;
            const int64_t *parent = c + C_PARENT * n;
            for (Py_ssize_t i = 0; i < n; i++) {
                int ok = (c[C_FLAGS * n + i] & F_DEV) && status[i] == 0;
                int32_t gq = grp[G_QUEUE * n + i];
                track[i] = ok ? q_track[gq] : 0;
                rs[i] = RAW(i, 2);
                re[i] = RAW(i, 3);
                kind[i] = is_region(lut, nlut, c[C_CAT * n + i]) ? (ok ? 2 : 3)
                          : (ok && !q_lane[gq] && parent[i] != 0) ? 1 : 0;
            }
            PyThread_acquire_lock(x->lock, WAIT_LOCK);
            nest_err = nest_rows(x, n, kind, c + C_ID * n, parent, track, off, off_end, rs, re);
            PyThread_release_lock(x->lock);
            for (Py_ssize_t i = 0; i < n; i++) {
                if ((c[C_FLAGS * n + i] & F_DEV) && status[i] == 0) {
                    out[O_QUEUED * n + i] = RAW(i, 0) - off[i];
                    out[O_SUBMIT * n + i] = RAW(i, 1) - off[i];
                    out[O_START * n + i] = rs[i] - off[i];
                    out[O_END * n + i] = re[i] - off_end[i];
                } else {
                    out[O_QUEUED * n + i] = out[O_SUBMIT * n + i] = out[O_START * n + i] = out[O_END * n + i] = 0;
                    rs[i] = re[i] = 0;
                }
            }
        }
        Py_END_ALLOW_THREADS
        if (bad == NULL && nest_err < 0)
            PyErr_NoMemory();
        else if (bad != NULL)
            PyErr_SetString(PyExc_ValueError, bad);
    }
    for (Py_ssize_t k = 0; k < parsed; k++)
        release(ck[k].b, 8);
    PyMem_RawFree(ck);
    PyMem_RawFree(scratch);
    release(b, NB);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* field(records, index, lo, hi): [r[index] for r in records[lo:hi]], records a list of tuples (a part at a time:
 * the caller lets other threads run between parts). */
static PyObject *
resolve_field(PyObject *self, PyObject *args)
{
    PyObject *records;
    Py_ssize_t k, lo, hi;
    if (!PyArg_ParseTuple(args, "O!nnn:field", &PyList_Type, &records, &k, &lo, &hi))
        return NULL;
    if (lo < 0 || hi > PyList_GET_SIZE(records) || lo > hi)
        return PyErr_Format(PyExc_IndexError, "field: rows %zd:%zd of %zd records", lo, hi, PyList_GET_SIZE(records));
    Py_ssize_t n = hi - lo;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, lo + i);
        if (!PyTuple_Check(r) || k < 0 || k >= PyTuple_GET_SIZE(r)) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_TypeError, "field: records must be tuples of more than %zd fields", k);
        }
        PyObject *v = PyTuple_GET_ITEM(r, k);
        Py_INCREF(v);
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"group", resolve_group, METH_VARARGS, "group(keys, width, first, inverse) -> m: rows grouped by their keys."},
    {"first_fit", resolve_first_fit, METH_VARARGS,
     "first_fit(starts, ends, lane_ends, used, lanes) -> used: commands on the first free lane."},
    {"scan", resolve_scan, METH_VARARGS, "scan(ints, status, raw, lut, groups) -> counts and groups: the tail's first pass."},
    {"finish", (PyCFunction)(void (*)(void))resolve_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(*, ints, status, raw, lut, groups, thread_track, site_id, queue_track, queue_clock, queue_lane, path_id, "
     "clocks, extents, out64, name, cat, path, site, status_out): a batch's final columns, placed and nested (see Resolver._native_columns)."},
    {"field", resolve_field, METH_VARARGS, "field(records, index, lo, hi) -> [r[index] for r in records[lo:hi]]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.resolve",
    "The resolver's passes over whole columns, without the GIL (see cltrace.timeline.passes).", -1, methods,
};

PyObject *
cltrace_resolve_module(void)
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
