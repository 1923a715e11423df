/* The enabled region's hot path in C: ``Region.__enter__``/``__exit__`` without a Python frame.
 *
 * It mirrors ``regions._Region`` exactly and shares all of its state with the Python code, so
 * native and Python records interleave: the per-thread stack (``regions._tls.stack``, a list of
 * (span id, path) with the thread key in ``.key``), the id counter (``recorder._ids``), the
 * recorder's deque and its back-pressure check (``len(pending) >= RECORDER.room``).
 *
 *   init(tls, ids, pending, recorder, marker, decorate, status_error, region_cat, per_os_thread)
 *   Region(name, queue=None, attrs=None, cat=region_cat)
 *   record_launch(name, queue, event, host_begin, host_end, cat, attrs, site)   an enqueued command's record
 *   now()   the host clock as time.perf_counter_ns() reads it (for tests)
 *   site(skip=1)   callsite.capture in C: the raw call site above the caller's skip - 1 frames
 *   site_config(classify, generation, depth)   share callsite's library test and settings
 *
 * The record is the 15-field tuple documented in recorder.py; a region's call site is captured
 * at __enter__ (the frame running the ``with``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../_ext.h"
#include "../timeline/_reaper.h"
#include <structmember.h>
#include <stdint.h>
#include <time.h>

static PyObject *g_tls, *g_ids, *g_pending, *g_append, *g_recorder, *g_marker, *g_decorate;
static PyObject *g_status_error, *g_region_cat;
static PyObject *s_stack, *s_key, *s_room, *s_drain, *s_name, *s_empty, *s_colon, *s_tickets_above;
static PyObject *s_last_q, *s_last_ev, *s_int_ptr; /* the thread stack's last command launched with an event */
static PyObject *g_project_state, *s_project; /* _state and its PROJECT_REGIONS (set by init) */

/* Inside a region, while regions are projected: this command is where the thread's open regions end so far. */
static int
note_last(PyObject *st, PyObject *queue, PyObject *ev)
{
    if (queue == Py_None || ev == Py_None || PyList_GET_SIZE(st) == 0 || g_project_state == NULL)
        return 0;
    PyObject *v = PyObject_GetAttr(g_project_state, s_project);
    if (v == NULL)
        return -1;
    int on = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (on <= 0)
        return on;
    return PyObject_SetAttr(st, s_last_q, queue) < 0 || PyObject_SetAttr(st, s_last_ev, ev) < 0 ? -1 : 0;
}
static PyObject *g_zero, *g_empty_tuple;
static int g_cache_stack; /* tls is a plain threading.local: one stack per OS thread, cacheable */

/* ---- call sites (record/callsite.py) -----------------------------------------------------------
 * A code object's "library?" flag lives in its extra slot (PEP 523's co_extra) as
 * (generation << 2 | library << 1 | 1); a flag of an older generation (the library set changed) is
 * recomputed by callsite._classify. The raw site of a line, the tuple (code, offset), is cached in
 * a small direct-mapped table: a launch from a line seen before allocates nothing. The cached
 * tuple holds its code object, so a table entry's code pointer stays valid. */
static PyObject *g_classify;
static Py_ssize_t g_extra = -1;
static uintptr_t g_site_gen = 1;
static int g_site_depth = 1;
#define SITE_SLOTS 1024
static struct { PyObject *code; int lasti; PyObject *raw; } g_sites[SITE_SLOTS];

static int
code_is_library(PyCodeObject *code)
{
    void *v = NULL;
    if (_PyCode_GetExtra((PyObject *)code, g_extra, &v) < 0)
        return -1;
    uintptr_t u = (uintptr_t)v;
    if ((u & 1) && (u >> 2) == g_site_gen)
        return (int)((u >> 1) & 1);
    PyObject *r = PyObject_CallOneArg(g_classify, (PyObject *)code);
    if (r == NULL)
        return -1;
    int lib = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (lib < 0)
        return -1;
    if (_PyCode_SetExtra((PyObject *)code, g_extra, (void *)((g_site_gen << 2) | ((uintptr_t)lib << 1) | 1)) < 0)
        return -1;
    return lib;
}

/* (code, offset) as a new reference, from the cache where it is there. */
static PyObject *
site_pair(PyCodeObject *code, int lasti)
{
    size_t h = (((uintptr_t)code >> 4) ^ ((size_t)lasti * 2654435761u)) & (SITE_SLOTS - 1);
    if (g_sites[h].code == (PyObject *)code && g_sites[h].lasti == lasti) {
        Py_INCREF(g_sites[h].raw);
        return g_sites[h].raw;
    }
    PyObject *off = PyLong_FromLong(lasti);
    if (off == NULL)
        return NULL;
    PyObject *raw = PyTuple_Pack(2, (PyObject *)code, off);
    Py_DECREF(off);
    if (raw == NULL)
        return NULL;
    if (!PyObject_IS_GC((PyObject *)code) || !PyObject_GC_IsTracked((PyObject *)code))
        PyObject_GC_UnTrack(raw);
    Py_INCREF(raw);
    PyObject *old = g_sites[h].raw;
    g_sites[h].code = (PyObject *)code;
    g_sites[h].lasti = lasti;
    g_sites[h].raw = raw;
    Py_XDECREF(old);
    return raw;
}

/* The raw site starting at frame f (borrowed, may be NULL): the first g_site_depth frames whose code
 * is not library code, as (code, offset[, code, offset ...]); None where there is none. */
