/* Chrome JSON event lines of a batch of spans, without the GIL (the C side of ``chrome_lines``; its
 * Python reference is ``chrome_lines.encode_python``, which writes the same text).
 *
 * It takes a SpanBatch's own columns (no per-row matrices built in numpy) and lookup tables of text:
 *   scan(cols, luts, ncat, attrs, attrs_out) -> (misses, objects, devices, flows, failed, need)
 *     one pass with the GIL: which ids the lookup tables have no text for yet, the attrs objects by identity
 *   fill(out, at, start, stop, base, cols, luts, ncat, tables[, fd]) -> (row, at, flushed)
 *     the rows' lines, each ending in ",\n", straight into a writable buffer (and full buffers to fd),
 *     without the GIL: the table bytes are held in tuples first (bytes are immutable)
 * Per row: the host slice (X); with a device slice (flag 1) the device X too, and unless the row is a
 * region (flag 2: no flow) the flow pair between them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../_ext.h"
#include <errno.h>
#include <stdint.h>
#include <string.h>
#ifdef _WIN32
#include <io.h>
#define write(fd, buf, n) _write((fd), (buf), (unsigned int)(n))
typedef Py_ssize_t ssize_t;
#else
#include <unistd.h>
#endif

#define F_DEVICE 1
#define F_NO_FLOW 2


typedef struct {
    const char *p;
    Py_ssize_t n;
} piece;

typedef struct {
    PyObject *tuple; /* holds the bytes the pieces point into */
    piece *v;
    Py_ssize_t n;
    Py_ssize_t longest;
} table;

/* Literal text, its length known at compile time. */
#define LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) += sizeof(s) - 1)
#define PUT(p, pc) ((p) = put_text((p), (pc).p, (size_t)(pc).n))

/* n bytes from src, by fixed-size moves the compiler inlines (two overlapping ones for the tail): most
 * pieces are 10-100 bytes, where a call to memcpy costs more than the copy. Reads only src[0:n]. */
static inline char *
put_text(char *dst, const char *src, size_t n)
{
    if (n >= 16) {
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            memcpy(dst + i, src + i, 16);
        if (i < n)
            memcpy(dst + n - 16, src + n - 16, 16);
    } else if (n >= 8) {
        memcpy(dst, src, 8);
        memcpy(dst + n - 8, src + n - 8, 8);
    } else if (n >= 4) {
        memcpy(dst, src, 4);
        memcpy(dst + n - 4, src + n - 4, 4);
    } else if (n > 0) {
        dst[0] = src[0];
        dst[n / 2] = src[n / 2];
        dst[n - 1] = src[n - 1];
    }
    return dst + n;
}

/* Most bytes one row can take besides its table text: every literal below, and 20 numbers of at
 * most 21 characters (sign, 19 digits, point) each. */
#define ROW_FIXED 768

static const char DIGITS2[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Digits of v < 10^8, as few as it takes. */
static inline char *
put_u32(char *p, uint32_t v)
{
    int n = v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : v < 100000 ? 5 : v < 1000000 ? 6
          : v < 10000000 ? 7 : 8;
    char *e = p + n, *t = e;
    while (v >= 100) {
        unsigned r = v % 100;
        v /= 100;
        t -= 2;
        memcpy(t, DIGITS2 + 2 * r, 2);
    }
    if (v >= 10)
        memcpy(t - 2, DIGITS2 + 2 * v, 2);
    else
        t[-1] = (char)('0' + v);
    return e;
}

/* Exactly 8 digits of v < 10^8 (leading zeros). */
static inline char *
put_8(char *p, uint32_t v)
{
    uint32_t hi = v / 10000, lo = v % 10000;
    memcpy(p, DIGITS2 + 2 * (hi / 100), 2);
    memcpy(p + 2, DIGITS2 + 2 * (hi % 100), 2);
    memcpy(p + 4, DIGITS2 + 2 * (lo / 100), 2);
    memcpy(p + 6, DIGITS2 + 2 * (lo % 100), 2);
    return p + 8;
}

static char *
put_u64(char *p, uint64_t v)
{
    if (v < 100000000u)
        return put_u32(p, (uint32_t)v);
    uint64_t hi = v / 100000000u;
    uint32_t lo = (uint32_t)(v % 100000000u);
    if (hi < 100000000u) {
        p = put_u32(p, (uint32_t)hi);
    } else {
        p = put_u32(p, (uint32_t)(hi / 100000000u));
        p = put_8(p, (uint32_t)(hi % 100000000u));
    }
    return put_8(p, lo);
}

static char *
put_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(p, (uint64_t)v);
}

