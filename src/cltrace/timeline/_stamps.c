/* Bulk reads of OpenCL event profiling stamps, without the GIL.
 *
 * The interface is arrays in, arrays out (any contiguous buffer; ``stamps.py`` passes numpy arrays):
 *   init(path)                        resolve the three OpenCL entry points in the library at ``path``
 *                                     (the one pyopencl has loaded); OSError if it cannot
 *   handles(events, out)              out[i] = events[i].int_ptr (uint64 buffer)
 *   read(handles, status, stamps)     status[i] (int32) and stamps[i][0..3] (int64): QUEUED, SUBMIT,
 *                                     START, END. 0: complete, stamps read; > 0: still queued/submitted/
 *                                     running; < 0: the command failed, or its stamps cannot be read
 *                                     (the OpenCL error). Stamps are 0 unless the status is 0.
 *   columns(records, ints, handles, names, cats, paths)
 *                                     one pass over raw records (see below) into int64 columns and
 *                                     the events' handles, instead of a transpose and a dozen passes
 *   columns_read(records, ints, handles, names, cats, paths, status, stamps)
 *                                     the same, and each record's stamps (a region's two markers in one
 *                                     row), read chunk by chunk without the GIL right after the handles
 *   wait(handles)                     clWaitForEvents on all of them; on an error (a failed command),
 *                                     waits on each one alone so the others still complete
 *
 * No OpenCL header or link-time library: the few types and constants are declared here and the
 * functions come from dlopen/dlsym at run time, so the module builds anywhere a C compiler does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../_ext.h"
#include <stdint.h>
#include <string.h>

#include "_opencl.h"
#include "_reaper.h"

static PyObject *
stamps_init(PyObject *self, PyObject *args)
{
    const char *path;
    if (!PyArg_ParseTuple(args, "s:init", &path))
        return NULL;
    if (opencl_load(path) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
ready(void)
{
    if (get_profiling_info == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cltrace._ext.stamps: init(path) was not called");
        return 0;
    }
    return 1;
}

/* Python ints to C. PyLong_AsLongLong and PyLong_AsUnsignedLongLong go through _PyLong_AsByteArray for
 * every int of more than one 30-bit digit (stamps, thread keys, pointers: all of them here), a byte loop
 * that measured as the pass's largest cost; PyLong_AsLongLongAndOverflow folds the digits directly. */
static inline int
as_i64(PyObject *v, int64_t *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "columns: a record's integer field does not fit in int64");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