static PyObject *
capture_from(PyFrameObject *f)
{
    if (g_site_depth <= 0 || f == NULL || g_classify == NULL)
        Py_RETURN_NONE;
    PyObject *many = NULL;
    Py_INCREF(f);
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int lib = code_is_library(code);
        if (lib < 0) {
            Py_DECREF(code);
            Py_DECREF(f);
            Py_XDECREF(many);
            return NULL;
        }
        if (!lib) {
            PyObject *pair = site_pair(code, PyFrame_GetLasti(f));
            Py_DECREF(code);
            if (pair == NULL) {
                Py_DECREF(f);
                Py_XDECREF(many);
                return NULL;
            }
            if (g_site_depth == 1) {
                Py_DECREF(f);
                return pair;
            }
            if (many == NULL && (many = PyList_New(0)) == NULL) {
                Py_DECREF(pair);
                Py_DECREF(f);
                return NULL;
            }
            int rc = PyList_Append(many, PyTuple_GET_ITEM(pair, 0)) < 0 ||
                     PyList_Append(many, PyTuple_GET_ITEM(pair, 1)) < 0;
            Py_DECREF(pair);
            if (rc) {
                Py_DECREF(f);
                Py_DECREF(many);
                return NULL;
            }
            if (PyList_GET_SIZE(many) >= 2 * (Py_ssize_t)g_site_depth) {
                Py_DECREF(f);
                break;
            }
        } else {
            Py_DECREF(code);
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    if (many == NULL)
        Py_RETURN_NONE;
    PyObject *out = PyList_AsTuple(many);
    Py_DECREF(many);
    return out;
}

static PyObject *
mod_site(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    long skip = 1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "site() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && (skip = PyLong_AsLong(args[0])) == -1 && PyErr_Occurred())
        return NULL;
    if (g_site_depth <= 0)
        Py_RETURN_NONE;
    PyFrameObject *f = PyEval_GetFrame();
    if (f == NULL)
        Py_RETURN_NONE;
    Py_INCREF(f);
    for (; skip > 1 && f != NULL; skip--) {
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    PyObject *out = capture_from(f);
    Py_XDECREF(f);
    return out;
}

static PyObject *
mod_site_config(PyObject *mod, PyObject *args)
{
    PyObject *classify;
    unsigned long long gen;
    int depth;
    if (!PyArg_ParseTuple(args, "OKi:site_config", &classify, &gen, &depth))
        return NULL;
    if (g_extra < 0 && (g_extra = _PyEval_RequestCodeExtraIndex(NULL)) < 0) {
        PyErr_SetString(PyExc_RuntimeError, "cltrace: no code-object extra slot left for call sites");
        return NULL;
    }
    Py_INCREF(classify);
    Py_XSETREF(g_classify, classify);
    g_site_gen = (uintptr_t)gen;
    g_site_depth = depth;
    Py_RETURN_NONE;
}

/* time.perf_counter_ns(): CLOCK_MONOTONIC on Linux and the BSDs (CPython's _PyTime_GetPerfCounter);
 * elsewhere the Python function itself is called. */
#if defined(CLOCK_MONOTONIC) && !defined(__APPLE__) && !defined(_WIN32)
#define NATIVE_CLOCK 1
static inline int
host_now(int64_t *out)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    *out = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    return 0;
}
#else
#define NATIVE_CLOCK 0
static PyObject *g_perf_ns;
static inline int
host_now(int64_t *out)
{
    PyObject *v = PyObject_CallNoArgs(g_perf_ns);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}
#endif

/* The thread's stack, ``tls.stack``. Where tls is a plain threading.local its per-thread value lives
 * as long as the thread, like the thread state's dict, so it is kept there under the key ``tls``:
 * one dict lookup instead of threading.local's attribute machinery. */
static PyObject *
thread_stack(void)
{
    if (!g_cache_stack)
        return PyObject_GetAttr(g_tls, s_stack);
    PyObject *tdict = PyThreadState_GetDict();
    if (tdict == NULL)
        return PyObject_GetAttr(g_tls, s_stack);
    PyObject *st = PyDict_GetItemWithError(tdict, g_tls);
    if (st != NULL) {
        Py_INCREF(st);
        return st;
    }
    if (PyErr_Occurred())
        return NULL;
    st = PyObject_GetAttr(g_tls, s_stack);
    if (st != NULL && PyDict_SetItem(tdict, g_tls, st) < 0)
        Py_CLEAR(st);
    return st;
}

/* Records, regions' paths and stack entries are "quiet" tuples: a tuple subclass the cyclic collector
 * never sees. Nothing they hold refers back to them, so they take no part in a cycle. A plain tuple,
 * even untracked, counts as an allocation towards the next young collection when made and its free
 * counts back only while that count is above zero: records freed in the worker's batches gave back
 * little, so at launch rates a traced program ran a young collection every ~1 500 launches, promoting
 * the program's own young objects until a full collection (20-75 ms on this machine's 2 cores) paused
 * every thread - collections an untraced program never runs. Quiet tuples are made and freed outside
 * the collector's counts. Python 3.14 caches a tuple's hash in the object and free-threaded builds
 * track differently: there, plain untracked tuples as before. */
#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define QUIET_TUPLES 1
#else
#define QUIET_TUPLES 0
#endif

static void
quiet_dealloc(PyObject *t)
{
    for (Py_ssize_t i = Py_SIZE(t); i--;)
        Py_XDECREF(PyTuple_GET_ITEM(t, i));
    PyObject_Free(t);
}

/* Never called: its presence keeps PyType_Ready from inheriting tuple's GC flag. */
static int
quiet_traverse(PyObject *t, visitproc visit, void *arg)
{
    return 0;
}

static PyTypeObject QuietTupleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cltrace._ext.region.record",
    .tp_dealloc = quiet_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .tp_doc = "A tuple outside the cyclic collector: a raw record, a region's path or stack entry.",
    .tp_traverse = quiet_traverse,
    .tp_free = PyObject_Free,
};

/* A new quiet tuple of n items, all NULL until set (PyTuple_SET_ITEM). */
static PyObject *
quiet_tuple(Py_ssize_t n)
{
#if QUIET_TUPLES
    return PyType_GenericAlloc(&QuietTupleType, n);
#else
    return PyTuple_New(n);
#endif
}