/* Nanoseconds as microseconds with exactly three decimals; negative: "-" and the magnitude's text. */
static char *
put_us(char *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    if (v < 0) {
        *p++ = '-';
        u = (uint64_t)0 - u;
    }
    p = put_u64(p, u / 1000);
    unsigned f = (unsigned)(u % 1000);
    p[0] = '.';
    p[1] = (char)('0' + f / 100);
    memcpy(p + 2, DIGITS2 + 2 * (f % 100), 2);
    return p + 4;
}

static int
table_from(PyObject *seq, table *t, const char *name)
{
    t->tuple = PySequence_Tuple(seq);
    if (t->tuple == NULL)
        return -1;
    t->n = PyTuple_GET_SIZE(t->tuple);
    t->longest = 0;
    t->v = PyMem_Malloc((size_t)(t->n ? t->n : 1) * sizeof(piece));
    if (t->v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyObject *b = PyTuple_GET_ITEM(t->tuple, i);
        if (!PyBytes_Check(b)) {
            PyErr_Format(PyExc_TypeError, "encode: %s[%zd] is %.100s, not bytes", name, i, Py_TYPE(b)->tp_name);
            return -1;
        }
        t->v[i].p = PyBytes_AS_STRING(b);
        t->v[i].n = PyBytes_GET_SIZE(b);
        if (t->v[i].n > t->longest)
            t->longest = t->v[i].n;
    }
    return 0;
}

/* One row's text: its pieces and numbers (times already relative to the trace start). */
typedef struct {
    piece head, flow_s, flow_f, host, dev, err, attrs, site;
    int64_t id, par, ts, dur, q, sub, dts, ddur, rs, re;
    int flags;
} row_t;

/* Most bytes a row can take: the fixed text, twice each text its slices repeat, the flow heads once. */
static inline Py_ssize_t
row_bound(const row_t *r)
{
    return ROW_FIXED + 2 * (r->head.n + r->host.n + r->dev.n + r->err.n + r->attrs.n + r->site.n) + r->flow_s.n +
           r->flow_f.n;
}

/* The row's lines from p on, each ending in ",\n"; returns the end. */
static inline char *
put_row(char *p, const row_t *r)
{
    char ts[24], dts[24];
    size_t ts_n = (size_t)(put_us(ts, r->ts) - ts), dts_n;

    PUT(p, r->head);
    PUT(p, r->host);
    p = put_text(p, ts, ts_n);
    LIT(p, ",\"dur\":");
    p = put_us(p, r->dur);
    LIT(p, ",\"args\":");
    char *args = p;
    LIT(p, "{\"span\":");
    p = put_i64(p, r->id);
    LIT(p, ",\"parent\":");
    p = put_i64(p, r->par);
    if (r->flags & F_DEVICE) {
        LIT(p, ",\"source\":\"device\",\"queued_host_ns\":");
        p = put_i64(p, r->q);
        LIT(p, ",\"submit_host_ns\":");
        p = put_i64(p, r->sub);
        LIT(p, ",\"device.start\":");
        p = put_i64(p, r->rs);
        LIT(p, ",\"device.end\":");
        p = put_i64(p, r->re);
    } else {
        LIT(p, ",\"source\":\"host\"");
    }
    PUT(p, r->err);
    PUT(p, r->attrs);
    PUT(p, r->site);
    *p++ = '}';
    size_t args_n = (size_t)(p - args);
    LIT(p, "},\n");
    if (!(r->flags & F_DEVICE))
        return p;

    dts_n = (size_t)(put_us(dts, r->dts) - dts);
    PUT(p, r->head);
    PUT(p, r->dev);
    p = put_text(p, dts, dts_n);
    LIT(p, ",\"dur\":");
    p = put_us(p, r->ddur);
    LIT(p, ",\"args\":");
    p = put_text(p, args, args_n);
    LIT(p, "},\n");
    if (r->flags & F_NO_FLOW)
        return p;

    char id[24];
    size_t id_n = (size_t)(put_i64(id, r->id) - id);
    PUT(p, r->flow_s);
    p = put_text(p, id, id_n);
    *p++ = ',';
    PUT(p, r->host);
    p = put_text(p, ts, ts_n);
    LIT(p, "},\n");
    PUT(p, r->flow_f);
    p = put_text(p, id, id_n);
    *p++ = ',';
    PUT(p, r->dev);
    p = put_text(p, dts, dts_n);
    LIT(p, "},\n");
    return p;
}