static inline int
as_u64(PyObject *v, uint64_t *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) { /* at or above 2**63: the slow, exact conversion */
        *out = (uint64_t)PyLong_AsUnsignedLongLong(v);
        return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < 0) {
        PyErr_SetString(PyExc_OverflowError, "a handle is negative");
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

/* ``ev.int_ptr`` without the attribute protocol: pyopencl's Event exposes it as a property, so the getter of
 * the last event type seen is called directly (looked up again whenever the type changes, each call of
 * ``columns``), and anything else is asked through getattr. */
typedef struct {
    PyTypeObject *type; /* borrowed: the records hold instances of it for the whole call */
    PyObject *fget;     /* owned, or NULL: the type's int_ptr is not a plain property */
} getter_cache;

static int
handle_of(PyObject *ev, PyObject *attr, getter_cache *gc, uint64_t *out)
{
    PyTypeObject *tp = Py_TYPE(ev);
    if (tp != gc->type) {
        Py_CLEAR(gc->fget);
        gc->type = tp;
        PyObject *descr = PyObject_GetAttr((PyObject *)tp, attr);
        if (descr == NULL)
            PyErr_Clear();
        else if (Py_IS_TYPE(descr, &PyProperty_Type))
            gc->fget = PyObject_GetAttrString(descr, "fget");
        if (gc->fget == NULL || gc->fget == Py_None) {
            PyErr_Clear();
            Py_CLEAR(gc->fget);
        }
        Py_XDECREF(descr);
    }
    PyObject *v = gc->fget != NULL ? PyObject_Vectorcall(gc->fget, &ev, 1, NULL) : PyObject_GetAttr(ev, attr);
    if (v == NULL)
        return -1;
    int err = as_u64(v, out);
    Py_DECREF(v);
    return err;
}

static PyObject *
stamps_handles(PyObject *self, PyObject *args)
{
    PyObject *events, *seq, *name;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Ow*:handles", &events, &out))
        return NULL;
    seq = PySequence_Fast(events, "handles: events must be a sequence");
    if (seq == NULL) {
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (out.len != n * (Py_ssize_t)sizeof(uint64_t)) {
        PyErr_Format(PyExc_ValueError, "handles: out holds %zd bytes, need %zd", out.len, n * (Py_ssize_t)sizeof(uint64_t));
        goto fail;
    }
    name = PyUnicode_InternFromString("int_ptr");
    if (name == NULL)
        goto fail;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint64_t *dst = (uint64_t *)out.buf;
    getter_cache getter = {NULL, NULL};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (handle_of(items[i], name, &getter, &dst[i])) {
            Py_XDECREF(getter.fget);
            Py_DECREF(name);
            goto fail;
        }
    }
    Py_XDECREF(getter.fget);
    Py_DECREF(name);
    Py_DECREF(seq);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    PyBuffer_Release(&out);
    return NULL;
}

/* ``read_one`` of an event whose END alone is wanted (a region's second marker): one call where it completed. */
static cl_int
read_end(cl_event ev, int64_t *end)
{
    cl_ulong v;
    cl_int err = get_profiling_info(ev, CL_PROFILING_COMMAND_END, sizeof(cl_ulong), &v, NULL);
    if (err == CL_SUCCESS) {
        *end = (int64_t)v;
        return CL_COMPLETE;
    }
    int64_t st[4] = {0, 0, 0, 0};
    cl_int status = read_one(ev, st); /* not complete, failed, or no profiling: as read_one says */
    *end = st[3];
    return status;
}

static PyObject *
stamps_read(PyObject *self, PyObject *args)
{
    Py_buffer h, s, t;
    if (!ready())
        return NULL;
    if (!PyArg_ParseTuple(args, "y*w*w*:read", &h, &s, &t))
        return NULL;
    Py_ssize_t n = h.len / (Py_ssize_t)sizeof(uint64_t);
    if (h.len % (Py_ssize_t)sizeof(uint64_t) || s.len != n * (Py_ssize_t)sizeof(int32_t) ||
        t.len != n * 4 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "read: need uint64[N], int32[N], int64[N, 4] buffers; got %zd, %zd, %zd bytes",
                     h.len, s.len, t.len);
        PyBuffer_Release(&h);
        PyBuffer_Release(&s);
        PyBuffer_Release(&t);
        return NULL;
    }
    const uint64_t *hs = (const uint64_t *)h.buf;
    int32_t *status = (int32_t *)s.buf;
    int64_t *st = (int64_t *)t.buf;
    /* One thread: NVIDIA's driver serialises these calls (measured on an H200: 1.8M events/s on one
     * thread, 0.94M on two, 0.53M on eight), and PoCL's answer in ~40 ns an event. */
    Py_BEGIN_ALLOW_THREADS
    memset(st, 0, (size_t)n * 4 * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++)
        status[i] = read_one((cl_event)(uintptr_t)hs[i], st + 4 * i);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&h);
    PyBuffer_Release(&s);
    PyBuffer_Release(&t);
    Py_RETURN_NONE;
}

static PyObject *
stamps_wait(PyObject *self, PyObject *args)
{
    Py_buffer h;
    if (!ready())
        return NULL;
    if (!PyArg_ParseTuple(args, "y*:wait", &h))
        return NULL;
    if (h.len % (Py_ssize_t)sizeof(uint64_t)) {
        PyBuffer_Release(&h);
        return PyErr_Format(PyExc_ValueError, "wait: need a uint64[N] buffer, got %zd bytes", h.len);
    }
    Py_ssize_t n = h.len / (Py_ssize_t)sizeof(uint64_t);
    const uint64_t *hs = (const uint64_t *)h.buf;
    Py_BEGIN_ALLOW_THREADS
    if (sizeof(cl_event) == sizeof(uint64_t)) {
        wait_all((const cl_event *)hs, (size_t)n);
    } else { /* a handle narrower than 64 bits: one by one */
        for (Py_ssize_t i = 0; i < n; i++) {
            cl_event ev = (cl_event)(uintptr_t)hs[i];
            wait_all(&ev, 1);
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&h);
    Py_RETURN_NONE;
}

/* transpose(records): the columns of a list of equal-length tuples, as list(zip(*records)) gives
   them, in one pass (the resolver's first step on every batch). */
static PyObject *stamps_transpose(PyObject *self, PyObject *records) {
    (void)self;
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "transpose: records must be a list of tuples");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    if (n == 0)
        return PyList_New(0);
    PyObject *first = PyList_GET_ITEM(records, 0);
    if (!PyTuple_Check(first)) {
        PyErr_SetString(PyExc_TypeError, "transpose: records must be tuples");
        return NULL;
    }
    Py_ssize_t w = PyTuple_GET_SIZE(first);
    PyObject *out = PyList_New(w);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < w; j++) {
        PyObject *col = PyTuple_New(n);
        if (col == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, col);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != w) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "transpose: records must be tuples of one length");
            return NULL;
        }
        for (Py_ssize_t j = 0; j < w; j++) {
            PyObject *v = PyTuple_GET_ITEM(rec, j);
            Py_INCREF(v);
            PyTuple_SET_ITEM(PyList_GET_ITEM(out, j), i, v);
        }
    }
    return out;
}