/* A quiet tuple holding t's items (a tuple's). */
static PyObject *
quiet_copy(PyObject *t)
{
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    PyObject *q = quiet_tuple(n);
    if (q != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(q, i, Py_NewRef(PyTuple_GET_ITEM(t, i)));
    return q;
}

static PyObject *
quiet_pair(PyObject *a, PyObject *b)
{
    PyObject *t = quiet_tuple(2);
    if (t != NULL) {
        PyTuple_SET_ITEM(t, 0, Py_NewRef(a));
        PyTuple_SET_ITEM(t, 1, Py_NewRef(b));
    }
    return t;
}

/* Tuples of atomic or untracked items are untracked by the collector at its next pass; untracking
 * them now keeps the records waiting in the deque out of every collection. */
static inline void
untrack_if_atomic(PyObject *t)
{
    if (!PyObject_IS_GC(t) || !PyObject_GC_IsTracked(t))
        return;
    for (Py_ssize_t i = PyTuple_GET_SIZE(t); i--;) {
        PyObject *e = PyTuple_GET_ITEM(t, i);
        if (PyObject_IS_GC(e) && PyObject_GC_IsTracked(e))
            return;
    }
    PyObject_GC_UnTrack(t);
}

/* A raw record never takes part in a reference cycle: nothing it holds (strings, ints, the queue,
 * the events, the attrs dict, the path and site tuples) refers back to it. Untracked, the records
 * waiting in the deque add nothing to the collector's long-lived generation, whose growth would
 * otherwise start full collections (each walking every waiting record) several times a second at
 * launch rates: pauses of 100+ ms in every traced thread, measured on an H200 host. */
static inline void
untrack_record(PyObject *t)
{
    if (PyTuple_CheckExact(t) && PyObject_GC_IsTracked(t))
        PyObject_GC_UnTrack(t);
}

/* The reaper's hot-path entry (timeline/_reaper.c, from init's capsule): the event's ticket, or -1. */
static int g_reaper = 0; /* init(..., reaper=True): records past tickets_above hold reaper_track's tickets */

/* The record with its command's events traded for the reaper's tickets (a new reference): the tuple
 * itself where only the caller's temporary refers to it, else a copy. The record as it is where the
 * reaper cannot take them. */
static PyObject *
with_tickets(PyObject *rec)
{
    PyObject *e0, *e1;
    if (!g_reaper || !PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < N_FIELDS ||
        PyTuple_GET_ITEM(rec, R_QUEUE) == Py_None || (e0 = PyTuple_GET_ITEM(rec, R_EV0)) == Py_None || PyLong_Check(e0))
        return Py_NewRef(rec);
    e1 = PyTuple_GET_ITEM(rec, R_EV1);
    uint64_t t0, t1 = 0;
    PyObject *q = PyTuple_GET_ITEM(rec, R_QUEUE);
    if (reaper_track(e0, q, &t0) < 0)
        return Py_NewRef(rec);
    PyObject *o0 = PyLong_FromUnsignedLongLong(t0), *o1 = NULL;
    if (o0 == NULL)
        return NULL; /* the ticket stays held: its slot leaks, never a driver event */
    if (e1 != Py_None) {
        if (reaper_track(e1, q, &t1) < 0) {
            Py_DECREF(o0);
            return Py_NewRef(rec); /* both stay Events: the reaper reads the first ticket's, held by nobody */
        }
        if ((o1 = PyLong_FromUnsignedLongLong(t1)) == NULL) {
            Py_DECREF(o0);
            return NULL;
        }
    }
    PyObject *out = rec;
    if (Py_REFCNT(rec) == 1) {
        Py_INCREF(out);
    } else {
        out = quiet_copy(rec);
        if (out == NULL) {
            Py_DECREF(o0);
            Py_XDECREF(o1);
            return NULL;
        }
        untrack_record(out);
    }
    PyObject *old0 = PyTuple_GET_ITEM(out, R_EV0);
    PyTuple_SET_ITEM(out, R_EV0, o0);
    Py_DECREF(old0); /* the user's Event may go now: the reaper holds the cl_event */
    if (o1 != NULL) {
        PyObject *old1 = PyTuple_GET_ITEM(out, R_EV1);
        PyTuple_SET_ITEM(out, R_EV1, o1);
        Py_DECREF(old1);
    }
    return out;
}

/* pending.append(rec); past RECORDER.room, RECORDER.make_room(). -1 on error. */
static int
push_record(PyObject *rec)
{
    /* Past RECORDER.tickets_above records waiting, events are traded for tickets: below it the worker
     * keeps up and the driver's events cost nothing more; above it, no record holds a driver event. */
    if (g_reaper) {
        Py_ssize_t waiting = PyObject_Size(g_pending);
        PyObject *above_o = PyObject_GetAttr(g_recorder, s_tickets_above);
        if (waiting < 0 || above_o == NULL) {
            Py_XDECREF(above_o);
            return -1;
        }
        Py_ssize_t above = PyLong_AsSsize_t(above_o);
        Py_DECREF(above_o);
        if (above == -1 && PyErr_Occurred())
            return -1;
        rec = waiting >= above ? with_tickets(rec) : Py_NewRef(rec);
    } else {
        Py_INCREF(rec);
    }
    if (rec == NULL)
        return -1;
    PyObject *res = PyObject_CallOneArg(g_append, rec);
    Py_DECREF(rec);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    Py_ssize_t n = PyObject_Size(g_pending);
    if (n < 0)
        return -1;
    PyObject *room_o = PyObject_GetAttr(g_recorder, s_room);
    if (room_o == NULL)
        return -1;
    int full, overflow = 0;
    long long room = PyLong_CheckExact(room_o) ? PyLong_AsLongLongAndOverflow(room_o, &overflow) : 0;
    if (PyLong_CheckExact(room_o) && !overflow) {
        full = (long long)n >= room;
    } else {
        PyObject *n_o = PyLong_FromSsize_t(n);
        full = n_o == NULL ? -1 : PyObject_RichCompareBool(n_o, room_o, Py_GE);
        Py_XDECREF(n_o);
    }
    Py_DECREF(room_o);
    if (full <= 0)
        return full;
    res = PyObject_CallMethodNoArgs(g_recorder, s_drain);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* push(rec): RECORDER.push for records built in Python (launches, copies), untracked first. */
static PyObject *
mod_push(PyObject *self, PyObject *rec)
{
    if (g_pending == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cltrace._region: init() was not called");
        return NULL;
    }
    /* A record built in Python (a Kernel's launcher) is kept as a quiet copy. */
    PyObject *copy = NULL; /* not a new reference to rec: with_tickets swaps in place only where it holds the last */
    if (QUIET_TUPLES && PyTuple_CheckExact(rec) && (rec = copy = quiet_copy(rec)) == NULL)
        return NULL;
    untrack_record(rec);
    int rc = push_record(rec);
    Py_XDECREF(copy);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name, *queue, *attrs, *cat;
    PyObject *st, *id, *parent, *path, *ev0, *site; /* set by __enter__ */
    int64_t hb;
    char project; /* device span projected from its commands (``region``), else two markers */
} Region;

static PyTypeObject RegionType;
static PyObject *region_dispatch(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static int
ready(void)
{
    if (g_tls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cltrace._ext.region: init() was not called");
        return 0;
    }
    return 1;
}

static PyObject *
region_make(PyTypeObject *type, PyObject *name, PyObject *queue, PyObject *attrs, PyObject *cat)
{
    Region *r = PyObject_GC_New(Region, type);
    if (r == NULL)
        return NULL;
    Py_INCREF(name);
    r->name = name;
    Py_INCREF(queue);
    r->queue = queue;
    Py_INCREF(attrs);
    r->attrs = attrs;
    Py_INCREF(cat);
    r->cat = cat;
    r->vectorcall = region_dispatch;
    r->st = r->id = r->parent = r->path = r->ev0 = r->site = NULL;
    r->hb = 0;
    r->project = 0;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PyObject *
region_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"name", "queue", "attrs", "cat", NULL};
    PyObject *name, *queue = Py_None, *attrs = Py_None, *cat = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOO:Region", kwlist, &name, &queue, &attrs, &cat))
        return NULL;
    if (cat == NULL) {
        if (!ready())
            return NULL;
        cat = g_region_cat;
    }
    return region_make(type, name, queue, attrs, cat);
}

/* Region(name, queue, attrs, cat) by position: what regions.py calls on the hot path. */
static PyObject *
region_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || n < 1 || n > 4 || (n < 4 && g_region_cat == NULL)) {
        PyObject *tuple = PyTuple_New(n);
        if (tuple == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(tuple, i, args[i]);
        }
        PyObject *kw = NULL;
        if (kwnames != NULL) {
            kw = PyDict_New();
            Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
            for (Py_ssize_t i = 0; kw != NULL && i < nk; i++) {
                if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0)
                    Py_CLEAR(kw);
            }
            if (kw == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
        }
        PyObject *r = region_new((PyTypeObject *)type, tuple, kw);
        Py_DECREF(tuple);
        Py_XDECREF(kw);
        return r;
    }
    return region_make((PyTypeObject *)type, args[0], n > 1 ? args[1] : Py_None, n > 2 ? args[2] : Py_None,
                       n > 3 ? args[3] : g_region_cat);
}

static int
region_traverse(Region *r, visitproc visit, void *arg)
{
    Py_VISIT(r->name);
    Py_VISIT(r->queue);
    Py_VISIT(r->attrs);
    Py_VISIT(r->cat);
    Py_VISIT(r->st);
    Py_VISIT(r->id);
    Py_VISIT(r->parent);
    Py_VISIT(r->path);
    Py_VISIT(r->ev0);
    Py_VISIT(r->site);
    return 0;
}