/* --- the batch path: SpanBatch columns and lookup tables in, text straight into the caller's buffer ---------- */

/* Columns of a SpanBatch (``chrome_lines.COLS``), each a contiguous buffer of n items. */
enum { SB_ID, SB_PARENT, SB_THREAD, SB_HOST_BEGIN, SB_HOST_END, SB_TRACK, SB_QUEUED, SB_SUBMIT, SB_DEV_START, SB_DEV_END,
       SB_RAW_START, SB_RAW_END, SB_NAME, SB_CAT, SB_SITE, SB_STATUS, SB_ATTRS, SB_ERROR, N_SB_COLS };
static const int COL_SIZE[N_SB_COLS] = {8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 2, 4, 1, 4, 4};
/* Lookup tables (``chrome_lines.LUTS``): track id -> host head, track id -> device head,
 * name id * ncat + category id -> head, site id + 1 -> site text, category id -> is a region. */
enum { L_HOST, L_DEVICE, L_HEAD, L_SITE, L_REGION, N_LUTS };
static const int LUT_SIZE[N_LUTS] = {4, 4, 4, 4, 1};
enum { B_HEAD, B_FLOW_S, B_FLOW_F, B_HOST, B_DEVICE, B_ATTRS, B_SITE, B_ERROR, N_BTABLES };
static const char *const BTABLE_NAMES[N_BTABLES] = {"heads", "flow_s", "flow_f", "hosts", "devices", "attrs",
                                                    "sites", "errors"};

typedef struct {
    Py_buffer col[N_SB_COLS], lut[N_LUTS];
    int has_col[N_SB_COLS], has_lut[N_LUTS];
    Py_ssize_t n, lut_n[N_LUTS], ncat;
} batch_t;

static void
batch_release(batch_t *b)
{
    for (int k = 0; k < N_SB_COLS; k++)
        if (b->has_col[k])
            PyBuffer_Release(&b->col[k]);
    for (int k = 0; k < N_LUTS; k++)
        if (b->has_lut[k])
            PyBuffer_Release(&b->lut[k]);
    memset(b, 0, sizeof(*b));
}