/* columns(records, ints, handles, names, cats, paths): the resolver's first pass over a batch of raw records
 * (tuples laid out as timeline/raw.py says: cat, name, id, parent, path, thread, host_begin, host_end,
 * queue, ev0, ev1, attrs, status, error, site). Fills ints, int64[COLS, N] (rows below), and handles,
 * uint64[2, N]: the int_ptr of ev0 and ev1 where the record has device work, else 0. A name, category or
 * path missing from the dicts ``names``/``cats``/``paths`` (value -> interned id) gets -1, for the caller
 * to intern; a thread key beyond int64 gets 0 and the flag F_BIG_THREAD, for the caller to read from the
 * record. Consecutive records mostly share their name, category and path objects: each is looked up
 * once per run of the same object. */

static int
lookup(PyObject *dict, PyObject *key, int64_t *out)
{
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        *out = -1;
        return 0;
    }
    return as_i64(v, out);
}

/* ``lookup`` of ``key``, or the previous answer where ``key`` is the object looked up last. */
typedef struct {
    PyObject *key;
    int64_t id;
} last_seen;

static int
lookup_cached(PyObject *dict, PyObject *key, last_seen *last, int64_t *out)
{
    if (key == last->key && last->id >= 0) {
        *out = last->id;
        return 0;
    }
    if (lookup(dict, key, out))
        return -1;
    last->key = key; /* borrowed: the records hold every key for the whole call */
    last->id = *out;
    return 0;
}

/* Rows [lo, hi) of ``columns`` (the GIL held). */
static int
fill_rows(PyObject *records, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n, int64_t *c, uint64_t *h0, uint64_t *h1,
          PyObject *names, PyObject *cats, PyObject *paths, PyObject *attr, last_seen *lasts, getter_cache *getter)
{
    last_seen *last_name = &lasts[0], *last_cat = &lasts[1], *last_path = &lasts[2];
    for (Py_ssize_t i = lo; i < hi; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < N_FIELDS) {
            PyErr_SetString(PyExc_TypeError, "columns: records must be tuples of at least 15 fields");
            return -1;
        }
        PyObject **f = &PyTuple_GET_ITEM(r, 0);
        if (as_i64(f[R_ID], &c[C_ID * n + i]) || as_i64(f[R_PARENT], &c[C_PARENT * n + i]) ||
            as_i64(f[R_HB], &c[C_HB * n + i]) || as_i64(f[R_HE], &c[C_HE * n + i]) || lookup_cached(names, f[R_NAME], last_name, &c[C_NAME * n + i]) ||
            lookup_cached(cats, f[R_CAT], last_cat, &c[C_CAT * n + i]) ||
            lookup_cached(paths, f[R_PATH], last_path, &c[C_PATH * n + i]))
            return -1;
        int64_t flags = 0;
        int overflow = 0;
        long long key = PyLong_AsLongLongAndOverflow(f[R_THREAD], &overflow);
        if (key == -1 && PyErr_Occurred())
            return -1;
        if (overflow) { /* a reused thread ident's key (generation above bit 64): the caller reads it */
            flags |= F_BIG_THREAD;
            key = 0;
        }
        c[C_THREAD * n + i] = (int64_t)key;
        c[C_QUEUE * n + i] = f[R_QUEUE] == Py_None ? 0 : (int64_t)(uintptr_t)f[R_QUEUE];
        c[C_SITE * n + i] = (int64_t)(uintptr_t)f[R_SITE];
        h0[i] = h1[i] = 0;
        if (f[R_QUEUE] != Py_None && f[R_EV0] != Py_None) {
            flags |= F_DEV;
            if (PyLong_CheckExact(f[R_EV0])) { /* the reaper's tickets (the hot path traded the events for them) */
                flags |= F_TICKETS;
                if (as_u64(f[R_EV0], &h0[i]))
                    return -1;
                if (f[R_EV1] != Py_None) {
                    flags |= F_TWO;
                    if (as_u64(f[R_EV1], &h1[i]))
                        return -1;
                }
            } else {
                if (handle_of(f[R_EV0], attr, getter, &h0[i]))
                    return -1;
                if (f[R_EV1] != Py_None) {
                    flags |= F_TWO;
                    if (handle_of(f[R_EV1], attr, getter, &h1[i]))
                        return -1;
                }
            }
        }
        if (f[R_STATUS] != Py_None)
            flags |= F_ERROR;
        if (f[R_ATTRS] != Py_None)
            flags |= F_ATTRS;
        c[C_FLAGS * n + i] = flags;
    }
    return 0;
}