static int
region_clear(Region *r)
{
    Py_CLEAR(r->name);
    Py_CLEAR(r->queue);
    Py_CLEAR(r->attrs);
    Py_CLEAR(r->cat);
    Py_CLEAR(r->st);
    Py_CLEAR(r->id);
    Py_CLEAR(r->parent);
    Py_CLEAR(r->path);
    Py_CLEAR(r->ev0);
    Py_CLEAR(r->site);
    return 0;
}

static void
region_dealloc(Region *r)
{
    PyObject_GC_UnTrack(r);
    region_clear(r);
    PyObject_GC_Del(r);
}

/* __enter__: parent from the thread's stack, a new id, the path, (id, path) pushed; then the host
 * clock and, with a queue, the first marker (the host bracket encloses the markers' QUEUED stamps). */
/* The thread's innermost region, (span id, path), borrowed from its stack; (0, ()) outside any. */
static int
stack_top(PyObject *st, PyObject **parent, PyObject **path)
{
    if (!PyList_Check(st)) {
        PyErr_SetString(PyExc_TypeError, "cltrace: the region stack is not a list");
        return -1;
    }
    Py_ssize_t depth = PyList_GET_SIZE(st);
    if (depth == 0) {
        *parent = g_zero;
        *path = g_empty_tuple;
        return 0;
    }
    PyObject *top = PyList_GET_ITEM(st, depth - 1);
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(top, 1))) {
        PyErr_SetString(PyExc_TypeError, "cltrace: a region stack entry is not (span id, path)");
        return -1;
    }
    *parent = PyTuple_GET_ITEM(top, 0);
    *path = PyTuple_GET_ITEM(top, 1);
    return 0;
}

