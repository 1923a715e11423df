/* Packet rows to protobuf bytes for the Perfetto writer, in one pass and without the GIL.
 *
 * The interface is arrays in, bytes out (any contiguous buffer; ``encoder.py`` passes numpy arrays):
 *   encode(rows, perm, runs, mono, consts, pool, pool_off, pool_len, extras, extras_off, extras_len) -> bytes
 *     rows    int64[16, M]  packet rows column by column (``columns.py``)
 *     perm    int64[N]      the rows to write, in file order (sorted by track and time): no gathered copy
 *     runs    int64[R, 10]  one per track's run of rows: lo, hi, pool ids of the sequence's fields and of
 *                           its four annotation headers (span, parent, device.start, device.end; each for
 *                           a 1-byte value, the next nine for longer ones), then the sequence's state,
 *                           read and written back: last timestamp, last device offset, whether it has one
 *     mono    MONOTONIC - host clock, added to the timestamps written as absolute
 *     consts  int64[8]      pool ids of the row constants (``wire.ROW_CONSTANTS``)
 *     pool / extras         byte strings by id: one buffer, int64 offsets and lengths
 *
 * Each row is one Trace.packet; the field order and every rule match the numpy fallback in
 * ``layout.py`` byte for byte (tests/test_perfetto_native.py holds them to it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_wire.h"

enum { C_TRACK, C_TS, C_K1, C_K2, C_K3, C_G, C_PRE, C_FLOW, C_SID, C_SPANANN, C_PARENT, C_EXTRA, C_RAW, C_RAWS,
       C_RAWE, C_RAWEND, NCOLS };
enum { R_LO, R_HI, R_TAIL, R_HDR, R_LAST = R_HDR + 4, R_OFFSET, R_HAS_OFFSET, RUN_COLS };
enum { K_PACKET, K_TS, K_ABS, K_TYPE, K_FLOW = K_TYPE + 3, NCONSTS = K_FLOW + 2 };
enum { A_SPAN, A_PARENT, A_DEV_START, A_DEV_END };

static inline uint8_t *
put(uint8_t *p, const strings *s, int64_t id)
{
    return copy(p, s->buf + s->off[id], s->len[id]);
}

/* Offsets and lengths inside the buffer: checked once, so rows only check their ids. */
static int
check_strings(const char *what, const Py_buffer *buf, const Py_buffer *off, const Py_buffer *len, strings *s)
{
    if (off->len != len->len || off->len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "encode: %s offsets and lengths must be int64[K] of one size", what);
        return 0;
    }
    s->buf = (const uint8_t *)buf->buf;
    s->off = (const int64_t *)off->buf;
    s->len = (const int64_t *)len->buf;
    s->n = off->len / (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->off[i] < 0 || s->len[i] < 0 || s->off[i] + s->len[i] > buf->len) {
            PyErr_Format(PyExc_ValueError, "encode: %s string %zd lies outside its buffer", what, i);
            return 0;
        }
    }
    return 1;
}

#define BAD_ID(id, s) ((id) < 0 || (id) >= (s)->n)

#define PUT(p, x) ((p) = copy((p), (x).at, (x).len))

