/* Running statistics of spans per region path, a whole batch in one pass without the GIL
 * (see cltrace.timeline.stats, whose pure-Python table gives the same numbers).
 *
 *   Table()                 per slot (a region path) a host and a device series: count, total, min, max
 *                           and a uniform reservoir of RESERVOIR samples; the errors and the earliest begin
 *     .grow(slots)          room for slots [0, slots)
 *     .add(lut, path, cat, host_begin, host_end, dev_start, dev_end, track, status) -> [slot, cat id]...
 *                           lut int64[p]: a path id's slot; path int32[n], cat int16[n], status int8[n],
 *                           the rest int64[n]. Rows with track != 0 feed the device series too. Returns the
 *                           slots seen for the first time, each with the category id of its first row.
 *     .series(slot, device) -> (count, total, min, max, samples bytes of int64)
 *     .entry(slot)          -> (errors, first begin)
 *
 * Reservoir: algorithm R. The p-th value of a series (p > RESERVOIR) replaces slot
 * floor(u * p) when that is below RESERVOIR, u = the top 53 bits of splitmix64(key + p * golden) / 2^53,
 * key = (slot * 2 + device) * K: a pure function of the series and the position, so the fallback's
 * vectorised draws are the same numbers. A Table is used by one thread at a time (the Stats lock).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../_ext.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../_mix.h"

#define RESERVOIR 4096
#define GOLDEN 0x9E3779B97F4A7C15ULL
#define KEY_MUL 0xD1B54A32D192ED03ULL

typedef struct {
    int64_t n, total, lo, hi, kept;
    int64_t *samples; /* RESERVOIR, allocated at the first value */
} Series;

typedef struct {
    Series host, dev;
    int64_t errors, first;
    int32_t seen;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *e;
    Py_ssize_t slots;
} Table;

/* 0: done; -1: out of memory */
static int
series_add(Series *s, uint64_t key, int64_t v)
{
    if (s->n == 0) {
        s->lo = s->hi = v;
    } else {
        if (v < s->lo)
            s->lo = v;
        if (v > s->hi)
            s->hi = v;
    }
    s->total += v;
    int64_t p = ++s->n;
    if (s->kept < RESERVOIR) {
        if (s->samples == NULL && (s->samples = (int64_t *)malloc(RESERVOIR * sizeof(int64_t))) == NULL)
            return -1;
        s->samples[s->kept++] = v;
        return 0;
    }
    uint64_t z = mix(key + (uint64_t)p * GOLDEN);
    double u = (double)(z >> 11) * 0x1p-53;
    int64_t j = (int64_t)(u * (double)p);
    if (j < RESERVOIR)
        s->samples[j] = v;
    return 0;
}