static PyObject *
region_enter(Region *self, PyObject *unused)
{
    if (!ready())
        return NULL;
    PyObject *st = thread_stack();
    if (st == NULL)
        return NULL;
    PyObject *parent, *ppath;
    if (stack_top(st, &parent, &ppath) < 0) {
        Py_DECREF(st);
        return NULL;
    }
    PyObject *sid = Py_TYPE(g_ids)->tp_iternext(g_ids);
    if (sid == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    Py_ssize_t np = PyTuple_GET_SIZE(ppath);
    PyObject *path = quiet_tuple(np + 1);
    if (path == NULL) {
        Py_DECREF(sid);
        Py_DECREF(st);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *e = PyTuple_GET_ITEM(ppath, i);
        Py_INCREF(e);
        PyTuple_SET_ITEM(path, i, e);
    }
    Py_INCREF(self->name);
    PyTuple_SET_ITEM(path, np, self->name);
    untrack_if_atomic(path);
    Py_INCREF(parent);
    PyObject *entry = quiet_pair(sid, path);
    if (entry != NULL)
        untrack_if_atomic(entry);
    if (entry == NULL || PyList_Append(st, entry) < 0) {
        Py_XDECREF(entry);
        Py_DECREF(parent);
        Py_DECREF(path);
        Py_DECREF(sid);
        Py_DECREF(st);
        return NULL;
    }
    Py_DECREF(entry);
    Py_XSETREF(self->st, st);
    Py_XSETREF(self->id, sid);
    Py_XSETREF(self->parent, parent);
    Py_XSETREF(self->path, path);
    PyObject *site = capture_from(PyEval_GetFrame());
    if (site == NULL)
        return NULL;
    Py_XSETREF(self->site, site);
    if (host_now(&self->hb) < 0)
        return NULL;
    if (self->queue == Py_None) {
        Py_INCREF(Py_None);
        Py_XSETREF(self->ev0, Py_None);
    } else if (self->project) { /* the thread's last command so far: where the region's own begin */
        PyObject *mark = PyObject_GetAttr(self->st, s_last_ev);
        if (mark == NULL)
            return NULL;
        Py_XSETREF(self->ev0, mark);
    } else {
        PyObject *ev = PyObject_CallOneArg(g_marker, self->queue);
        if (ev == NULL)
            return NULL;
        Py_XSETREF(self->ev0, ev);
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

/* Remove this region's entry from its stack: the top when closed in order, else wherever it is. */
static int
pop_entry(PyObject *st, PyObject *sid)
{
    Py_ssize_t n = PyList_GET_SIZE(st);
    if (n) {
        PyObject *top = PyList_GET_ITEM(st, n - 1);
        PyObject *top_id = PyTuple_Check(top) && PyTuple_GET_SIZE(top) ? PyTuple_GET_ITEM(top, 0) : NULL;
        if (top_id == NULL) {  /* same error as Python's st[-1][0] on a bad entry */
            top_id = PySequence_GetItem(top, 0);
            if (top_id == NULL)
                return -1;
            Py_DECREF(top_id);  /* still referenced by the entry */
        }
        int eq = top_id == sid ? 1 : PyObject_RichCompareBool(top_id, sid, Py_EQ);
        if (eq < 0)
            return -1;
        if (eq) {  /* list.pop() without a shrink: the list keeps its room for the next push */
            Py_SET_SIZE(st, n - 1);
            Py_DECREF(top);
            return 0;
        }
    }
    /* closed out of order (generator/async misuse) */
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(st); i++) {
        PyObject *e = PyList_GET_ITEM(st, i);
        Py_INCREF(e);
        PyObject *eid = PySequence_GetItem(e, 0);
        int ne = eid == NULL ? -1 : PyObject_RichCompareBool(eid, sid, Py_NE);
        Py_XDECREF(eid);
        if (ne < 0 || (ne && PyList_Append(keep, e) < 0)) {
            Py_DECREF(e);
            Py_DECREF(keep);
            return -1;
        }
        Py_DECREF(e);
    }
    int rc = PyList_SetSlice(st, 0, PyList_GET_SIZE(st), keep);
    Py_DECREF(keep);
    return rc;
}

static PyObject *
error_text(PyObject *et, PyObject *ev)
{
    /* f"{et.__name__}: {ev}" */
    PyObject *name = PyObject_GetAttr(et, s_name);
    if (name == NULL)
        return NULL;
    PyObject *a = PyObject_Format(name, s_empty);
    Py_DECREF(name);
    if (a == NULL)
        return NULL;
    PyObject *b = PyObject_Format(ev, s_empty);
    if (b == NULL) {
        Py_DECREF(a);
        return NULL;
    }
    PyObject *parts[3] = {a, s_colon, b};
    PyObject *seq = PyTuple_New(3);
    PyObject *out = NULL;
    if (seq != NULL) {
        for (int i = 0; i < 3; i++) {
            Py_INCREF(parts[i]);
            PyTuple_SET_ITEM(seq, i, parts[i]);
        }
        out = PyUnicode_Join(s_empty, seq);
        Py_DECREF(seq);
    }
    Py_DECREF(a);
    Py_DECREF(b);
    return out;
}

/* regions._same_queue: one OpenCL queue (two pyopencl wrappers of it are different objects); -1 on error. */
static int
same_queue(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    PyObject *pa = PyObject_GetAttr(a, s_int_ptr), *pb = pa == NULL ? NULL : PyObject_GetAttr(b, s_int_ptr);
    if (pb == NULL) {
        Py_XDECREF(pa);
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int same = PyObject_RichCompareBool(pa, pb, Py_EQ);
    Py_DECREF(pa);
    Py_DECREF(pb);
    return same;
}

static PyObject *
region_exit(Region *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->st == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cltrace: region exited without being entered");
        return NULL;
    }
    PyObject *et = args[0], *ev = args[1];
    PyObject *q = self->queue;
    PyObject *ev1 = Py_None, *dev0 = self->ev0 ? self->ev0 : Py_None;
    Py_INCREF(q);  /* set() or a marker call may run Python code */
    Py_INCREF(dev0);
    if (q != Py_None && self->project) {
        /* regions._projected: the thread's last command on q since the region began (its END is the region's
         * device end; the resolver widens the START to its commands' first), a marker where the last went
         * to another queue, host only where it launched nothing. */
        PyObject *last = PyObject_GetAttr(self->st, s_last_ev), *lastq = NULL;
        if (last == NULL || (lastq = PyObject_GetAttr(self->st, s_last_q)) == NULL) {
            Py_XDECREF(last);
            Py_DECREF(q);
            Py_DECREF(dev0);
            return NULL;
        }
        Py_DECREF(dev0);
        int same = 0;
        if (last == Py_None || last == self->ev0) {
            Py_DECREF(last);
            Py_SETREF(q, Py_NewRef(Py_None));
            dev0 = Py_NewRef(Py_None);
        } else if ((same = same_queue(lastq, q)) > 0) {
            dev0 = last;
        } else {
            Py_DECREF(last);
            dev0 = same < 0 ? NULL : PyObject_CallOneArg(g_marker, q);
        }
        Py_DECREF(lastq);
        if (dev0 == NULL) {
            Py_DECREF(q);
            return NULL;
        }
        Py_INCREF(ev1);
    } else if (q != Py_None) {
        ev1 = PyObject_CallOneArg(g_marker, q);
        if (ev1 == NULL) {
            Py_DECREF(q);
            Py_DECREF(dev0);
            return NULL;
        }
    } else {
        Py_INCREF(ev1);
    }
    int64_t he;
    PyObject *rec = NULL, *key = NULL;
    if (host_now(&he) < 0)
        goto fail;
    PyObject *st = self->st;
    if (pop_entry(st, self->id) < 0)
        goto fail;
    if (PyList_GET_SIZE(st) == 0 && self->project && /* the thread's last command is no region's end now */
        (PyObject_SetAttr(st, s_last_q, Py_None) < 0 || PyObject_SetAttr(st, s_last_ev, Py_None) < 0))
        goto fail;
    key = PyObject_GetAttr(st, s_key);
    if (key == NULL)
        goto fail;
    rec = quiet_tuple(N_FIELDS);
    if (rec == NULL)
        goto fail;
    PyObject *status = Py_None, *error;
    if (et == Py_None) {
        error = Py_None;
        Py_INCREF(error);
    } else {
        status = g_status_error;
        error = error_text(et, ev);
        if (error == NULL)
            goto fail;
    }
    PyObject *hb = PyLong_FromLongLong(self->hb), *he_o = PyLong_FromLongLong(he);
    if (hb == NULL || he_o == NULL) {
        Py_XDECREF(hb);
        Py_XDECREF(he_o);
        Py_DECREF(error);
        goto fail;
    }
    PyObject *attrs = self->attrs ? self->attrs : Py_None;
#define PUT(i, o) do { Py_INCREF(o); PyTuple_SET_ITEM(rec, i, o); } while (0)
    PUT(R_CAT, self->cat);
    PUT(R_NAME, self->name);
    PUT(R_ID, self->id);
    PUT(R_PARENT, self->parent);
    PUT(R_PATH, self->path);
    PyTuple_SET_ITEM(rec, R_THREAD, key);
    key = NULL;
    PyTuple_SET_ITEM(rec, R_HB, hb);
    PyTuple_SET_ITEM(rec, R_HE, he_o);
    PyTuple_SET_ITEM(rec, R_QUEUE, q);
    q = NULL;
    PyTuple_SET_ITEM(rec, R_EV0, dev0);
    dev0 = NULL;
    PyTuple_SET_ITEM(rec, R_EV1, ev1);
    ev1 = NULL;
    PUT(R_ATTRS, attrs);
    PUT(R_STATUS, status);
    PyTuple_SET_ITEM(rec, R_ERROR, error);
    PUT(R_SITE, self->site ? self->site : Py_None);
#undef PUT
    untrack_record(rec);
    int ok = push_record(rec);
    Py_DECREF(rec);
    rec = NULL;
    if (ok < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(q);
    Py_XDECREF(dev0);
    Py_XDECREF(ev1);
    Py_XDECREF(key);
    Py_XDECREF(rec);
    return NULL;
}

static PyObject *
region_set(Region *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "set() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->attrs == NULL || self->attrs == Py_None) {
        PyObject *d = PyDict_New();
        if (d == NULL)
            return NULL;
        Py_XSETREF(self->attrs, d);
    }
    PyObject *attrs = self->attrs;
    Py_INCREF(attrs);
    int rc = PyObject_SetItem(attrs, args[0], args[1]);
    Py_DECREF(attrs);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
region_decorate(Region *self, PyObject *fn)
{
    if (!ready())
        return NULL;
    PyObject *a[5] = {fn, self->name, self->queue, self->attrs ? self->attrs : Py_None, self->cat};
    return PyObject_Vectorcall(g_decorate, a, 5, NULL);
}

/* Calling a region: with one function, decorate it (``@region(...)``); with no argument, enter;
 * with three, exit. ``with`` looks ``__enter__``/``__exit__`` up through ``EnterExit`` below, which
 * hands back the region itself rather than a new bound method: two allocations fewer per region. */
static PyObject *
region_dispatch(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        if (n == 0)
            return region_enter((Region *)self, NULL);
        if (n == 3)
            return region_exit((Region *)self, args, 3);
        if (n == 1)
            return region_decorate((Region *)self, args[0]);
    }
    PyErr_SetString(PyExc_TypeError, "a region is called with one function (as a decorator)");
    return NULL;
}

typedef struct {
    PyObject_HEAD
    PyObject *method; /* the plain method descriptor, for access through the class */
} EnterExit;

static PyObject *
enterexit_get(EnterExit *d, PyObject *obj, PyObject *type)
{
    PyObject *out = (obj == NULL || obj == Py_None) ? d->method : obj;
    Py_INCREF(out);
    return out;
}

static void
enterexit_dealloc(EnterExit *d)
{
    Py_XDECREF(d->method);
    PyObject_Free(d);
}

static PyTypeObject EnterExitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cltrace._ext.region.EnterExit",
    .tp_basicsize = sizeof(EnterExit),
    .tp_dealloc = (destructor)enterexit_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_descr_get = (descrgetfunc)enterexit_get,
};

static PyMethodDef enter_exit_defs[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL, NULL},
};