/* The packets of rows lo..hi-1, one track's run; NULL and *err set on a bad id. */
static uint8_t *
encode_run(uint8_t *p, const int64_t *const *col, const int64_t *perm, int64_t *run, int64_t mono, const int64_t *k,
           const strings *pool, const strings *extras, const char **err)
{
    int64_t last = run[R_LAST], offset = run[R_OFFSET];
    int has_offset = run[R_HAS_OFFSET] != 0;
    const int64_t *hdr = run + R_HDR;
    const piece packet = get(pool, k[K_PACKET]), tstag = get(pool, k[K_TS]), abs_clock = get(pool, k[K_ABS]),
                tail = get(pool, run[R_TAIL]);
    const piece type[3] = {get(pool, k[K_TYPE]), get(pool, k[K_TYPE + 1]), get(pool, k[K_TYPE + 2])};
    const piece flows[2] = {get(pool, k[K_FLOW]), get(pool, k[K_FLOW + 1])};
    const int64_t *c_ts = col[C_TS], *c_k2 = col[C_K2], *c_pre = col[C_PRE], *c_flow = col[C_FLOW],
                  *c_extra = col[C_EXTRA], *c_sid = col[C_SID], *c_par = col[C_PARENT], *c_raws = col[C_RAWS],
                  *c_rawe = col[C_RAWE], *c_spanann = col[C_SPANANN], *c_rawend = col[C_RAWEND], *c_raw = col[C_RAW];
    const int64_t hi = run[R_HI];
    for (int64_t r = run[R_LO]; r < hi; r++) {
        const int64_t i = perm[r];
        const int64_t ts = c_ts[i], k2 = c_k2[i], pre = c_pre[i], flow = c_flow[i], ex = c_extra[i];
        if (k2 < 0 || k2 > 2 || flow < 0 || flow > 2 || (pre >= 0 && BAD_ID(pre, pool)) ||
            (ex >= 0 && BAD_ID(ex, extras))) {
            *err = "a row's type, flow, prefix or extra is out of range";
            return NULL;
        }
        const int absolute = ts < last;
        /* Unsigned arithmetic: wraps as numpy's int64 does, where signed overflow would be undefined. */
        const uint64_t tsv = absolute ? (uint64_t)ts + (uint64_t)mono : (uint64_t)ts - (uint64_t)last;
        if (!absolute)
            last = ts;
        int64_t te = type[k2].len;
        piece name = {NULL, 0}, fl = {NULL, 0}, a_sid = {NULL, 0}, a_par = {NULL, 0}, a_rs = {NULL, 0},
              a_re = {NULL, 0}, xtra = {NULL, 0};
        uint64_t sid = 0, par = 0, raws = 0, rawe = 0;
        int vs = 0;
        if (pre >= 0) {
            name = get(pool, pre);
            te += name.len;
        }
        const int span_ann = c_spanann[i] != 0;
        if (flow || span_ann) {
            sid = (uint64_t)c_sid[i];
            vs = vlen(sid);
            if (flow) {
                fl = flows[flow - 1];
                te += fl.len + vs;
            }
            if (span_ann) {
                a_sid = get(pool, hdr[A_SPAN] + vs - 1);
                te += a_sid.len + vs;
            }
        }
        par = (uint64_t)c_par[i];
        if (par) {
            int vp = vlen(par);
            a_par = get(pool, hdr[A_PARENT] + vp - 1);
            te += a_par.len + vp;
        }
        if (c_raw[i]) {
            raws = (uint64_t)c_raws[i];
            int64_t off = (int64_t)(raws - (uint64_t)ts);
            if (!has_offset || off != offset) {
                int v = vlen(raws);
                a_rs = get(pool, hdr[A_DEV_START] + v - 1);
                te += a_rs.len + v;
                offset = off;
                has_offset = 1;
            }
        }
        if (c_rawend[i]) {
            rawe = (uint64_t)c_rawe[i];
            int v = vlen(rawe);
            a_re = get(pool, hdr[A_DEV_END] + v - 1);
            te += a_re.len + v;
        }
        if (ex >= 0) {
            xtra = get(extras, ex);
            te += xtra.len;
        }
        const int64_t body = tstag.len + vlen(tsv) + (absolute ? abs_clock.len : 0) + tail.len +
                             vlen((uint64_t)te) + te;

        PUT(p, packet);
        p = put_varint(p, (uint64_t)body);
        PUT(p, tstag);
        p = put_varint(p, tsv);
        if (absolute)
            PUT(p, abs_clock);
        PUT(p, tail);
        p = put_varint(p, (uint64_t)te);
        PUT(p, type[k2]);
        PUT(p, name);
        p = put_slice_fields(p, fl, a_sid, sid, a_par, par, a_rs, raws, a_re, rawe);
        PUT(p, xtra);
    }
    run[R_LAST] = last;
    run[R_OFFSET] = offset;
    run[R_HAS_OFFSET] = has_offset;
    return p;
}

/* The most bytes one row of a run can take: every field present, every varint 10 bytes. */
static int64_t
row_bound(const int64_t *run, const int64_t *k, const strings *pool, int64_t longest_prefix, int64_t longest_extra)
{
    int64_t most = 0;
    for (int c = 0; c < NCONSTS; c++)
        most += pool->len[k[c]];
    for (int a = 0; a < 4; a++)
        most += pool->len[run[R_HDR + a] + 9];
    return most + pool->len[run[R_TAIL]] + longest_prefix + longest_extra + 10 * 9;
}

static int64_t
longest(const strings *s)
{
    int64_t most = 0;
    for (Py_ssize_t i = 0; i < s->n; i++)
        if (s->len[i] > most)
            most = s->len[i];
    return most;
}