static void
table_dealloc(Table *self)
{
    for (Py_ssize_t i = 0; i < self->slots; i++) {
        free(self->e[i].host.samples);
        free(self->e[i].dev.samples);
    }
    free(self->e);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
table_grow(Table *self, PyObject *arg)
{
    Py_ssize_t want = PyLong_AsSsize_t(arg);
    if (want == -1 && PyErr_Occurred())
        return NULL;
    if (want > self->slots) {
        Entry *e = (Entry *)realloc(self->e, (size_t)want * sizeof(Entry));
        if (e == NULL)
            return PyErr_NoMemory();
        memset(e + self->slots, 0, (size_t)(want - self->slots) * sizeof(Entry));
        self->e = e;
        self->slots = want;
    }
    Py_RETURN_NONE;
}

static int
sized(const char *what, Py_buffer *b, Py_ssize_t n, Py_ssize_t item)
{
    if (b->len != n * item) {
        PyErr_Format(PyExc_ValueError, "add: %s holds %zd bytes, need %zd of %zd bytes", what, b->len, n, item);
        return 0;
    }
    return 1;
}

#define NB 9

static PyObject *
table_add(Table *self, PyObject *args)
{
    Py_buffer b[NB];
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*:add", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7],
                          &b[8]))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t lut_n = b[0].len / 8, n = b[1].len / 4;
    static const char *names[NB] = {"lut", "path", "cat", "host_begin", "host_end", "dev_start", "dev_end", "track",
                                    "status"};
    static const Py_ssize_t items[NB] = {8, 4, 2, 8, 8, 8, 8, 8, 1};
    for (int k = 1; k < NB; k++)
        if (!sized(names[k], &b[k], n, items[k]))
            goto done;
    const int64_t *lut = (const int64_t *)b[0].buf;
    const int32_t *path = (const int32_t *)b[1].buf;
    const int16_t *cat = (const int16_t *)b[2].buf;
    const int64_t *hb = (const int64_t *)b[3].buf, *he = (const int64_t *)b[4].buf;
    const int64_t *ds = (const int64_t *)b[5].buf, *de = (const int64_t *)b[6].buf;
    const int64_t *track = (const int64_t *)b[7].buf;
    const int8_t *status = (const int8_t *)b[8].buf;
    Entry *e = self->e;
    Py_ssize_t slots = self->slots, bad = -1, fresh = 0;
    int nomem = 0;
    int64_t *first_seen = (int64_t *)malloc((size_t)(n ? n : 1) * 2 * sizeof(int64_t));
    if (first_seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = (path[i] >= 0 && path[i] < lut_n) ? lut[path[i]] : -1;
        if (s < 0 || s >= slots) {
            bad = i;
            break;
        }
        Entry *x = &e[s];
        if (!x->seen) {
            x->seen = 1;
            x->first = hb[i];
            first_seen[2 * fresh] = s;
            first_seen[2 * fresh + 1] = cat[i];
            fresh++;
        } else if (hb[i] < x->first) {
            x->first = hb[i];
        }
        uint64_t key = (uint64_t)s * 2 * KEY_MUL;
        if (series_add(&x->host, key, he[i] - hb[i]) < 0 ||
            (track[i] != 0 && series_add(&x->dev, key + KEY_MUL, de[i] - ds[i]) < 0)) {
            nomem = 1;
            break;
        }
        x->errors += status[i];
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
    } else if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "add: row %zd's path %d has no slot (grow the table first)", bad,
                     (int)path[bad]);
    } else if ((out = PyList_New(fresh)) != NULL) {
        for (Py_ssize_t k = 0; k < fresh; k++) {
            PyObject *t = Py_BuildValue("(LL)", (long long)first_seen[2 * k], (long long)first_seen[2 * k + 1]);
            if (t == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, k, t);
        }
    }
    free(first_seen);
done:
    for (int k = 0; k < NB; k++)
        PyBuffer_Release(&b[k]);
    return out;
}

static int
slot_arg(Table *self, Py_ssize_t slot)
{
    if (slot < 0 || slot >= self->slots) {
        PyErr_Format(PyExc_IndexError, "slot %zd out of range (%zd slots)", slot, self->slots);
        return 0;
    }
    return 1;
}

static PyObject *
table_series(Table *self, PyObject *args)
{
    Py_ssize_t slot;
    int device;
    if (!PyArg_ParseTuple(args, "np:series", &slot, &device) || !slot_arg(self, slot))
        return NULL;
    Series *s = device ? &self->e[slot].dev : &self->e[slot].host;
    return Py_BuildValue("(LLLLy#)", (long long)s->n, (long long)s->total, (long long)s->lo, (long long)s->hi,
                         s->samples ? (const char *)s->samples : "", (Py_ssize_t)(s->kept * (Py_ssize_t)sizeof(int64_t)));
}

static PyObject *
table_entry(Table *self, PyObject *args)
{
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "n:entry", &slot) || !slot_arg(self, slot))
        return NULL;
    return Py_BuildValue("(LL)", (long long)self->e[slot].errors, (long long)self->e[slot].first);
}

static PyMethodDef table_methods[] = {
    {"grow", (PyCFunction)table_grow, METH_O, "Room for slots [0, slots)."},
    {"add", (PyCFunction)table_add, METH_VARARGS, "Add a batch's rows; the slots seen for the first time."},
    {"series", (PyCFunction)table_series, METH_VARARGS, "(count, total, min, max, samples) of a series."},
    {"entry", (PyCFunction)table_entry, METH_VARARGS, "(errors, first begin) of a slot."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cltrace._ext.stats.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-path host and device series, fed whole batches.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.stats", "Running statistics per region path over whole batches.", -1, NULL,
};

PyObject *
cltrace_stats_module(void)
{
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0 ||
        PyModule_AddIntConstant(m, "RESERVOIR", RESERVOIR) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