/* Rows [lo, hi): status and stamps of the records' events, read without the GIL (tickets' rows are left at 0
 * for the caller, who peeks the reaper). A region's two markers make one row: START is the first marker's END,
 * END the second's; the status is the first failure, else the later of the two. */
static void
read_rows(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t n, const int64_t *c, const uint64_t *h0, const uint64_t *h1,
          int32_t *status, int64_t *st)
{
    for (Py_ssize_t i = lo; i < hi; i++) {
        int64_t flags = c[C_FLAGS * n + i], *row = st + 4 * i;
        row[0] = row[1] = row[2] = row[3] = 0;
        status[i] = 0;
        if (!(flags & F_DEV) || (flags & F_TICKETS))
            continue;
        cl_int s0 = read_one((cl_event)(uintptr_t)h0[i], row);
        if (!(flags & F_TWO)) {
            status[i] = s0;
            continue;
        }
        int64_t end = 0;
        cl_int s1 = read_end((cl_event)(uintptr_t)h1[i], &end);
        row[2] = row[3];
        row[3] = end;
        status[i] = s0 < 0 ? s0 : s1 < 0 ? s1 : (s0 > s1 ? s0 : s1);
    }
}

static int
list_changed(PyObject *records, Py_ssize_t n)
{
    if (PyList_GET_SIZE(records) == n)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "columns: the records list changed size while it was read");
    return 1;
}

/* ``columns`` in chunks, the GIL released between them (and, with ``read``, while each chunk's stamps are read:
 * right after their handles, the events' memory is still at hand). */
enum { CHUNK = 512 };

static PyObject *
columns_impl(PyObject *args, int read)
{
    PyObject *records, *names, *cats, *paths;
    Py_buffer ib, hb, sb = {0}, tb = {0};
    last_seen lasts[3] = {{NULL, -1}, {NULL, -1}, {NULL, -1}};
    getter_cache getter = {NULL, NULL};
    if (read && !ready())
        return NULL;
    if (read ? !PyArg_ParseTuple(args, "O!w*w*O!O!O!w*w*:columns_read", &PyList_Type, &records, &ib, &hb, &PyDict_Type,
                                 &names, &PyDict_Type, &cats, &PyDict_Type, &paths, &sb, &tb)
             : !PyArg_ParseTuple(args, "O!w*w*O!O!O!:columns", &PyList_Type, &records, &ib, &hb, &PyDict_Type, &names,
                                 &PyDict_Type, &cats, &PyDict_Type, &paths))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *attr = NULL;
    if (ib.len != n * N_COLS * (Py_ssize_t)sizeof(int64_t) || hb.len != n * 2 * (Py_ssize_t)sizeof(uint64_t) ||
        (read && (sb.len != n * (Py_ssize_t)sizeof(int32_t) || tb.len != n * 4 * (Py_ssize_t)sizeof(int64_t)))) {
        PyErr_Format(PyExc_ValueError, "columns: need int64[%d, N] and uint64[2, N] buffers (and for columns_read "
                     "int32[N] and int64[N, 4]) for N=%zd", N_COLS, n);
        goto fail;
    }
    attr = PyUnicode_InternFromString("int_ptr");
    if (attr == NULL)
        goto fail;
    int64_t *c = (int64_t *)ib.buf;
    uint64_t *h0 = (uint64_t *)hb.buf, *h1 = h0 + n;
    for (Py_ssize_t lo = 0; lo < n; lo += CHUNK) {
        Py_ssize_t hi = lo + CHUNK < n ? lo + CHUNK : n;
        if (list_changed(records, n) ||
            fill_rows(records, lo, hi, n, c, h0, h1, names, cats, paths, attr, lasts, &getter))
            goto fail;
        Py_BEGIN_ALLOW_THREADS
        if (read)
            read_rows(lo, hi, n, c, h0, h1, (int32_t *)sb.buf, (int64_t *)tb.buf);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(attr);
    Py_XDECREF(getter.fget);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&hb);
    if (read) {
        PyBuffer_Release(&sb);
        PyBuffer_Release(&tb);
    }
    Py_RETURN_NONE;
fail:
    Py_XDECREF(attr);
    Py_XDECREF(getter.fget);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&hb);
    if (read) {
        PyBuffer_Release(&sb);
        PyBuffer_Release(&tb);
    }
    return NULL;
}