static PyObject *
packets_encode(PyObject *self, PyObject *args)
{
    Py_buffer rb, ob, ub, kb, pb, pob, plb, xb, xob, xlb;
    long long mono;
    if (!PyArg_ParseTuple(args, "y*y*w*Ly*y*y*y*y*y*y*:encode", &rb, &ob, &ub, &mono, &kb, &pb, &pob, &plb, &xb, &xob,
                          &xlb))
        return NULL;
    PyObject *result = NULL;
    strings pool, extras;
    if (rb.len % (Py_ssize_t)(NCOLS * sizeof(int64_t)) || ub.len % (Py_ssize_t)(RUN_COLS * sizeof(int64_t)) ||
        ob.len % (Py_ssize_t)sizeof(int64_t) || kb.len != (Py_ssize_t)(NCONSTS * sizeof(int64_t))) {
        PyErr_Format(PyExc_ValueError, "encode: need rows int64[%d, M], perm int64[N], runs int64[R, %d], "
                     "consts int64[%d]", NCOLS, RUN_COLS, NCONSTS);
        goto done;
    }
    if (!check_strings("pool", &pb, &pob, &plb, &pool) || !check_strings("extras", &xb, &xob, &xlb, &extras))
        goto done;
    const int64_t *k = (const int64_t *)kb.buf;
    int64_t *runs = (int64_t *)ub.buf;
    Py_ssize_t m = rb.len / (Py_ssize_t)(NCOLS * sizeof(int64_t));
    const int64_t *col[NCOLS];
    for (int c = 0; c < NCOLS; c++)
        col[c] = (const int64_t *)rb.buf + c * m;
    const int64_t *perm = (const int64_t *)ob.buf;
    Py_ssize_t n = ob.len / (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (perm[i] < 0 || perm[i] >= m) {
            PyErr_SetString(PyExc_ValueError, "encode: a row index in perm is out of range");
            goto done;
        }
    }
    Py_ssize_t nruns = ub.len / (Py_ssize_t)(RUN_COLS * sizeof(int64_t));
    for (int c = 0; c < NCONSTS; c++) {
        if (BAD_ID(k[c], &pool)) {
            PyErr_SetString(PyExc_ValueError, "encode: a row constant's pool id is out of range");
            goto done;
        }
    }
    int64_t longest_prefix = longest(&pool), longest_extra = longest(&extras);
    /* Runs must tile the rows in order, and their pool ids must be valid: then no row reads outside. */
    int64_t size = 0, expect = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        const int64_t *run = runs + r * RUN_COLS;
        int ok = run[R_LO] == expect && run[R_HI] >= run[R_LO] && run[R_HI] <= n && !BAD_ID(run[R_TAIL], &pool);
        for (int a = 0; a < 4 && ok; a++)
            ok = !BAD_ID(run[R_HDR + a], &pool) && !BAD_ID(run[R_HDR + a] + 9, &pool);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "encode: run %zd is out of range or out of order", r);
            goto done;
        }
        expect = run[R_HI];
        size += (run[R_HI] - run[R_LO]) * row_bound(run, k, &pool, longest_prefix, longest_extra);
    }
    if (expect != n) {
        PyErr_SetString(PyExc_ValueError, "encode: the runs do not cover the rows");
        goto done;
    }
    /* Written into a scratch block of the bound, then copied at its exact size: a bytes object of the
     * bound (several times the packets) would be a fresh mapping each call, a page fault per 4 kB. */
    uint8_t *out = (uint8_t *)malloc(size ? (size_t)size : 1), *p = out;
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char *err = NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < nruns && p != NULL; r++)
        p = encode_run(p, col, perm, runs + r * RUN_COLS, (int64_t)mono, k, &pool, &extras, &err);
    Py_END_ALLOW_THREADS
    if (p == NULL)
        PyErr_Format(PyExc_ValueError, "encode: %s", err);
    else
        result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)(p - out));
    free(out);
done:
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&ub);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&pob);
    PyBuffer_Release(&plb);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&xob);
    PyBuffer_Release(&xlb);
    return result;
}


/* fill(rows, thr, hb, he, ids, md, group, hpre, flows, par, xid, dv, dtr, ds, de, dpre, raws, rawe): the packet rows
 * of a batch (``rows.batch_rows``) in one pass, every column written (no zeroing first). With n spans and m of them
 * on a device: rows int64[16, W] (W >= 2n + 2m) gets host BEGINs at 0..n-1, host ENDs at n..2n-1, device BEGINs at
 * 2n..2n+m-1 and device ENDs after them. Per span (n): thr, hb, he, ids, md, group, hpre, par, xid, ds, de, raws,
 * rawe int64 and flows uint8 (a launch: its slices are joined by a flow); per device span (m): dv (its row), dtr,
 * dpre int64. */
enum { FLOW_OUT = 1, FLOW_IN = 2, K2_END = 1 };

