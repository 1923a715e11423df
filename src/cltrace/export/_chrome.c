/* Chrome JSON event lines of a batch of spans, without the GIL.
 *
 * The interface is arrays in, bytes out (any contiguous buffer; ``chrome_lines.py`` passes numpy arrays):
 *   encode(ints, idx, start, stop, heads, flow_s, flow_f, hosts, devices, attrs, errors) -> bytes
 *     ints    int64[10, n]: id, parent, ts, dur, queued, submit, dev_ts, dev_dur, raw_start, raw_end
 *     idx     int32[6, n]:  head, host, device, attrs, error (indices into the tables), flags
 *                           (1: has a device slice, 2: no flow between its slices)
 *     tables  sequences of bytes: pre-encoded text the indices pick
 *   Lines of rows start..stop, each ending in ",\n", exactly as ``chrome_lines.encode_python`` writes
 *   them. An index outside its table is an IndexError, before anything is written.
 *
 * The tables are copied into tuples first (bytes are immutable), so the rows are written with the
 * GIL released: the flusher thread encoding a batch does not hold up the traced program.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define N_INTS 10
#define N_IDX 6
#define N_TABLES 7
#define F_DEVICE 1
#define F_NO_FLOW 2

enum { T_HEAD, T_FLOW_S, T_FLOW_F, T_HOST, T_DEVICE, T_ATTRS, T_ERROR };
static const char *const TABLE_NAMES[N_TABLES] = {"heads", "flow_s", "flow_f", "hosts", "devices", "attrs", "errors"};

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
#define PUT(p, pc) (memcpy((p), (pc).p, (size_t)(pc).n), (p) += (pc).n)

/* Most bytes one row can take besides its table text: every literal below, and 20 numbers of at
 * most 21 characters (sign, 19 digits, point) each. */
#define ROW_FIXED 768