static PyMethodDef region_methods[] = {
    {"set", (PyCFunction)(void (*)(void))region_set, METH_FASTCALL, "set(key, value): attach an attribute to this region."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef region_members[] = {
    {"name", T_OBJECT, offsetof(Region, name), 0, NULL},
    {"queue", T_OBJECT, offsetof(Region, queue), 0, NULL},
    {"attrs", T_OBJECT, offsetof(Region, attrs), 0, NULL},
    {"cat", T_OBJECT, offsetof(Region, cat), 0, NULL},
    {"project", T_BOOL, offsetof(Region, project), 0, NULL},
    /* the Python class's slots, readable once entered */
    {"_st", T_OBJECT_EX, offsetof(Region, st), READONLY, NULL},
    {"_id", T_OBJECT_EX, offsetof(Region, id), READONLY, NULL},
    {"_parent", T_OBJECT_EX, offsetof(Region, parent), READONLY, NULL},
    {"_path", T_OBJECT_EX, offsetof(Region, path), READONLY, NULL},
    {"_ev0", T_OBJECT_EX, offsetof(Region, ev0), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
region_get_hb(Region *self, void *closure)
{
    if (self->st == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_hb");
        return NULL;
    }
    return PyLong_FromLongLong(self->hb);
}

static PyGetSetDef region_getset[] = {
    {"_hb", (getter)region_get_hb, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cltrace._ext.region.Region",
    .tp_basicsize = sizeof(Region),
    .tp_dealloc = (destructor)region_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Region, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A named region (regions._Region in C): Region(name, queue=None, attrs=None, cat='region').",
    .tp_traverse = (traverseproc)region_traverse,
    .tp_clear = (inquiry)region_clear,
    .tp_methods = region_methods,
    .tp_members = region_members,
    .tp_getset = region_getset,
    .tp_new = region_new,
    .tp_vectorcall = region_vectorcall,
};

static PyObject *
mod_init(PyObject *mod, PyObject *args)
{
    PyObject *tls, *ids, *pending, *recorder, *marker, *decorate, *status_error, *region_cat;
    int per_os_thread, reaper = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOp|p:init", &tls, &ids, &pending, &recorder, &marker, &decorate,
                          &status_error, &region_cat, &per_os_thread, &reaper))
        return NULL;
    if (reaper && !reaper_available())
        return PyErr_Format(PyExc_RuntimeError, "init: reaper=True but the reaper does not run (stamps.init first)");
    g_reaper = reaper;
    if (Py_TYPE(ids)->tp_iternext == NULL)
        return PyErr_Format(PyExc_TypeError, "init: ids must be an iterator (itertools.count)");
    PyObject *append = PyObject_GetAttrString(pending, "append");
    if (append == NULL)
        return NULL;
#define KEEP(g, o) do { Py_INCREF(o); Py_XSETREF(g, o); } while (0)
    KEEP(g_tls, tls);
    KEEP(g_ids, ids);
    KEEP(g_pending, pending);
    Py_XSETREF(g_append, append);
    KEEP(g_recorder, recorder);
    KEEP(g_marker, marker);
    KEEP(g_decorate, decorate);
    KEEP(g_status_error, status_error);
    KEEP(g_region_cat, region_cat);
#undef KEEP
    g_cache_stack = per_os_thread;
    Py_RETURN_NONE;
}

/* record_launch(name, queue, event, host_begin, host_end, cat, attrs, site): ``regions._record_py`` in C,
 * one enqueued command's record under the thread's innermost region; returns its span id. */
static PyObject *
record_command(PyObject *const *args)
{
    PyObject *st = thread_stack();
    if (st == NULL)
        return NULL;
    PyObject *parent, *path;
    if (stack_top(st, &parent, &path) < 0) {
        Py_DECREF(st);
        return NULL;
    }
    PyObject *key = PyObject_GetAttr(st, s_key);
    if (key == NULL) {
        Py_DECREF(st);
        return NULL;
    }
    PyObject *sid = Py_TYPE(g_ids)->tp_iternext(g_ids);
    PyObject *rec = sid == NULL ? NULL : quiet_tuple(N_FIELDS);
    if (rec == NULL) {
        Py_XDECREF(sid);
        Py_DECREF(key);
        Py_DECREF(st);
        return NULL;
    }
#define PUT(i, o) do { Py_INCREF(o); PyTuple_SET_ITEM(rec, i, o); } while (0)
    PUT(R_CAT, args[5]);
    PUT(R_NAME, args[0]);
    PUT(R_ID, sid);
    PUT(R_PARENT, parent);
    PUT(R_PATH, path);
    PyTuple_SET_ITEM(rec, R_THREAD, key);
    PUT(R_HB, args[3]);
    PUT(R_HE, args[4]);
    PUT(R_QUEUE, args[1]);
    PUT(R_EV0, args[2]);
    PUT(R_EV1, Py_None);
    PUT(R_ATTRS, args[6]);
    PUT(R_STATUS, Py_None);
    PUT(R_ERROR, Py_None);
    PUT(R_SITE, args[7]);
#undef PUT
    untrack_record(rec);
    int ok = push_record(rec);
    Py_DECREF(rec);
    if (ok == 0 && note_last(st, args[1], args[2]) < 0)
        ok = -1;
    Py_DECREF(st);
    if (ok < 0) {
        Py_DECREF(sid);
        return NULL;
    }
    return sid;
}

static PyObject *
mod_record_launch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "record_launch() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!ready())
        return NULL;
    return record_command(args);
}

/* ---- launch(kernel, queue, global_size, local_size, *args, wait_for=None, name=None) ------------
 * ``regions.launch`` in C for a kernel it has seen: one flag read and the kernel's own call when off;
 * on, two clock reads around the call and the record, without a Python frame of its own. A kernel
 * not in ``regions._KERNELS`` yet, a keyword it does not know and the error path go to Python. */
static PyObject *g_state, *g_kernels, *g_attrs_cache, *g_launch_py, *g_attrs_py, *g_failed_launch, *g_cl_error,
    *g_kernel_cat, *g_kw_wait_for;
static PyObject *s_enabled, *s_instrumented, *s_wait_for, *s_name_kw;

/* kernel(queue, global_size, local_size, *args, wait_for=wait_for): a new reference, or NULL. */
static PyObject *
call_kernel(PyObject *kernel, PyObject *const *args, Py_ssize_t n, PyObject *wait_for)
{
    PyObject *small[16], **argv = small;
    if (n + 1 > 16 && (argv = PyMem_Malloc((size_t)(n + 1) * sizeof(PyObject *))) == NULL)
        return PyErr_NoMemory();
    memcpy(argv, args, (size_t)n * sizeof(PyObject *));
    argv[n] = wait_for;
    PyObject *ev = PyObject_Vectorcall(kernel, argv, (size_t)n, g_kw_wait_for);
    if (argv != small)
        PyMem_Free(argv);
    return ev;
}

/* Set while ``launch``/``copy`` enqueue (this thread's): pyopencl's hooks, installed while tracing,
 * then leave the command to them, which record it under its own name (``own()``). */
static _Thread_local int t_own;

static PyObject *
call_own(PyObject *kernel, PyObject *const *args, Py_ssize_t n, PyObject *wait_for)
{
    const int was = t_own;
    t_own = 1;
    PyObject *ev = call_kernel(kernel, args, n, wait_for);
    t_own = was;
    return ev;
}

static PyObject *
mod_own(PyObject *mod, PyObject *unused)
{
    return PyBool_FromLong(t_own);
}

static PyObject *
mod_set_own(PyObject *mod, PyObject *flag)
{
    const int was = t_own;
    t_own = PyObject_IsTrue(flag) > 0;
    return PyBool_FromLong(was);
}

static int
state_flag(PyObject *name)
{
    PyObject *v = PyObject_GetAttr(g_state, name);
    if (v == NULL)
        return -1;
    int on = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return on;
}

/* Gate(original, hook): what pyopencl's hooked entry points become. A call goes straight to ``original``
 * with tracing off or inside ``launch``/``copy`` (``t_own``), without a Python frame; else to ``hook``. */
typedef struct {
    PyObject_HEAD
    PyObject *original, *hook;
    vectorcallfunc vectorcall;
} Gate;

static PyObject *
gate_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Gate *g = (Gate *)self;
    int on = t_own ? 0 : (g_state == NULL ? 1 : state_flag(s_enabled));
    if (on < 0)
        return NULL;
    return PyObject_Vectorcall(on ? g->hook : g->original, args, nargsf, kwnames);
}

static PyObject *
gate_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *original, *hook;
    if (!PyArg_ParseTuple(args, "OO:Gate", &original, &hook))
        return NULL;
    Gate *g = (Gate *)type->tp_alloc(type, 0);
    if (g == NULL)
        return NULL;
    g->original = Py_NewRef(original);
    g->hook = Py_NewRef(hook);
    g->vectorcall = gate_vectorcall;
    return (PyObject *)g;
}