static PyObject *
packets_fill(PyObject *self, PyObject *args)
{
    enum { NB = 18 };
    Py_buffer b[NB];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "w*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*:fill", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
                          &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14], &b[15], &b[16], &b[17]))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t n = b[1].len / 8, m = b[11].len / 8;
    static const int per_span[] = {1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 16, 17}, per_dev[] = {11, 12, 15};
    int ok = b[8].len == n && b[0].len % (NCOLS * 8) == 0 && b[0].len / (NCOLS * 8) >= 2 * n + 2 * m;
    for (size_t j = 0; ok && j < sizeof per_span / sizeof *per_span; j++)
        ok = b[per_span[j]].len == n * 8;
    for (size_t j = 0; ok && j < sizeof per_dev / sizeof *per_dev; j++)
        ok = b[per_dev[j]].len == m * 8;
    const int64_t *dv = (const int64_t *)b[11].buf;
    for (Py_ssize_t j = 0; ok && j < m; j++)
        ok = dv[j] >= 0 && dv[j] < n;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "fill: columns of unequal lengths, too few rows, or a device row out of range");
        goto done;
    }
    const Py_ssize_t w = b[0].len / (NCOLS * 8);
    int64_t *col[NCOLS];
    for (int c = 0; c < NCOLS; c++)
        col[c] = (int64_t *)b[0].buf + c * w;
#define I64(k) ((const int64_t *)b[k].buf)
    const int64_t *thr = I64(1), *hb = I64(2), *he = I64(3), *ids = I64(4), *md = I64(5), *group = I64(6),
                  *hpre = I64(7), *par = I64(9), *xid = I64(10), *dtr = I64(12), *ds = I64(13), *de = I64(14),
                  *dpre = I64(15), *raws = I64(16), *rawe = I64(17);
    const uint8_t *flows = (const uint8_t *)b[8].buf;
#undef I64
    Py_BEGIN_ALLOW_THREADS
    for (int half = 0; half < 2; half++) {
        const Py_ssize_t cnt = half ? m : n, at = half ? 2 * n : 0;
        for (Py_ssize_t j = 0; j < cnt; j++) {
            const Py_ssize_t i = half ? dv[j] : j, bi = at + j, ei = at + cnt + j;
            const int64_t track = half ? dtr[j] : thr[i], t0 = half ? ds[i] : hb[i], t1 = half ? de[i] : he[i];
            const int f = flows[i] != 0;
            col[C_TRACK][bi] = col[C_TRACK][ei] = track;
            col[C_TS][bi] = t0;
            col[C_TS][ei] = t1;
            col[C_K1][bi] = col[C_SID][bi] = ids[i];
            col[C_K1][ei] = md[i];
            col[C_K2][bi] = 0;
            col[C_K2][ei] = K2_END;
            col[C_K3][bi] = 0;
            col[C_K3][ei] = -ids[i];
            col[C_G][bi] = col[C_G][ei] = group[i];
            col[C_PRE][bi] = half ? dpre[j] : hpre[i];
            col[C_PRE][ei] = -1;
            col[C_FLOW][bi] = f ? (half ? FLOW_IN : FLOW_OUT) : 0;
            col[C_SPANANN][bi] = !f;
            col[C_PARENT][bi] = half ? 0 : par[i];
            col[C_EXTRA][bi] = half ? -1 : xid[i];
            col[C_RAW][bi] = half;
            col[C_RAWS][bi] = half ? raws[i] : 0;
            col[C_RAWE][bi] = half ? rawe[i] : 0;
            col[C_RAWEND][bi] = half ? (uint64_t)rawe[i] - (uint64_t)raws[i] != (uint64_t)t1 - (uint64_t)t0 : 0;
            col[C_FLOW][ei] = col[C_SID][ei] = col[C_SPANANN][ei] = col[C_PARENT][ei] = 0;
            col[C_EXTRA][ei] = -1;
            col[C_RAW][ei] = col[C_RAWS][ei] = col[C_RAWE][ei] = col[C_RAWEND][ei] = 0;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (int j = 0; j < NB; j++)
        if (b[j].obj != NULL)
            PyBuffer_Release(&b[j]);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", packets_encode, METH_VARARGS,
     "encode(rows, perm, runs, mono, consts, pool, pool_off, pool_len, extras, extras_off, extras_len) -> bytes."},
    {"fill", packets_fill, METH_VARARGS,
     "fill(rows, thr, hb, he, ids, md, group, hpre, flows, par, xid, dv, dtr, ds, de, dpre, raws, rawe): a batch's rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace.export.perfetto._packets",
    "Perfetto packet rows to protobuf bytes without the GIL (see cltrace.export.perfetto.encoder).", -1, methods,
};

PyMODINIT_FUNC
PyInit__packets(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    /* The row and run layouts compiled in, checked against columns.py before the module is used. */
    if (PyModule_AddIntConstant(m, "NCOLS", NCOLS) < 0 || PyModule_AddIntConstant(m, "RUN_COLS", RUN_COLS) < 0 ||
        PyModule_AddIntConstant(m, "NCONSTS", NCONSTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