static int
get_buffer(PyObject *o, Py_buffer *v, int itemsize, int writable, const char *what, int k)
{
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (v->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s %d: need items of %d bytes, got %zd", what, k, itemsize, v->itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* cols: a tuple of N_SB_COLS buffers (the error column may be None: no failed rows); luts: N_LUTS buffers and
 * ncat. The lookup tables are writable: scan marks the keys it reports. */
static int
batch_from(PyObject *cols, PyObject *luts, Py_ssize_t ncat, batch_t *b)
{
    memset(b, 0, sizeof(*b));
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != N_SB_COLS || !PyTuple_Check(luts) ||
        PyTuple_GET_SIZE(luts) != N_LUTS) {
        PyErr_Format(PyExc_TypeError, "need a tuple of %d columns and a tuple of %d lookup tables", N_SB_COLS, N_LUTS);
        return -1;
    }
    b->n = -1;
    for (int k = 0; k < N_SB_COLS; k++) {
        PyObject *o = PyTuple_GET_ITEM(cols, k);
        if (k == SB_ERROR && o == Py_None)
            continue;
        if (get_buffer(o, &b->col[k], COL_SIZE[k], 0, "column", k) < 0)
            goto fail;
        b->has_col[k] = 1;
        Py_ssize_t len = b->col[k].len / COL_SIZE[k];
        if (b->n < 0)
            b->n = len;
        else if (len != b->n) {
            PyErr_Format(PyExc_ValueError, "column %d has %zd rows, column 0 %zd", k, len, b->n);
            goto fail;
        }
    }
    for (int k = 0; k < N_LUTS; k++) {
        if (get_buffer(PyTuple_GET_ITEM(luts, k), &b->lut[k], LUT_SIZE[k], 1, "lookup table", k) < 0)
            goto fail;
        b->has_lut[k] = 1;
        b->lut_n[k] = b->lut[k].len / LUT_SIZE[k];
    }
    if (ncat < 1) {
        PyErr_SetString(PyExc_ValueError, "ncat must be positive");
        goto fail;
    }
    b->ncat = ncat;
    return 0;
fail:
    batch_release(b);
    return -1;
}

#define COL(b, k, T) ((const T *)(b)->col[k].buf)
#define LUT(b, k, T) ((T *)(b)->lut[k].buf)

/* A key outside its lookup table: -1 (and IndexError set when ``raise``). */
static inline int
in_range(int64_t key, Py_ssize_t n)
{
    return key >= 0 && key < n;
}

/* scan(cols, luts, ncat, attrs, attrs_out) -> (misses, objects, devices, flows, failed, need)
 * One pass over the rows, with the GIL (it reads the attrs list): every key whose lookup entry is negative
 * is reported once, as (row, kind, key) in row order (kind 0: host track, 1: device track, 2: head key,
 * 3: site id + 1), its entry set to -2 until the caller fills it; each row's attrs object is numbered by
 * identity in attrs_out (int32, objects in first-seen order). devices and flows count the rows with a
 * device slice and those of them with a flow, failed the rows whose status is not 0. need is 0, or where a
 * track id lies past its lookup tables the length they need (-1: a negative id); its rows are not looked up
 * (the caller undoes the marks, grows the tables and scans again). */
static PyObject *
chrome_scan(PyObject *self, PyObject *args)
{
    PyObject *cols, *luts, *attrs, *out_obj, *misses = NULL, *objects = NULL, *result = NULL;
    Py_ssize_t ncat;
    batch_t b;
    Py_buffer out;
    PyObject **keys = NULL;
    int32_t *slots = NULL;
    if (!PyArg_ParseTuple(args, "OOnOO:scan", &cols, &luts, &ncat, &attrs, &out_obj))
        return NULL;
    if (batch_from(cols, luts, ncat, &b) < 0)
        return NULL;
    if (get_buffer(out_obj, &out, 4, 1, "attrs_out", 0) < 0) {
        batch_release(&b);
        return NULL;
    }
    Py_ssize_t n = b.n;
    if (!PyList_Check(attrs) || PyList_GET_SIZE(attrs) != n || out.len / 4 < n) {
        PyErr_Format(PyExc_ValueError, "scan: need an attrs list and attrs_out of %zd rows", n);
        goto done;
    }
    misses = PyList_New(0);
    objects = PyList_New(0);
    if (misses == NULL || objects == NULL)
        goto done;
    /* attrs objects by identity: open addressing over the pointers, grown at half full */
    Py_ssize_t cap = 64, used = 0;
    keys = PyMem_Calloc((size_t)cap, sizeof(PyObject *));
    slots = PyMem_Malloc((size_t)cap * sizeof(int32_t));
    if (keys == NULL || slots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *thread = COL(&b, SB_THREAD, int64_t), *track = COL(&b, SB_TRACK, int64_t);
    const int32_t *name = COL(&b, SB_NAME, int32_t), *site = COL(&b, SB_SITE, int32_t);
    const int16_t *cat = COL(&b, SB_CAT, int16_t);
    int32_t *host_lut = LUT(&b, L_HOST, int32_t), *dev_lut = LUT(&b, L_DEVICE, int32_t),
            *head_lut = LUT(&b, L_HEAD, int32_t), *site_lut = LUT(&b, L_SITE, int32_t);
    const uint8_t *region = LUT(&b, L_REGION, uint8_t);
    int32_t *attrs_out = (int32_t *)out.buf;
    const int8_t *status = COL(&b, SB_STATUS, int8_t);
    Py_ssize_t devices = 0, flows = 0, failed = 0;
    int64_t need = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t key[4] = {thread[i], track[i], (int64_t)name[i] * b.ncat + cat[i], (int64_t)site[i] + 1};
        int32_t *lut[4] = {host_lut, dev_lut, head_lut, site_lut};
        const Py_ssize_t lut_n[4] = {b.lut_n[L_HOST], b.lut_n[L_DEVICE], b.lut_n[L_HEAD], b.lut_n[L_SITE]};
        if (cat[i] < 0 || cat[i] >= b.ncat || !in_range(cat[i], b.lut_n[L_REGION])) {
            PyErr_Format(PyExc_IndexError, "scan: row %zd: category %d outside its tables", i, (int)cat[i]);
            goto done;
        }
        for (int k = 0; k < 4; k++) {
            if (k == 1 && track[i] == 0)
                continue;
            if (k < 2 && !in_range(key[k], lut_n[k])) {
                if (key[k] < 0)
                    need = -1;
                else if (need >= 0 && key[k] >= need)
                    need = key[k] + 1;
                continue;
            }
            if (!in_range(key[k], lut_n[k])) {
                PyErr_Format(PyExc_IndexError, "scan: row %zd: key %lld of kind %d outside its lookup table of %zd",
                             i, (long long)key[k], k, lut_n[k]);
                goto done;
            }
            if (lut[k][key[k]] >= 0 || lut[k][key[k]] == -2)
                continue;
            lut[k][key[k]] = -2;
            PyObject *m = Py_BuildValue("(nil)", i, k, (long)key[k]);
            if (m == NULL || PyList_Append(misses, m) < 0) {
                Py_XDECREF(m);
                goto done;
            }
            Py_DECREF(m);
        }
        failed += status[i] != 0;
        if (track[i] != 0) {
            devices++;
            flows += !region[cat[i]];
        }
        PyObject *o = PyList_GET_ITEM(attrs, i);
        if (i > 0 && o == PyList_GET_ITEM(attrs, i - 1)) { /* a launcher's rows share one dict */
            attrs_out[i] = attrs_out[i - 1];
            continue;
        }
        size_t h = ((size_t)o >> 4) * 0x9E3779B97F4A7C15ull;
        Py_ssize_t j = (Py_ssize_t)(h & (size_t)(cap - 1));
        while (keys[j] != NULL && keys[j] != o)
            j = (j + 1) & (cap - 1);
        if (keys[j] == NULL) {
            if (used >= INT32_MAX || PyList_Append(objects, o) < 0)
                goto done;
            keys[j] = o;
            slots[j] = (int32_t)used++;
            if (2 * used > cap) { /* grow: rehash every key */
                Py_ssize_t ncap = 2 * cap;
                PyObject **nk = PyMem_Calloc((size_t)ncap, sizeof(PyObject *));
                int32_t *ns = PyMem_Malloc((size_t)ncap * sizeof(int32_t));
                if (nk == NULL || ns == NULL) {
                    PyMem_Free(nk);
                    PyMem_Free(ns);
                    PyErr_NoMemory();
                    goto done;
                }
                for (Py_ssize_t q = 0; q < cap; q++) {
                    if (keys[q] == NULL)
                        continue;
                    size_t hq = ((size_t)keys[q] >> 4) * 0x9E3779B97F4A7C15ull;
                    Py_ssize_t r = (Py_ssize_t)(hq & (size_t)(ncap - 1));
                    while (nk[r] != NULL)
                        r = (r + 1) & (ncap - 1);
                    nk[r] = keys[q];
                    ns[r] = slots[q];
                }
                PyMem_Free(keys);
                PyMem_Free(slots);
                keys = nk;
                slots = ns;
                cap = ncap;
                attrs_out[i] = (int32_t)(used - 1);
                continue;
            }
        }
        attrs_out[i] = slots[j];
    }
    result = Py_BuildValue("(OOnnnL)", misses, objects, devices, flows, failed, (long long)need);
done:
    PyMem_Free(keys);
    PyMem_Free(slots);
    Py_XDECREF(misses);
    Py_XDECREF(objects);
    PyBuffer_Release(&out);
    batch_release(&b);
    return result;
}

/* fill(out, at, start, stop, base, cols, luts, ncat, tables[, fd]) -> (row, at, flushed)
 * The lines of rows start.. written into the writable buffer ``out`` from offset ``at`` on, as many whole rows
 * as surely fit, without the GIL; returns the first row not written, the new offset and the bytes handed to
 * the file descriptor ``fd`` (where given, >= 0: a full buffer is written to it and filled again, in the same
 * stretch without the GIL, so a batch of any size costs one hand-over of the GIL, not two per buffer; a
 * failed write raises OSError, what the buffer held then is lost, ``flushed`` bytes reached the file). The text is
 * exactly ``encode``'s for the same rows (times relative to ``base``; the site's text after the attrs').
 * tables: heads, flow_s, flow_f, hosts, devices, attrs, sites, errors (bytes each); the error column, where
 * given, indexes errors (0: b"", an ok row). A lookup entry or index outside its table is an IndexError,
 * and nothing of that call counts as written. */
static PyObject *
chrome_fill(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *cols, *luts, *tabs, *result = NULL;
    Py_ssize_t at, start, stop, ncat;
    long long base;
    batch_t b;
    Py_buffer out;
    table t[N_BTABLES];
    int fd = -1;
    memset(t, 0, sizeof(t));
    if (!PyArg_ParseTuple(args, "OnnnLOOnO|i:fill", &out_obj, &at, &start, &stop, &base, &cols, &luts, &ncat, &tabs,
                          &fd))
        return NULL;
    if (batch_from(cols, luts, ncat, &b) < 0)
        return NULL;
    if (get_buffer(out_obj, &out, 1, 1, "out", 0) < 0) {
        batch_release(&b);
        return NULL;
    }
    if (start < 0 || stop > b.n || start > stop || at < 0 || at > out.len) {
        PyErr_Format(PyExc_IndexError, "fill: rows %zd:%zd of %zd, offset %zd of %zd", start, stop, b.n, at, out.len);
        goto done;
    }
    if (!PyTuple_Check(tabs) || PyTuple_GET_SIZE(tabs) != N_BTABLES) {
        PyErr_Format(PyExc_TypeError, "fill: need a tuple of %d tables", N_BTABLES);
        goto done;
    }
    for (int k = 0; k < N_BTABLES; k++)
        if (table_from(PyTuple_GET_ITEM(tabs, k), &t[k], BTABLE_NAMES[k]) < 0)
            goto done;
    if (t[B_ERROR].n < 1 || t[B_ATTRS].n < 1 || t[B_DEVICE].n < 1 || t[B_SITE].n < 1) {
        PyErr_SetString(PyExc_ValueError, "fill: errors, attrs, devices and sites need their empty entry");
        goto done;
    }
    const int64_t *id = COL(&b, SB_ID, int64_t), *par = COL(&b, SB_PARENT, int64_t),
                  *thread = COL(&b, SB_THREAD, int64_t), *hb = COL(&b, SB_HOST_BEGIN, int64_t),
                  *he = COL(&b, SB_HOST_END, int64_t), *track = COL(&b, SB_TRACK, int64_t),
                  *q = COL(&b, SB_QUEUED, int64_t), *sub = COL(&b, SB_SUBMIT, int64_t),
                  *ds = COL(&b, SB_DEV_START, int64_t), *de = COL(&b, SB_DEV_END, int64_t),
                  *rs = COL(&b, SB_RAW_START, int64_t), *re = COL(&b, SB_RAW_END, int64_t);
    const int32_t *name = COL(&b, SB_NAME, int32_t), *site = COL(&b, SB_SITE, int32_t),
                  *attrs = COL(&b, SB_ATTRS, int32_t), *err = b.has_col[SB_ERROR] ? COL(&b, SB_ERROR, int32_t) : NULL;
    const int16_t *cat = COL(&b, SB_CAT, int16_t);
    const int32_t *host_lut = LUT(&b, L_HOST, int32_t), *dev_lut = LUT(&b, L_DEVICE, int32_t),
                  *head_lut = LUT(&b, L_HEAD, int32_t), *site_lut = LUT(&b, L_SITE, int32_t);
    const uint8_t *region = LUT(&b, L_REGION, uint8_t);
    char *begin = (char *)out.buf, *p = begin + at, *end = begin + out.len;
    Py_ssize_t i, bad = -1, flushed = 0;
    const char *why = NULL;
    int werr = 0;
    uint64_t ub = (uint64_t)base;
    row_t r;
    Py_BEGIN_ALLOW_THREADS
    for (i = start; i < stop; i++) {
        int16_t c = cat[i];
        int64_t hk = (int64_t)name[i] * b.ncat + c, sk = (int64_t)site[i] + 1;
        int32_t a = attrs[i], e = err ? err[i] : 0;
        if (c < 0 || c >= b.ncat || !in_range(c, b.lut_n[L_REGION]) || !in_range(hk, b.lut_n[L_HEAD]) ||
            !in_range(thread[i], b.lut_n[L_HOST]) || !in_range(sk, b.lut_n[L_SITE]) ||
            (track[i] != 0 && !in_range(track[i], b.lut_n[L_DEVICE]))) {
            why = "a key outside its lookup table";
            bad = i;
            break;
        }
        int32_t h = head_lut[hk], th = host_lut[thread[i]], dv = track[i] != 0 ? dev_lut[track[i]] : 0,
                st = site_lut[sk];
        if (!in_range(h, t[B_HEAD].n) || !in_range(h, t[B_FLOW_S].n) || !in_range(h, t[B_FLOW_F].n) ||
            !in_range(th, t[B_HOST].n) || !in_range(dv, t[B_DEVICE].n) || !in_range(st, t[B_SITE].n) ||
            !in_range(a, t[B_ATTRS].n) || !in_range(e, t[B_ERROR].n)) {
            why = "an index outside its table";
            bad = i;
            break;
        }
        r.head = t[B_HEAD].v[h];
        r.flow_s = t[B_FLOW_S].v[h];
        r.flow_f = t[B_FLOW_F].v[h];
        r.host = t[B_HOST].v[th];
        r.dev = t[B_DEVICE].v[dv];
        r.site = t[B_SITE].v[st];
        r.attrs = t[B_ATTRS].v[a];
        r.err = t[B_ERROR].v[e];
        if (row_bound(&r) > end - p) {
            if (fd < 0 || p == begin)
                break;
            for (char *w = begin; w < p;) {
                ssize_t k = write(fd, w, (size_t)(p - w));
                if (k < 0) {
                    if (errno == EINTR)
                        continue;
                    werr = errno;
                    break;
                }
                w += k;
                flushed += k;
            }
            p = begin;
            if (werr || row_bound(&r) > end - p)
                break;
        }
        r.id = id[i];
        r.par = par[i];
        r.ts = (int64_t)((uint64_t)hb[i] - ub);
        r.dur = (int64_t)((uint64_t)he[i] - (uint64_t)hb[i]);
        r.q = q[i];
        r.sub = sub[i];
        r.dts = (int64_t)((uint64_t)ds[i] - ub);
        r.ddur = (int64_t)((uint64_t)de[i] - (uint64_t)ds[i]);
        r.rs = rs[i];
        r.re = re[i];
        r.flags = (track[i] != 0 ? F_DEVICE : 0) | (region[c] ? F_NO_FLOW : 0);
        p = put_row(p, &r);
    }
    Py_END_ALLOW_THREADS
    if (werr) {
        errno = werr;
        PyErr_SetFromErrno(PyExc_OSError);
    } else if (bad >= 0)
        PyErr_Format(PyExc_IndexError, "fill: row %zd: %s", bad, why);
    else
        result = Py_BuildValue("(nnn)", i, (Py_ssize_t)(p - begin), flushed);
done:
    for (int k = 0; k < N_BTABLES; k++) {
        Py_XDECREF(t[k].tuple);
        PyMem_Free(t[k].v);
    }
    PyBuffer_Release(&out);
    batch_release(&b);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", chrome_scan, METH_VARARGS,
     "scan(cols, luts, ncat, attrs, attrs_out) -> (misses, objects, devices, flows): the keys a batch needs text for."},
    {"fill", chrome_fill, METH_VARARGS,
     "fill(out, at, start, stop, base, cols, luts, ncat, tables[, fd]) -> (row, at, flushed): rows' lines into a "
     "buffer (and full buffers to fd)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.chrome",
    "Chrome JSON event lines of a span batch, without the GIL (see cltrace.export.chrome_lines).", -1, methods,
};

PyObject *
cltrace_chrome_module(void)
{
    return PyModule_Create(&module);
}