static PyObject *
stamps_columns(PyObject *self, PyObject *args)
{
    return columns_impl(args, 0);
}

static PyObject *
stamps_columns_read(PyObject *self, PyObject *args)
{
    return columns_impl(args, 1);
}

/* settle(ints, handles, status, stamps, failed) -> (pending, tickets, devices): after columns_read, the rows holding
 * tickets get what the reaper read (``peek``; a region's two markers combined as columns_read combines events);
 * failed[i] (int8) is 0/1 for them (the reaper knows whether the command failed) and -1 for the other rows (ask
 * the event). Counts: rows still pending (status > 0), rows with tickets, rows with device work. */
static PyObject *
stamps_settle(PyObject *self, PyObject *args)
{
    Py_buffer ib, hb, sb, tb, fb;
    if (!PyArg_ParseTuple(args, "y*y*w*w*w*:settle", &ib, &hb, &sb, &tb, &fb))
        return NULL;
    Py_ssize_t n = sb.len / (Py_ssize_t)sizeof(int32_t), pending = 0, tickets = 0, devices = 0, twos = 0;
    PyObject *out = NULL;
    if (sb.len % (Py_ssize_t)sizeof(int32_t) || ib.len != n * N_COLS * (Py_ssize_t)sizeof(int64_t) ||
        hb.len != 2 * n * (Py_ssize_t)sizeof(uint64_t) || tb.len != 4 * n * (Py_ssize_t)sizeof(int64_t) || fb.len != n) {
        PyErr_Format(PyExc_ValueError, "settle: need int64[%d, N], uint64[2, N], int32[N], int64[N, 4], int8[N]", N_COLS);
        goto done;
    }
    const int64_t *flags = (const int64_t *)ib.buf + C_FLAGS * n;
    const uint64_t *h0 = hb.buf, *h1 = h0 + n;
    int32_t *status = sb.buf;
    int64_t *raw = tb.buf;
    int8_t *failed = fb.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        devices += (flags[i] & F_DEV) != 0;
        if ((flags[i] & (F_DEV | F_TICKETS)) == (F_DEV | F_TICKETS)) {
            tickets++;
            twos += (flags[i] & F_TWO) != 0;
        }
    }
    int err = 0;
    if (tickets && !reaper_available()) {
        PyErr_SetString(PyExc_RuntimeError, "settle: records hold tickets but there is no reaper");
        goto done;
    }
    Py_ssize_t m = tickets + twos;
    uint64_t *ts = PyMem_RawMalloc((m ? m : 1) * sizeof(uint64_t));
    int64_t *rows = PyMem_RawMalloc((m ? m : 1) * sizeof(int64_t)), *st = PyMem_RawMalloc((m ? m : 1) * 4 * sizeof(int64_t));
    int32_t *sts = PyMem_RawMalloc((m ? m : 1) * sizeof(int32_t));
    uint8_t *fs = PyMem_RawMalloc(m ? m : 1);
    if (ts == NULL || rows == NULL || st == NULL || sts == NULL || fs == NULL) {
        PyErr_NoMemory();
        goto out_free;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t a = 0, b = tickets; /* first markers at [0, tickets), second ones after */
    for (Py_ssize_t i = 0; i < n; i++) {
        failed[i] = -1;
        if ((flags[i] & (F_DEV | F_TICKETS)) != (F_DEV | F_TICKETS))
            continue;
        rows[a] = i;
        ts[a++] = h0[i];
        if (flags[i] & F_TWO) {
            rows[b] = i;
            ts[b++] = h1[i];
        }
    }
    if (m)
        err = reaper_peek_into(ts, (size_t)m, sts, st, fs);
    if (err == 0) {
        for (Py_ssize_t j = 0; j < tickets; j++) {
            Py_ssize_t i = rows[j];
            status[i] = sts[j];
            memcpy(raw + 4 * i, st + 4 * j, 4 * sizeof(int64_t));
            failed[i] = (int8_t)fs[j];
        }
        for (Py_ssize_t j = tickets; j < m; j++) { /* a region's two markers: START is the first's END, END the second's */
            Py_ssize_t i = rows[j];
            int32_t s0 = status[i], s1 = sts[j];
            raw[4 * i + 2] = raw[4 * i + 3];
            raw[4 * i + 3] = st[4 * j + 3];
            status[i] = s0 < 0 ? s0 : s1 < 0 ? s1 : (s0 > s1 ? s0 : s1);
            failed[i] = (int8_t)(failed[i] | fs[j]);
        }
        for (Py_ssize_t i = 0; i < n; i++)
            pending += status[i] > 0;
    }
    Py_END_ALLOW_THREADS
    if (err < 0)
        PyErr_NoMemory();
    else
        out = Py_BuildValue("(nnn)", pending, tickets, devices);
out_free:
    PyMem_RawFree(ts);
    PyMem_RawFree(rows);
    PyMem_RawFree(st);
    PyMem_RawFree(sts);
    PyMem_RawFree(fs);
done:
    PyBuffer_Release(&ib);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&fb);
    return out;
}