static int
gate_traverse(Gate *g, visitproc visit, void *arg)
{
    Py_VISIT(g->original);
    Py_VISIT(g->hook);
    return 0;
}

static int
gate_clear(Gate *g)
{
    Py_CLEAR(g->original);
    Py_CLEAR(g->hook);
    return 0;
}

static void
gate_dealloc(Gate *g)
{
    PyObject_GC_UnTrack(g);
    gate_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyMemberDef gate_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Gate, original), READONLY, "the entry point the gate stands in front of"},
    {"hook", T_OBJECT, offsetof(Gate, hook), READONLY, "what records the call while tracing"},
    {NULL},
};

static PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cltrace._ext.region.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Gate(original, hook): calls original with tracing off or inside launch/copy, else hook.",
    .tp_new = gate_new,
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Gate, vectorcall),
    .tp_members = gate_members,
};

/* The shared attrs dict of a launch shape (regions._launch_attrs), a new reference. */
static PyObject *
launch_attrs(PyObject *gs, PyObject *ls)
{
    PyObject *key = PyTuple_Pack(2, gs, ls);
    if (key == NULL)
        return NULL;
    PyObject *attrs = PyDict_GetItemWithError(g_attrs_cache, key);
    Py_DECREF(key);
    if (attrs != NULL)
        return Py_NewRef(attrs);
    PyErr_Clear(); /* not there, or unhashable sizes (lists): Python makes them */
    PyObject *pair[2] = {gs, ls};
    return PyObject_Vectorcall(g_attrs_py, pair, 2, NULL);
}

/* The pyopencl error in flight, replaced by failed_launch's (its span recorded), raised "from None". */
static void
launch_failed(PyObject *name, PyObject *const *args, int64_t hb, PyObject *kernel)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    PyObject *hb_o = PyLong_FromLongLong(hb);
    PyObject *err = NULL;
    if (hb_o != NULL && v != NULL) {
        PyObject *fargs[7] = {v, name, args[2], args[3], hb_o, kernel, args[1]};
        err = PyObject_Vectorcall(g_failed_launch, fargs, 7, NULL);
    }
    Py_XDECREF(hb_o);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    if (err == NULL) {
        Py_XDECREF(v);
        return;
    }
    PyException_SetCause(err, NULL); /* __suppress_context__ = True */
    PyException_SetContext(err, v);  /* steals v */
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(err)), err, NULL);
}

static PyObject *
mod_launch(PyObject *mod, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (g_launch_py == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cltrace._ext.region: launch_init() was not called");
        return NULL;
    }
    PyObject *wait_for = Py_None, *name = Py_None;
    const Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int unusual = nargs < 4;
    for (Py_ssize_t i = 0; i < nkw && !unusual; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == s_wait_for || PyUnicode_Compare(k, s_wait_for) == 0)
            wait_for = args[nargs + i];
        else if (k == s_name_kw || PyUnicode_Compare(k, s_name_kw) == 0)
            name = args[nargs + i];
        else
            unusual = 1;
    }
    if (unusual) /* Python raises the TypeError a wrong call deserves */
        return PyObject_Vectorcall(g_launch_py, args, nargsf, kwnames);
    PyObject *kernel = args[0];
    int on = state_flag(s_enabled), hooked = 0;
    if (on > 0 && (hooked = state_flag(s_instrumented)) < 0)
        return NULL;
    if (on < 0)
        return NULL;
    if (!on)
        return call_kernel(kernel, args + 1, nargs - 1, wait_for);
    PyObject *key = PyLong_FromVoidPtr(kernel);
    if (key == NULL)
        return NULL;
    PyObject *known = PyDict_GetItemWithError(g_kernels, key);
    Py_DECREF(key);
    if (known == NULL && PyErr_Occurred())
        return NULL;
    if (known == NULL || !PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 2 || PyTuple_GET_ITEM(known, 0) != kernel)
        return PyObject_Vectorcall(g_launch_py, args, nargsf, kwnames); /* learns the kernel's name */
    PyObject *own = PyTuple_GET_ITEM(known, 1);
    if (own == Py_None) /* a cltrace.Kernel: it records its own launches */
        return call_kernel(kernel, args + 1, nargs - 1, wait_for);
    int named = name == Py_None ? 0 : PyObject_IsTrue(name);
    if (named < 0)
        return NULL;
    name = Py_NewRef(named ? name : own); /* held: the call may clear the cache */
    int64_t hb, he;
    if (host_now(&hb) < 0) {
        Py_DECREF(name);
        return NULL;
    }
    PyObject *ev = hooked ? call_own(kernel, args + 1, nargs - 1, wait_for)
                          : call_kernel(kernel, args + 1, nargs - 1, wait_for);
    if (ev == NULL) {
        if (PyErr_ExceptionMatches(g_cl_error))
            launch_failed(name, args, hb, kernel);
        Py_DECREF(name);
        return NULL;
    }
    PyObject *hb_o = NULL, *he_o = NULL, *attrs = NULL, *site = NULL, *sid = NULL;
    if (host_now(&he) < 0 || (hb_o = PyLong_FromLongLong(hb)) == NULL || (he_o = PyLong_FromLongLong(he)) == NULL ||
        (attrs = launch_attrs(args[2], args[3])) == NULL)
        goto done;
    if (g_site_depth > 0) {
        PyFrameObject *f = PyEval_GetFrame();
        Py_XINCREF(f);
        site = f == NULL ? Py_NewRef(Py_None) : capture_from(f);
        Py_XDECREF(f);
    } else {
        site = Py_NewRef(Py_None);
    }
    if (site == NULL || !ready())
        goto done;
    PyObject *rargs[8] = {name, args[1], ev, hb_o, he_o, g_kernel_cat, attrs, site};
    sid = record_command(rargs);