static const char DIGITS2[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static char *
put_u64(char *p, uint64_t v)
{
    char tmp[20];
    char *t = tmp + sizeof(tmp);
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        t -= 2;
        memcpy(t, DIGITS2 + 2 * r, 2);
    }
    if (v >= 10) {
        t -= 2;
        memcpy(t, DIGITS2 + 2 * v, 2);
    } else {
        *--t = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + sizeof(tmp) - t);
    memcpy(p, t, n);
    return p + n;
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

static void
tables_free(table *t)
{
    for (int k = 0; k < N_TABLES; k++) {
        Py_XDECREF(t[k].tuple);
        PyMem_Free(t[k].v);
        t[k].tuple = NULL;
        t[k].v = NULL;
    }
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

/* The rows' lines, written from p on; returns the end. The caller sized the buffer. */
static char *
encode_rows(char *p, const int64_t *ints, const int32_t *idx, Py_ssize_t n, Py_ssize_t start, Py_ssize_t stop,
            const table *t)
{
    const int64_t *c_id = ints, *c_par = ints + n, *c_ts = ints + 2 * n, *c_dur = ints + 3 * n,
                  *c_q = ints + 4 * n, *c_sub = ints + 5 * n, *c_dts = ints + 6 * n, *c_ddur = ints + 7 * n,
                  *c_rs = ints + 8 * n, *c_re = ints + 9 * n;
    const int32_t *i_head = idx, *i_host = idx + n, *i_dev = idx + 2 * n, *i_attrs = idx + 3 * n,
                  *i_err = idx + 4 * n, *i_flags = idx + 5 * n;
    for (Py_ssize_t i = start; i < stop; i++) {
        piece head = t[T_HEAD].v[i_head[i]], host = t[T_HOST].v[i_host[i]];
        int flags = i_flags[i];
        char ts[24], dts[24];
        size_t ts_n = (size_t)(put_us(ts, c_ts[i]) - ts), dts_n = 0;

        PUT(p, head);
        PUT(p, host);
        memcpy(p, ts, ts_n);
        p += ts_n;
        LIT(p, ",\"dur\":");
        p = put_us(p, c_dur[i]);
        LIT(p, ",\"args\":");
        char *args = p;
        LIT(p, "{\"span\":");
        p = put_i64(p, c_id[i]);
        LIT(p, ",\"parent\":");
        p = put_i64(p, c_par[i]);
        if (flags & F_DEVICE) {
            LIT(p, ",\"source\":\"device\",\"queued_host_ns\":");
            p = put_i64(p, c_q[i]);
            LIT(p, ",\"submit_host_ns\":");
            p = put_i64(p, c_sub[i]);
            LIT(p, ",\"device.start\":");
            p = put_i64(p, c_rs[i]);
            LIT(p, ",\"device.end\":");
            p = put_i64(p, c_re[i]);
        } else {
            LIT(p, ",\"source\":\"host\"");
        }
        PUT(p, t[T_ERROR].v[i_err[i]]);
        PUT(p, t[T_ATTRS].v[i_attrs[i]]);
        *p++ = '}';
        size_t args_n = (size_t)(p - args);
        LIT(p, "},\n");
        if (!(flags & F_DEVICE))
            continue;

        piece dev = t[T_DEVICE].v[i_dev[i]];
        dts_n = (size_t)(put_us(dts, c_dts[i]) - dts);
        PUT(p, head);
        PUT(p, dev);
        memcpy(p, dts, dts_n);
        p += dts_n;
        LIT(p, ",\"dur\":");
        p = put_us(p, c_ddur[i]);
        LIT(p, ",\"args\":");
        memcpy(p, args, args_n);
        p += args_n;
        LIT(p, "},\n");
        if (flags & F_NO_FLOW)
            continue;

        PUT(p, t[T_FLOW_S].v[i_head[i]]);
        p = put_i64(p, c_id[i]);
        *p++ = ',';
        PUT(p, host);
        memcpy(p, ts, ts_n);
        p += ts_n;
        LIT(p, "},\n");
        PUT(p, t[T_FLOW_F].v[i_head[i]]);
        p = put_i64(p, c_id[i]);
        *p++ = ',';
        PUT(p, dev);
        memcpy(p, dts, dts_n);
        p += dts_n;
        LIT(p, "},\n");
    }
    return p;
}

/* Checks every index of rows start..stop and returns the most bytes they can take (-1: error set). */
static Py_ssize_t
size_rows(const int32_t *idx, Py_ssize_t n, Py_ssize_t start, Py_ssize_t stop, const table *t)
{
    /* idx row -> the table it indexes (flags are row 5, checked separately) */
    static const int which[5] = {T_HEAD, T_HOST, T_DEVICE, T_ATTRS, T_ERROR};
    Py_ssize_t need = 0;
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t row = ROW_FIXED;
        for (int k = 0; k < 5; k++) {
            int32_t j = idx[k * n + i];
            const table *tk = &t[which[k]];
            if (j < 0 || j >= tk->n) {
                PyErr_Format(PyExc_IndexError, "encode: row %zd: %s index %d outside its table of %zd",
                             i, TABLE_NAMES[which[k]], (int)j, tk->n);
                return -1;
            }
            row += 2 * tk->v[j].n;
        }
        int32_t h = idx[i];
        if (h >= t[T_FLOW_S].n || h >= t[T_FLOW_F].n) {
            PyErr_Format(PyExc_IndexError, "encode: row %zd: head %d has no flow text", i, (int)h);
            return -1;
        }
        row += t[T_FLOW_S].v[h].n + t[T_FLOW_F].v[h].n;
        if (need > PY_SSIZE_T_MAX - row) {
            PyErr_NoMemory();
            return -1;
        }
        need += row;
    }
    return need;
}

static PyObject *
chrome_encode(PyObject *self, PyObject *args)
{
    Py_buffer ib, xb;
    Py_ssize_t start, stop;
    PyObject *seqs[N_TABLES];
    table t[N_TABLES];
    PyObject *out = NULL;
    memset(t, 0, sizeof(t));
    if (!PyArg_ParseTuple(args, "y*y*nnOOOOOOO:encode", &ib, &xb, &start, &stop, &seqs[0], &seqs[1], &seqs[2],
                          &seqs[3], &seqs[4], &seqs[5], &seqs[6]))
        return NULL;
    Py_ssize_t n = ib.len / (Py_ssize_t)(N_INTS * sizeof(int64_t));
    if (ib.len % (Py_ssize_t)(N_INTS * sizeof(int64_t)) || xb.len != n * (Py_ssize_t)(N_IDX * sizeof(int32_t))) {
        PyErr_Format(PyExc_ValueError, "encode: need int64[%d, N] and int32[%d, N] buffers; got %zd and %zd bytes",
                     N_INTS, N_IDX, ib.len, xb.len);
        goto done;
    }
    if (start < 0 || stop > n || start > stop) {
        PyErr_Format(PyExc_IndexError, "encode: rows %zd:%zd outside 0:%zd", start, stop, n);
        goto done;
    }
    for (int k = 0; k < N_TABLES; k++)
        if (table_from(seqs[k], &t[k], TABLE_NAMES[k]) < 0)
            goto done;
    const int64_t *ints = (const int64_t *)ib.buf;
    const int32_t *idx = (const int32_t *)xb.buf;
    Py_ssize_t need = size_rows(idx, n, start, stop, t);
    if (need < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, need);
    if (out == NULL)
        goto done;
    char *begin = PyBytes_AS_STRING(out), *end;
    Py_BEGIN_ALLOW_THREADS
    end = encode_rows(begin, ints, idx, n, start, stop, t);
    Py_END_ALLOW_THREADS
    if (_PyBytes_Resize(&out, end - begin) < 0)
        out = NULL;
done:
    tables_free(t);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&xb);
    return out;
}

static PyMethodDef methods[] = {
    {"encode", chrome_encode, METH_VARARGS,
     "encode(ints, idx, start, stop, heads, flow_s, flow_f, hosts, devices, attrs, errors) -> bytes: "
     "the Chrome JSON lines of rows start:stop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace.export._chrome",
    "Chrome JSON event lines of a span batch, without the GIL (see cltrace.export.chrome_lines).", -1, methods,
};

PyMODINIT_FUNC
PyInit__chrome(void)
{
    return PyModule_Create(&module);
}