static PyObject *
stamps_track(PyObject *self, PyObject *ev)
{
    uint64_t t;
    if (reaper_track(ev, NULL, &t) < 0)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(t);
}

static PyObject *
stamps_reaper(PyObject *self, PyObject *unused)
{
    if (!ready())
        return NULL;
    return PyBool_FromLong(reaper_available());
}

static PyMethodDef methods[] = {
    {"reaper", stamps_reaper, METH_NOARGS, "reaper(): whether the reaper runs here (region.init(..., reaper=True) then trades events for tickets)."},
    {"track", stamps_track, METH_O, "track(event): the event's ticket (retained until its stamps are read), or None."},
    {"peek", reaper_peek, METH_VARARGS, "peek(tickets, status, stamps, failed): what read() gives, for tickets."},
    {"wait_tickets", reaper_wait, METH_O, "wait_tickets(tickets): wait for their commands (GIL released)."},
    {"done", reaper_done, METH_O, "done(tickets): the records are resolved or dropped: free their slots."},
    {"reaper_stats", reaper_stats, METH_NOARGS, "reaper_stats(): counters of the reaper thread."},
    {"pause_reaper", reaper_pause, METH_O, "pause_reaper(on): while on, track() declines (records keep their Events); returns the previous setting."},
    {"reaper_config", reaper_config, METH_VARARGS, "reaper_config(min_ns, max_ns[, harvest_every, quiet_ns, stale_ns, shared_hold_ns, spin_ns]): the reaper's polling pace while commands complete / while none does; the launching thread's harvest every so many commands tracked (0: none); the quiet time after which, and the age past which, others read; while other threads launch, how long a harvest's wait for its newest command keeps the GIL (0: never); how long a harvest polls its newest command before it reads only the completed front of the queue (-1: unchanged). Returns the settings it replaced."},
    {"stop_reaper", reaper_stop, METH_NOARGS, "stop_reaper(): stop the reaper thread (at exit); later events stay in their records."},
    {"init", stamps_init, METH_VARARGS, "init(path): resolve the OpenCL entry points in the library at path."},
    {"handles", stamps_handles, METH_VARARGS, "handles(events, out): out[i] = events[i].int_ptr."},
    {"read", stamps_read, METH_VARARGS, "read(handles, status, stamps): fill status int32[N] and stamps int64[N, 4]."},
    {"columns", stamps_columns, METH_VARARGS, "columns(records, ints, handles, names, cats, paths): the resolver's first pass."},
    {"columns_read", stamps_columns_read, METH_VARARGS, "columns_read(records, ints, handles, names, cats, paths, status, stamps): columns() and the events' stamps (a region's two markers combined), in one pass."},
    {"settle", stamps_settle, METH_VARARGS, "settle(ints, handles, status, stamps, failed) -> (pending, tickets, devices): tickets' rows peeked, in place."},
    {"wait", stamps_wait, METH_VARARGS, "wait(handles): wait for every event; a failed one does not stop the rest."},
    {"transpose", stamps_transpose, METH_O, "transpose(records): list(zip(*records)) in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.stamps",
    "Bulk reads of OpenCL event profiling stamps without the GIL (see cltrace.timeline.stamps).", -1, methods,
};

PyObject *
cltrace_stamps_module(void)
{
    return PyModule_Create(&module);
}