done:
    Py_XDECREF(hb_o);
    Py_XDECREF(he_o);
    Py_XDECREF(attrs);
    Py_XDECREF(site);
    Py_DECREF(name);
    if (sid == NULL) {
        Py_DECREF(ev);
        return NULL;
    }
    Py_DECREF(sid);
    return ev;
}

static PyObject *
mod_launch_init(PyObject *mod, PyObject *args)
{
    PyObject *state, *kernels, *attrs_cache, *launch_py, *attrs_py, *failed, *cl_error, *kernel_cat;
    if (!PyArg_ParseTuple(args, "OO!O!OOOOU:launch_init", &state, &PyDict_Type, &kernels, &PyDict_Type, &attrs_cache,
                          &launch_py, &attrs_py, &failed, &cl_error, &kernel_cat))
        return NULL;
    PyObject *kw = PyTuple_Pack(1, s_wait_for);
    if (kw == NULL)
        return NULL;
    Py_XSETREF(g_kw_wait_for, kw);
#define KEEP(g, o) do { Py_INCREF(o); Py_XSETREF(g, o); } while (0)
    KEEP(g_state, state);
    g_project_state = g_state;
    KEEP(g_kernels, kernels);
    KEEP(g_attrs_cache, attrs_cache);
    KEEP(g_attrs_py, attrs_py);
    KEEP(g_failed_launch, failed);
    KEEP(g_cl_error, cl_error);
    KEEP(g_kernel_cat, kernel_cat);
    KEEP(g_launch_py, launch_py);
#undef KEEP
    Py_RETURN_NONE;
}

static PyObject *
mod_now(PyObject *mod, PyObject *unused)
{
    int64_t t;
    if (host_now(&t) < 0)
        return NULL;
    return PyLong_FromLongLong(t);
}

static PyMethodDef methods[] = {
    {"init", mod_init, METH_VARARGS,
     "init(tls, ids, pending, recorder, marker, decorate, status_error, region_cat, per_os_thread, reaper=False): "
     "share the Python state (per_os_thread: tls is a plain threading.local; reaper: trade records' events "
     "for the reaper's tickets, as stamps.reaper() says it can)."},
    {"push", mod_push, METH_O, "push(rec): append a raw record (untracked by the cyclic GC) to the pending deque, with back-pressure."},
    {"record_launch", (PyCFunction)(void (*)(void))mod_record_launch, METH_FASTCALL,
     "record_launch(name, queue, event, host_begin, host_end, cat, attrs, site): one enqueued command's record; its span id."},
    {"launch", (PyCFunction)(void (*)(void))mod_launch, METH_FASTCALL | METH_KEYWORDS,
     "launch(kernel, queue, global_size, local_size, *args, wait_for=None, name=None)\n--\n\n"
     "Enqueue a pyopencl kernel and record it (when tracing is on). Returns the event.\n\n"
     "Under ``cltrace.instrument()`` pyopencl's own launch is recorded, and a ``cltrace.Kernel`` records its\n"
     "own launches, so then this records nothing more (``name`` is not used). A failed enqueue leaves a\n"
     "failed span and raises the same pyopencl error, naming the kernel and its sizes.\n"
     "(regions.launch in C: a kernel seen before is launched and recorded without a Python frame.)"},
    {"own", mod_own, METH_NOARGS, "own(): whether this thread is inside launch/copy's enqueue (pyopencl's hooks stand aside)."},
    {"set_own", mod_set_own, METH_O, "set_own(flag): set it (launch/copy's Python side); returns what it was."},
    {"launch_init", mod_launch_init, METH_VARARGS,
     "launch_init(state, kernels, attrs_cache, launch_py, launch_attrs, failed_launch, cl_error, kernel_cat): "
     "share regions' state with launch."},
    {"now", mod_now, METH_NOARGS, "The host clock in ns, read as time.perf_counter_ns() reads it."},
    {"site", (PyCFunction)(void (*)(void))mod_site, METH_FASTCALL,
     "site(skip=1): the raw call site (code, offset, ...) of the first user frames above the caller's skip - 1."},
    {"site_config", mod_site_config, METH_VARARGS,
     "site_config(classify, generation, depth): callsite's library test, its generation and stack depth."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.region",
    "The enabled region's enter/exit in C (see cltrace.record.regions).", -1, methods,
};

PyObject *
cltrace_region_module(void)
{
    QuietTupleType.tp_base = &PyTuple_Type;
    if (PyType_Ready(&QuietTupleType) < 0 || PyType_Ready(&EnterExitType) < 0 || PyType_Ready(&RegionType) < 0 ||
        PyType_Ready(&GateType) < 0)
        return NULL;
    for (int i = 0; i < 2; i++) {
        EnterExit *d = PyObject_New(EnterExit, &EnterExitType);
        if (d == NULL)
            return NULL;
        d->method = PyDescr_NewMethod(&RegionType, &enter_exit_defs[i]);
        if (d->method == NULL || PyDict_SetItemString(RegionType.tp_dict, enter_exit_defs[i].ml_name, (PyObject *)d) < 0) {
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(d);
    }
    PyType_Modified(&RegionType);
#define STR(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return NULL
    STR(s_stack, "stack");
    STR(s_key, "key");
    STR(s_last_q, "last_q");
    STR(s_last_ev, "last_ev");
    STR(s_int_ptr, "int_ptr");
    STR(s_project, "PROJECT_REGIONS");
    STR(s_room, "room");
    STR(s_tickets_above, "tickets_above");
    STR(s_drain, "make_room");
    STR(s_name, "__name__");
    STR(s_empty, "");
    STR(s_colon, ": ");
    STR(s_enabled, "ENABLED");
    STR(s_instrumented, "INSTRUMENTED");
    STR(s_wait_for, "wait_for");
    STR(s_name_kw, "name");
#undef STR
    if ((g_zero = PyLong_FromLong(0)) == NULL || (g_empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
#if !NATIVE_CLOCK
    PyObject *time_mod = PyImport_ImportModule("time");
    if (time_mod == NULL)
        return NULL;
    g_perf_ns = PyObject_GetAttrString(time_mod, "perf_counter_ns");
    Py_DECREF(time_mod);
    if (g_perf_ns == NULL)
        return NULL;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RegionType);
    Py_INCREF(&GateType);
    if (PyModule_AddObject(m, "Gate", (PyObject *)&GateType) < 0 ||
        PyModule_AddObject(m, "Region", (PyObject *)&RegionType) < 0 ||
        PyModule_AddIntConstant(m, "NATIVE_CLOCK", NATIVE_CLOCK) < 0) {
        Py_DECREF(&RegionType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
