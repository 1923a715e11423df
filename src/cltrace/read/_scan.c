/* Trace files written by cltrace, scanned into columns without a Python object per event.
 *
 * The interface is bytes in, packed int64 columns out (``scan.py`` wraps them in numpy arrays):
 *   chrome(data)  -> dict: the X events of cltrace's one-event-per-line Chrome JSON, as columns, the
 *                    distinct name, category and extra-args texts (offset, length) they refer to, and the
 *                    lines this scanner does not read (metadata, counters, anything else) for Python.
 *   pftrace(data) -> dict: the slice BEGIN/END packets of a cltrace .pftrace, with each sequence's state
 *                    (incremental clocks, defaults, interned names and source locations, the device-stamp
 *                    offset) applied in file order, as columns, and the COUNTER packets as columns; the
 *                    interned names, the distinct source locations and the distinct extra annotations by
 *                    (offset, length) into copies of their bytes, given with them; the packets left to
 *                    Python (descriptors, instants).
 *   pftrace_open() / pftrace_feed(state, data), chrome_open() / chrome_feed(state, data, last): the same
 *                    scans fed a window at a time (``windows.py``, ``chrome_windows.py``): the state carries
 *                    from one window to the next, each result holds the window's rows and the tables so far
 *                    (with the bytes they index: a window's bytes are gone after it), and says how much of
 *                    the window its whole packets or lines took.
 *   compressed(data) -> bytes: where the packets holding compressed packets are (``inflate.py`` expands them).
 * chrome and pftrace return None where the file is not in the layout they know (a foreign or damaged file): the
 * general readers (``chrome.py``, ``perfetto.py``) then read it, and say what is wrong with it.
 * Semantics follow those readers exactly; ``chrome_columns.py`` and ``perfetto_columns.py`` say what the
 * columns mean.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../_ext.h"
#include <stdint.h>
#include <string.h>

#define LIMIT ((int64_t)1 << 62) /* stamps and ids beyond this are errors the general reader names */

/* ---- growable int64 columns --------------------------------------------------------------------- */
/* Memory here is PyMem_Raw*: the scans fill it without the GIL, where Python 3.12's PyMem_* crash. */
typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} col;

static int
put(col *c, int64_t x)
{
    if (c->n == c->cap) {
        Py_ssize_t cap = c->cap ? 2 * c->cap : 1024;
        int64_t *v = PyMem_RawRealloc(c->v, (size_t)cap * sizeof(int64_t));
        if (!v)
            return -1;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = x;
    return 0;
}

static void
col_free(col *c)
{
    PyMem_RawFree(c->v);
    c->v = NULL;
    c->n = c->cap = 0;
}

/* The column as bytes; its own memory is freed at once, so a result never holds two copies of its rows. */
static PyObject *
col_bytes(col *c)
{
    PyObject *b = PyBytes_FromStringAndSize((const char *)c->v, c->n * (Py_ssize_t)sizeof(int64_t));
    col_free(c);
    return b;
}

/* ---- a growable byte arena ---------------------------------------------------------------------- */
typedef struct {
    uint8_t *v;
    Py_ssize_t n, cap;
} arena;

/* Append p[:n]; its offset in the arena, -1 on no memory. */
static Py_ssize_t
arena_put(arena *a, const uint8_t *p, Py_ssize_t n)
{
    if (a->n + n > a->cap) {
        Py_ssize_t cap = a->cap ? a->cap : 4096;
        while (cap < a->n + n)
            cap *= 2;
        uint8_t *v = PyMem_RawRealloc(a->v, (size_t)cap);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    if (n)
        memcpy(a->v + a->n, p, (size_t)n);
    a->n += n;
    return a->n - n;
}

static void
arena_free(arena *a)
{
    PyMem_RawFree(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- interner: (key, byte slice) -> dense id ---------------------------------------------------------
 * Slices are kept as (offset, length): into ``base`` where the whole input is one buffer (Chrome JSON), or
 * into the interner's own copy of each distinct slice (``base`` NULL: the .pftrace scanner, whose input
 * comes a window at a time and is gone after each). */
typedef struct {
    const uint8_t *base;
    arena own;
    col off, len, key;
    Py_ssize_t *slot; /* id + 1, 0 empty */
    Py_ssize_t mask;
} interner;

static uint64_t
hash_bytes(const uint8_t *p, Py_ssize_t n, int64_t key)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static const uint8_t *
text_of(interner *t, Py_ssize_t id)
{
    return (t->base ? t->base : t->own.v) + t->off.v[id];
}

static int
intern_init(interner *t, const uint8_t *base)
{
    memset(t, 0, sizeof(*t));
    t->base = base;
    t->mask = 1023;
    t->slot = PyMem_RawCalloc(1024, sizeof(Py_ssize_t));
    return t->slot ? 0 : -1;
}

static void
intern_free(interner *t)
{
    col_free(&t->off);
    col_free(&t->len);
    col_free(&t->key);
    arena_free(&t->own);
    PyMem_RawFree(t->slot);
    t->slot = NULL;
}

static int
intern_grow(interner *t)
{
    Py_ssize_t size = 2 * (t->mask + 1);
    Py_ssize_t *slot = PyMem_RawCalloc((size_t)size, sizeof(Py_ssize_t));
    if (!slot)
        return -1;
    for (Py_ssize_t id = 0; id < t->off.n; id++) {
        uint64_t h = hash_bytes(text_of(t, id), t->len.v[id], t->key.v[id]);
        Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)(size - 1));
        while (slot[i])
            i = (i + 1) & (size - 1);
        slot[i] = id + 1;
    }
    PyMem_RawFree(t->slot);
    t->slot = slot;
    t->mask = size - 1;
    return 0;
}

/* The id of the slice p[:n] under ``key``, a new one where it was not seen; -1 on no memory. */
static int64_t
intern(interner *t, const uint8_t *p, Py_ssize_t n, int64_t key)
{
    uint64_t h = hash_bytes(p, n, key);
    Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)t->mask);
    while (t->slot[i]) {
        Py_ssize_t id = t->slot[i] - 1;
        if (t->len.v[id] == n && t->key.v[id] == key && memcmp(text_of(t, id), p, (size_t)n) == 0)
            return id;
        i = (i + 1) & t->mask;
    }
    Py_ssize_t id = t->off.n;
    Py_ssize_t off = t->base ? p - t->base : arena_put(&t->own, p, n);
    if (off < 0 || put(&t->off, off) || put(&t->len, n) || put(&t->key, key))
        return -1;
    t->slot[i] = id + 1;
    if (2 * t->off.n > t->mask && intern_grow(t))
        return -1;
    return id;
}

/* (offsets, lengths, keys) of the distinct slices; the interner is emptied (one result holds them). */
static PyObject *
intern_table(interner *t)
{
    return Py_BuildValue("(NNN)", col_bytes(&t->off), col_bytes(&t->len), col_bytes(&t->key));
}

/* (offsets, lengths, keys, the bytes they index) of an interner with its own copies; the interner is kept. */
static PyObject *
col_copy(col *c)
{
    return PyBytes_FromStringAndSize((const char *)c->v, c->n * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *
owned_table(interner *t)
{
    return Py_BuildValue("(NNNN)", col_copy(&t->off), col_copy(&t->len), col_copy(&t->key),
                         PyBytes_FromStringAndSize((const char *)t->own.v, t->own.n));
}

/* ==== Chrome JSON ==================================================================================== */

/* Columns of an X event line, in this order (scan.py names them). */
enum { X_LINE, X_SID, X_PARENT, X_NAME, X_CAT, X_TID, X_TS, X_DUR, X_DEVICE, X_QUEUED, X_SUBMIT, X_RAWS, X_RAWE,
       X_EXTRA, X_NCOLS };

typedef struct {
    const uint8_t *p, *end;
} cur;

static int
lit(cur *c, const char *s, Py_ssize_t n)
{
    if (c->end - c->p < n || memcmp(c->p, s, (size_t)n) != 0)
        return 0;
    c->p += n;
    return 1;
}
#define LIT(c, s) lit((c), (s), (Py_ssize_t)sizeof(s) - 1)

/* A JSON integer as the writer writes it: -?(0|[1-9][0-9]*), below LIMIT in size. */
static int
integer(cur *c, int64_t *out)
{
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    const uint8_t *s = c->p;
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && c->p - s < 19)
        v = v * 10 + (uint64_t)(*c->p++ - '0');
    Py_ssize_t n = c->p - s;
    if (n == 0 || (n > 1 && *s == '0') || (c->p < c->end && *c->p >= '0' && *c->p <= '9'))
        return 0;
    if (v >= (uint64_t)LIMIT)
        return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* Microseconds with exactly three decimals, as the writer writes them, to integer nanoseconds. */
static int
micros(cur *c, int64_t *out)
{
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    const uint8_t *s = c->p;
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && c->p - s < 16)
        v = v * 10 + (*c->p++ - '0');
    Py_ssize_t n = c->p - s;
    if (n == 0 || n > 15 || (n > 1 && *s == '0') || c->end - c->p < 4 || c->p[0] != '.')
        return 0;
    for (int k = 1; k <= 3; k++) {
        if (c->p[k] < '0' || c->p[k] > '9')
            return 0;
        v = v * 10 + (c->p[k] - '0');
    }
    c->p += 4;
    if (c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || *c->p == 'e' || *c->p == 'E'))
        return 0;
    *out = neg ? -v : v;
    return 1;
}

/* A JSON string token's extent (escapes skipped, not decoded: Python decodes each distinct one). */
static int
string_token(cur *c, Py_ssize_t *off, Py_ssize_t *n, const uint8_t *base)
{
    if (c->p >= c->end || *c->p != '"')
        return 0;
    const uint8_t *s = c->p++;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\')
            c->p++;
        c->p++;
    }
    if (c->p >= c->end)
        return 0;
    c->p++;
    *off = s - base;
    *n = c->p - s;
    return 1;
}

/* A category as the writer writes it: plain text between quotes, no escapes. */
static int
plain_text(cur *c, Py_ssize_t *off, Py_ssize_t *n, const uint8_t *base)
{
    const uint8_t *s = c->p;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20)
        c->p++;
    if (c->p >= c->end || *c->p != '"')
        return 0;
    *off = s - base;
    *n = c->p - s;
    c->p++;
    return 1;
}

typedef struct {
    interner names, cats, extras;
    col x[X_NCOLS];
} chrome_out;

/* One X line (without its trailing comma) into the columns; 0 where it is not in the writer's layout. */
static int
x_line(chrome_out *o, const uint8_t *base, cur c, int64_t line, int *err)
{
    int64_t v[X_NCOLS];
    Py_ssize_t off, n;
    v[X_LINE] = line;
    if (!LIT(&c, "{\"ph\":\"X\",\"cat\":\"") || !plain_text(&c, &off, &n, base))
        return 0;
    if ((v[X_CAT] = intern(&o->cats, base + off, n, 0)) < 0)
        goto nomem;
    if (!LIT(&c, ",\"name\":") || !string_token(&c, &off, &n, base))
        return 0;
    if ((v[X_NAME] = intern(&o->names, base + off, n, 0)) < 0)
        goto nomem;
    int64_t pid;
    if (!LIT(&c, ",\"pid\":") || !integer(&c, &pid) || !LIT(&c, ",\"tid\":") || !integer(&c, &v[X_TID]) ||
        !LIT(&c, ",\"ts\":") || !micros(&c, &v[X_TS]) || !LIT(&c, ",\"dur\":") || !micros(&c, &v[X_DUR]) ||
        !LIT(&c, ",\"args\":{\"span\":") || !integer(&c, &v[X_SID]) || !LIT(&c, ",\"parent\":") ||
        !integer(&c, &v[X_PARENT]) || !LIT(&c, ",\"source\":\""))
        return 0;
    if (LIT(&c, "host\"")) {
        v[X_DEVICE] = 0;
        v[X_QUEUED] = v[X_SUBMIT] = v[X_RAWS] = v[X_RAWE] = 0;
    }
    else if (LIT(&c, "device\",\"queued_host_ns\":") && integer(&c, &v[X_QUEUED]) &&
             LIT(&c, ",\"submit_host_ns\":") && integer(&c, &v[X_SUBMIT]) && LIT(&c, ",\"device.start\":") &&
             integer(&c, &v[X_RAWS]) && LIT(&c, ",\"device.end\":") && integer(&c, &v[X_RAWE]))
        v[X_DEVICE] = 1;
    else
        return 0;
    /* the rest of args: "" or ',"status":..,"key":value...', then "}}" */
    Py_ssize_t rest = c.end - c.p;
    if (rest < 2 || c.end[-1] != '}' || c.end[-2] != '}')
        return 0;
    rest -= 2;
    if (rest == 0)
        v[X_EXTRA] = -1;
    else if (*c.p != ',')
        return 0;
    else if ((v[X_EXTRA] = intern(&o->extras, c.p, rest, 0)) < 0)
        goto nomem;
    for (int k = 0; k < X_NCOLS; k++)
        if (put(&o->x[k], v[k]))
            goto nomem;
    return 1;
nomem:
    *err = 1;
    return 0;
}

/* A flow event line as the writer writes it (read for its validity only: the reader skips flows). */
static int
flow_line(const uint8_t *base, cur c)
{
    Py_ssize_t off, n;
    int64_t x;
    if (!(LIT(&c, "{\"ph\":\"s\",\"cat\":\"") || LIT(&c, "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"")))
        return 0;
    return plain_text(&c, &off, &n, base) && LIT(&c, ",\"name\":\"launch\",\"id\":") && integer(&c, &x) &&
           LIT(&c, ",\"pid\":") && integer(&c, &x) && LIT(&c, ",\"tid\":") && integer(&c, &x) &&
           LIT(&c, ",\"ts\":") && micros(&c, &x) && LIT(&c, "}") && c.p == c.end;
}

/* A Chrome JSON scan, whole or a window of lines at a time: what carries from one window to the next. */
typedef struct {
    chrome_out o;
    col others_off, others_len, others_line, others_end;
    int64_t line, events, last_comma, commas_ok, closed, after_close, started;
} chrome_scan;

static void
chrome_scan_free(chrome_scan *st)
{
    for (int k = 0; k < X_NCOLS; k++)
        col_free(&st->o.x[k]);
    intern_free(&st->o.names);
    intern_free(&st->o.cats);
    intern_free(&st->o.extras);
    col_free(&st->others_off);
    col_free(&st->others_len);
    col_free(&st->others_line);
    col_free(&st->others_end);
}

/* ``base`` (NULL: the interners copy what they keep, for a scan fed window by window). */
static int
chrome_scan_init(chrome_scan *st, const uint8_t *base)
{
    memset(st, 0, sizeof(*st));
    st->last_comma = -1;
    st->commas_ok = 1;
    if (intern_init(&st->o.names, base) || intern_init(&st->o.cats, base) || intern_init(&st->o.extras, base)) {
        chrome_scan_free(st);
        return -1;
    }
    return 0;
}

/* The lines of p[0:len] (all of them where ``last``, else up to the last newline); offsets in the result
 * count from p. Returns the dict of the module docstring ("consumed": the bytes read), None where the
 * file is not in the writer's layout. */
static PyObject *
chrome_scan_lines(chrome_scan *st, const uint8_t *base, Py_ssize_t len, int last)
{
    const uint8_t *end = base + len;
    int err = 0;
    if (!st->started) {
        if (len < 2 || base[0] != '[' || base[1] != '\n')
            Py_RETURN_NONE;
    }
    const uint8_t *p = base + (st->started ? 0 : 2);
    st->started = 1;
    if (!last) { /* the lines the window holds whole */
        const uint8_t *q = end;
        while (q > p && q[-1] != '\n')
            q--;
        end = q;
    }
    int64_t x_end = 0; /* end offset of the last line read here */
    chrome_out *o = &st->o;
    Py_BEGIN_ALLOW_THREADS
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *le = nl ? nl : end;
        cur c = {p, le};
        while (c.p < c.end && (*c.p == ' ' || *c.p == '\t' || *c.p == '\r'))
            c.p++;
        while (c.end > c.p && (c.end[-1] == ' ' || c.end[-1] == '\t' || c.end[-1] == '\r'))
            c.end--;
        if (c.p == c.end) {
            p = le + 1;
            continue;
        }
        st->line++;
        if (st->closed) {
            st->after_close = 1;
            break;
        }
        if (c.end - c.p == 1 && *c.p == ']') {
            st->closed = 1;
            p = le + 1;
            continue;
        }
        int comma = c.end[-1] == ',';
        if (comma)
            c.end--;
        if (st->last_comma == 0)
            st->commas_ok = 0; /* an event after one without a comma */
        st->last_comma = comma;
        if (c.end - c.p > 8 && memcmp(c.p, "{\"ph\":\"X\"", 9) == 0 && x_line(o, base, c, st->line, &err)) {
            st->events++;
            x_end = le - base;
        }
        else if (err)
            break;
        else if (flow_line(base, c)) {
            st->events++;
            x_end = le - base;
        }
        else if (put(&st->others_off, c.p - base) || put(&st->others_len, c.end - c.p) ||
                 put(&st->others_line, st->line) || put(&st->others_end, le - base)) {
            err = 1;
            break;
        }
        p = le + 1;
    }
    Py_END_ALLOW_THREADS
    if (err)
        return PyErr_NoMemory();
    if (st->after_close)
        Py_RETURN_NONE;
    PyObject *x = PyTuple_New(X_NCOLS);
    if (!x)
        return NULL;
    for (int k = 0; k < X_NCOLS; k++)
        PyTuple_SET_ITEM(x, k, col_bytes(&o->x[k]));
    int owned = o->names.base == NULL;
    return Py_BuildValue("{sNsNsNsNsNsNsNsNsNsLsLsisisL}", "x", x, "names",
                         owned ? owned_table(&o->names) : intern_table(&o->names), "cats",
                         owned ? owned_table(&o->cats) : intern_table(&o->cats), "extras",
                         owned ? owned_table(&o->extras) : intern_table(&o->extras),
                         "others_off", col_bytes(&st->others_off), "others_len", col_bytes(&st->others_len),
                         "others_line", col_bytes(&st->others_line), "others_end", col_bytes(&st->others_end),
                         "lines", PyLong_FromLongLong(st->line), "events", (long long)st->events, "read_end",
                         (long long)x_end, "closed", (int)st->closed, "commas_ok",
                         (int)(st->commas_ok && st->last_comma == 0), "consumed", (long long)(end - base));
}

static PyObject *
chrome(PyObject *self, PyObject *args)
{
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:chrome", &b))
        return NULL;
    chrome_scan st;
    PyObject *res = chrome_scan_init(&st, b.buf) ? PyErr_NoMemory() : chrome_scan_lines(&st, b.buf, b.len, 1);
    chrome_scan_free(&st);
    PyBuffer_Release(&b);
    return res;
}

#define CHROME_CAPSULE "cltrace.scan.chrome_state"

static void
chrome_capsule_free(PyObject *cap)
{
    chrome_scan *st = PyCapsule_GetPointer(cap, CHROME_CAPSULE);
    if (st) {
        chrome_scan_free(st);
        PyMem_RawFree(st);
    }
}

static PyObject *
chrome_open(PyObject *self, PyObject *noargs)
{
    chrome_scan *st = PyMem_RawMalloc(sizeof(chrome_scan));
    if (!st || chrome_scan_init(st, NULL)) {
        PyMem_RawFree(st);
        return PyErr_NoMemory();
    }
    PyObject *cap = PyCapsule_New(st, CHROME_CAPSULE, chrome_capsule_free);
    if (!cap) {
        chrome_scan_free(st);
        PyMem_RawFree(st);
    }
    return cap;
}

/* The next window of a Chrome JSON file (``last``: it ends the file): as chrome() gives, for its whole
 * lines; names, categories and extras are the scan's so far (with the bytes they index). */
static PyObject *
chrome_feed(PyObject *self, PyObject *args)
{
    PyObject *cap;
    Py_buffer b;
    int last;
    if (!PyArg_ParseTuple(args, "Oy*p:chrome_feed", &cap, &b, &last))
        return NULL;
    chrome_scan *st = PyCapsule_GetPointer(cap, CHROME_CAPSULE);
    PyObject *res = st ? chrome_scan_lines(st, b.buf, b.len, last) : NULL;
    PyBuffer_Release(&b);
    return res;
}

/* ==== Perfetto protobuf =============================================================================== */

/* Field numbers (checked against the perfetto package's descriptors by scan.py). */
#define TP_TIMESTAMP 8
#define TP_CLOCK_ID 58
#define TP_SEQ 10
#define TP_FLAGS 13
#define TP_CLEARED 41
#define TP_INTERNED 12
#define TP_SNAPSHOT 6
#define TP_DEFAULTS 59
#define TP_TRACK_EVENT 11
#define TP_DESCRIPTOR 60
#define TP_FIRST_ON_SEQ 87
#define TE_TYPE 9
#define TE_UUID 11
#define TE_CAT_IIDS 3
#define TE_CATEGORIES 22
#define TE_NAME_IID 10
#define TE_NAME 23
#define TE_DEBUG 4
#define TE_FLOW_OLD 36
#define TE_TFLOW_OLD 42
#define TE_FLOW 47
#define TE_TFLOW 48
#define TE_COUNTER 30
#define TE_DCOUNTER 44
#define TE_SITE 33
#define TE_SITE_IID 34
#define DA_NAME_IID 1
#define DA_NAME 10
#define DA_INT 4
#define ID_CATS 1
#define ID_NAMES 2
#define ID_DNAMES 3
#define ID_SITES 4
#define ID_SVALUES 29 /* debug_annotation_string_values: entries of table T_SVALUES (iid 1, str 2, as names) */
#define T_SVALUES 4
#define N_TABLES 5
#define CS_CLOCKS 1
#define CK_ID 1
#define CK_TS 2
#define CK_INCR 3
#define DF_CLOCK 58
#define DF_TE_DEFAULTS 11
#define TD_UUID 11
#define SEQ_CLEARED 1
#define MONOTONIC 3
#define T_BEGIN 1
#define T_END 2
#define T_COUNTER 4

static PyObject *
field_numbers(PyObject *self, PyObject *unused)
{
    return Py_BuildValue(
        "{s(iiiiiiiiiii)s(iiiiiiiiiiiiiii)s(iii)s(iiiii)s(iiii)s(ii)sisi}", "TracePacket", TP_TIMESTAMP, TP_CLOCK_ID,
        TP_SEQ, TP_FLAGS, TP_CLEARED, TP_INTERNED, TP_SNAPSHOT, TP_DEFAULTS, TP_TRACK_EVENT, TP_DESCRIPTOR,
        TP_FIRST_ON_SEQ, "TrackEvent", TE_TYPE, TE_UUID, TE_CAT_IIDS, TE_CATEGORIES, TE_NAME_IID, TE_NAME, TE_DEBUG, TE_FLOW_OLD,
        TE_TFLOW_OLD, TE_FLOW, TE_TFLOW, TE_COUNTER, TE_DCOUNTER, TE_SITE, TE_SITE_IID, "DebugAnnotation",
        DA_NAME_IID, DA_NAME, DA_INT, "InternedData", ID_CATS, ID_NAMES, ID_DNAMES, ID_SITES, ID_SVALUES, "ClockSnapshot",
        CS_CLOCKS, CK_ID, CK_TS, CK_INCR, "TracePacketDefaults", DF_CLOCK, DF_TE_DEFAULTS, "TrackEventDefaults",
        TD_UUID, "SourceLocation", 1);
}

typedef struct {
    const uint8_t *p, *end;
} buf;

static int
varint(buf *b, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end)
            return 0;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *v = r;
            return 1;
        }
    }
    return 0;
}

/* The next field: its number, wire type, varint value or (start, length). 0 at the end, -1 on bad data. */
typedef struct {
    uint32_t num;
    int wire;
    uint64_t v;
    const uint8_t *s;
    Py_ssize_t n;
} field;

static int
next_field(buf *b, field *f)
{
    if (b->p >= b->end)
        return 0;
    uint64_t tag;
    if (!varint(b, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF)
        return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wire = (int)(tag & 7);
    switch (f->wire) {
    case 0:
        return varint(b, &f->v) ? 1 : -1;
    case 1:
        if (b->end - b->p < 8)
            return -1;
        memcpy(&f->v, b->p, 8);
        b->p += 8;
        return 1;
    case 5:
        if (b->end - b->p < 4)
            return -1;
        {
            uint32_t x;
            memcpy(&x, b->p, 4);
            f->v = x;
        }
        b->p += 4;
        return 1;
    case 2: {
        uint64_t n;
        if (!varint(b, &n) || n > (uint64_t)(b->end - b->p))
            return -1;
        f->s = b->p;
        f->n = (Py_ssize_t)n;
        b->p += n;
        return 1;
    }
    default:
        return -1; /* groups: not in these messages */
    }
}

#define MAX_CLOCKS 8

typedef struct {
    uint64_t id;
    int64_t gen;
    uint64_t clock, uuid;
    int nclocks;
    uint64_t clock_id[MAX_CLOCKS];
    int64_t clock_val[MAX_CLOCKS];
    int64_t mono_minus_host;
    int has_offset;
    int64_t dev_offset;
    col iid[N_TABLES]; /* per table: iid -> entry + 1 (0: not interned); source locations: site id + 1 */
    col dn_code;    /* per debug annotation name entry (by iid): standard code + 1, 0 other */
} seqstate;

/* Standard annotations, by code: the reader takes them as span fields. */
static const char *const STD[] = {"span", "parent", "device.start", "device.end"};
#define N_STD 4

/* Columns of a slice packet (BEGIN/END), in this order (scan.py names them). */
enum { P_INDEX, P_TYPE, P_UUID, P_TS, P_SEQ, P_GEN, P_NAME, P_CAT, P_SID_KIND, P_SID, P_PARENT, P_HAS_PARENT,
       P_DEV, P_RAWS, P_HAS_RAWE, P_RAWE, P_EXTRA, P_SITE, P_NCOLS };

/* Columns of a COUNTER packet, in this order (scan.py names them). */
enum { C_INDEX, C_UUID, C_TS, C_VALUE, C_NCOLS };

typedef struct {
    seqstate *seqs;
    Py_ssize_t nseqs, cap;
    col p[P_NCOLS];
    col c[C_NCOLS];
    col ent_seq, ent_gen, ent_table, ent_iid, ent_off, ent_len;
    col py_off, py_len, py_index;
    arena ent_text; /* the entries' texts, copied: (ent_off, ent_len) index it */
    interner extras;
    interner sites; /* distinct SourceLocation messages (interned entries and inline ones) */
    int64_t index;  /* packets scanned so far, over every window */
    int first_snapshot, broken;
} pf;

static seqstate *
get_seq(pf *o, uint64_t id)
{
    for (Py_ssize_t i = 0; i < o->nseqs; i++)
        if (o->seqs[i].id == id)
            return &o->seqs[i];
    if (o->nseqs == o->cap) {
        Py_ssize_t cap = o->cap ? 2 * o->cap : 16;
        seqstate *s = PyMem_RawRealloc(o->seqs, (size_t)cap * sizeof(seqstate));
        if (!s)
            return NULL;
        o->seqs = s;
        o->cap = cap;
    }
    seqstate *s = &o->seqs[o->nseqs++];
    memset(s, 0, sizeof(*s));
    s->id = id;
    return s;
}

/* Set iid -> value + 1 in a per-iid column (iids are small: bounded to keep memory sane). */
static int
set_iid(col *c, uint64_t iid, int64_t value)
{
    if (iid > (1u << 22))
        return -2;
    while ((uint64_t)c->n <= iid)
        if (put(c, 0))
            return -1;
    c->v[iid] = value + 1;
    return 0;
}

static int64_t
get_iid(col *c, uint64_t iid)
{
    return iid < (uint64_t)c->n ? c->v[iid] - 1 : -1;
}

/* Outcomes of a packet step. */
#define OK 0
#define FOREIGN 1 /* not cltrace's layout: the general reader takes the file */
#define NOMEM 2

static int
interned(pf *o, seqstate *st, const uint8_t *s, Py_ssize_t n)
{
    buf b = {s, s + n};
    field f;
    int r;
    while ((r = next_field(&b, &f)) > 0) {
        if (f.wire != 2 || ((f.num < ID_CATS || f.num > ID_SITES) && f.num != ID_SVALUES))
            return FOREIGN; /* a table cltrace does not write: the general reader parses (and checks) it */
        buf e = {f.s, f.s + f.n};
        field g;
        uint64_t iid = 0;
        const uint8_t *name = f.s;
        Py_ssize_t nlen = 0;
        int q;
        while ((q = next_field(&e, &g)) > 0) {
            if (g.num == 1 && g.wire == 0)
                iid = g.v;
            else if (g.num == 2 && g.wire == 2) {
                name = g.s;
                nlen = g.n;
            }
        }
        if (q < 0)
            return FOREIGN;
        int t = f.num == ID_SVALUES ? T_SVALUES : (int)f.num - 1;
        if (t == ID_SITES - 1) { /* the whole SourceLocation: Python reads each distinct one */
            int64_t site = intern(&o->sites, f.s, f.n, 0);
            if (site < 0)
                return NOMEM;
            int rc = set_iid(&st->iid[t], iid, site);
            if (rc)
                return rc == -1 ? NOMEM : FOREIGN;
            continue;
        }
        if ((t == ID_DNAMES - 1 || t == T_SVALUES) && get_iid(&st->iid[t], iid) >= 0)
            return FOREIGN; /* an annotation name or string value redefined: the extras would read ambiguously */
        int64_t ent = o->ent_seq.n;
        Py_ssize_t text = arena_put(&o->ent_text, name, nlen);
        if (text < 0 || put(&o->ent_seq, (int64_t)st->id) || put(&o->ent_gen, st->gen) || put(&o->ent_table, t) ||
            put(&o->ent_iid, (int64_t)iid) || put(&o->ent_off, text) || put(&o->ent_len, nlen))
            return NOMEM;
        int rc = set_iid(&st->iid[t], iid, ent);
        if (rc)
            return rc == -1 ? NOMEM : FOREIGN;
        if (t == ID_DNAMES - 1) {
            int code = 0;
            for (int k = 0; k < N_STD; k++)
                if ((Py_ssize_t)strlen(STD[k]) == nlen && memcmp(STD[k], name, (size_t)nlen) == 0)
                    code = k + 1;
            rc = set_iid(&st->dn_code, iid, code - 1);
            if (rc)
                return rc == -1 ? NOMEM : FOREIGN;
        }
    }
    return r < 0 ? FOREIGN : OK;
}

static int
snapshot(seqstate *st, const uint8_t *s, Py_ssize_t n)
{
    uint64_t ids[MAX_CLOCKS];
    int64_t vals[MAX_CLOCKS];
    int incr[MAX_CLOCKS], k = 0;
    buf b = {s, s + n};
    field f;
    int r;
    while ((r = next_field(&b, &f)) > 0) {
        if (f.num != CS_CLOCKS || f.wire != 2)
            continue;
        uint64_t id = 0, ts = 0, inc = 0;
        buf c = {f.s, f.s + f.n};
        field g;
        int q;
        while ((q = next_field(&c, &g)) > 0) {
            if (g.wire != 0)
                continue;
            if (g.num == CK_ID)
                id = g.v & 0xFFFFFFFFu;
            else if (g.num == CK_TS)
                ts = g.v;
            else if (g.num == CK_INCR)
                inc = g.v;
        }
        if (q < 0 || ts >= (uint64_t)1 << 63)
            return FOREIGN;
        int j;
        for (j = 0; j < k && ids[j] != id; j++)
            ;
        if (j == k) {
            if (k == MAX_CLOCKS)
                return FOREIGN;
            ids[k++] = id;
        }
        vals[j] = (int64_t)ts; /* as a dict by clock id: the last entry wins, in the first one's place */
        incr[j] = inc != 0;
    }
    if (r < 0)
        return FOREIGN;
    int mono = -1;
    for (int j = 0; j < k; j++)
        if (ids[j] == MONOTONIC)
            mono = j;
    for (int j = 0; j < k; j++) {
        if (!incr[j])
            continue;
        int i;
        for (i = 0; i < st->nclocks && st->clock_id[i] != ids[j]; i++)
            ;
        if (i == st->nclocks) {
            if (i == MAX_CLOCKS)
                return FOREIGN;
            st->clock_id[st->nclocks++] = ids[j];
        }
        st->clock_val[i] = vals[j];
        if (mono >= 0)
            st->mono_minus_host = vals[mono] - vals[j];
    }
    return OK;
}

static int
defaults(seqstate *st, const uint8_t *s, Py_ssize_t n)
{
    buf b = {s, s + n};
    field f;
    int r;
    st->clock = 0;
    st->uuid = 0;
    while ((r = next_field(&b, &f)) > 0) {
        if (f.num == DF_CLOCK && f.wire == 0)
            st->clock = f.v & 0xFFFFFFFFu;
        else if (f.num == DF_TE_DEFAULTS && f.wire == 2) {
            buf c = {f.s, f.s + f.n};
            field g;
            int q;
            while ((q = next_field(&c, &g)) > 0) {
                if (g.num != TD_UUID || g.wire != 0)
                    return FOREIGN;
                st->uuid = g.v;
            }
            if (q < 0)
                return FOREIGN;
        }
        else
            return FOREIGN;
    }
    return r < 0 ? FOREIGN : OK;
}

/* The first value of a repeated integer field (packed or not); 0 where it is empty. */
static int
first_of(field *f, int fixed, uint64_t *v, int *has)
{
    if (*has)
        return 1;
    if (f->wire == 2) {
        if (f->n == 0)
            return 1;
        buf b = {f->s, f->s + f->n};
        if (fixed) {
            if (f->n < 8)
                return 0;
            memcpy(v, f->s, 8);
        }
        else if (!varint(&b, v))
            return 0;
        *has = 1;
        return 1;
    }
    if (f->wire != (fixed ? 1 : 0))
        return 0;
    *v = f->v;
    *has = 1;
    return 1;
}

static int
track_event(pf *o, seqstate *st, int64_t index, uint64_t ts_raw, int has_clock, uint64_t clock, const uint8_t *s,
            Py_ssize_t n)
{
    /* the timestamp, as the sequence's clocks read it (every track event advances an incremental clock) */
    uint64_t cid = has_clock && clock ? clock : st->clock;
    int64_t ts;
    if (ts_raw >= (uint64_t)1 << 63)
        return FOREIGN;
    int i;
    for (i = 0; i < st->nclocks && st->clock_id[i] != cid; i++)
        ;
    if (i < st->nclocks) {
        if (__builtin_add_overflow(st->clock_val[i], (int64_t)ts_raw, &st->clock_val[i]))
            return FOREIGN;
        ts = st->clock_val[i];
    }
    else if (cid == MONOTONIC) {
        if (__builtin_sub_overflow((int64_t)ts_raw, st->mono_minus_host, &ts))
            return FOREIGN;
    }
    else
        ts = (int64_t)ts_raw;

    uint64_t type = 0, uuid = st->uuid, name_iid = 0, cat_iid = 0;
    int has_name_iid = 0, has_cat = 0, inline_text = 0;
    uint64_t flow[4] = {0, 0, 0, 0};
    int has_flow[4] = {0, 0, 0, 0};
    int64_t std_val[N_STD];
    int has_std[N_STD] = {0, 0, 0, 0};
    const uint8_t *x0 = NULL, *x1 = NULL;
    int extras_closed = 0;
    int64_t counter = 0;
    int site_kind = 0; /* the source_location oneof: 0 unset, 1 interned (site_iid), 2 inline (site_s) */
    uint64_t site_iid = 0;
    const uint8_t *site_s = NULL;
    Py_ssize_t site_n = 0;
    buf b = {s, s + n};
    field f;
    int r;
    const uint8_t *at = b.p;
    for (; (r = next_field(&b, &f)) > 0; at = b.p) {
        if (x0 && f.num != TE_DEBUG)
            extras_closed = 1; /* the extras must be one run of fields: cltrace writes them last */
        switch (f.num) {
        case TE_TYPE:
            if (f.wire == 0 && f.v <= T_COUNTER)
                type = f.v; /* a closed enum: another value is an unknown field */
            break;
        case TE_COUNTER:
            if (f.wire == 0)
                counter = (int64_t)f.v;
            break;
        case TE_DCOUNTER:
            if (f.wire == 1)
                counter = 0; /* the oneof's other member: counter_value reads 0 */
            break;
        case TE_SITE_IID:
            if (f.wire == 0) {
                site_kind = 1;
                site_iid = f.v;
            }
            break;
        case TE_SITE:
            if (f.wire == 2) {
                if (site_kind == 2)
                    return FOREIGN; /* a message given twice is merged: the general reader does that */
                site_kind = 2;
                site_s = f.s;
                site_n = f.n;
            }
            break;
        case TE_UUID:
            if (f.wire == 0)
                uuid = f.v;
            break;
        case TE_CAT_IIDS:
            if (!first_of(&f, 0, &cat_iid, &has_cat))
                return FOREIGN;
            break;
        case TE_NAME_IID:
            if (f.wire == 0) {
                name_iid = f.v;
                has_name_iid = 1;
            }
            break;
        case TE_NAME:
        case TE_CATEGORIES:
            inline_text = 1;
            break;
        case TE_FLOW:
            if (!first_of(&f, 1, &flow[0], &has_flow[0]))
                return FOREIGN;
            break;
        case TE_TFLOW:
            if (!first_of(&f, 1, &flow[1], &has_flow[1]))
                return FOREIGN;
            break;
        case TE_FLOW_OLD:
            if (!first_of(&f, 0, &flow[2], &has_flow[2]))
                return FOREIGN;
            break;
        case TE_TFLOW_OLD:
            if (!first_of(&f, 0, &flow[3], &has_flow[3]))
                return FOREIGN;
            break;
        case TE_DEBUG: {
            if (f.wire != 2)
                return FOREIGN;
            buf a = {f.s, f.s + f.n};
            field g;
            int q, code = -1, named = 0, value_fields = 0, has_int = 0;
            uint64_t iid = 0, v = 0;
            while ((q = next_field(&a, &g)) > 0) {
                if (g.num == DA_NAME_IID && g.wire == 0) {
                    iid = g.v;
                    named = 1;
                }
                else if (g.num == DA_NAME)
                    named = 2;
                else {
                    value_fields++;
                    if (g.num == DA_INT && g.wire == 0) {
                        has_int = 1;
                        v = g.v;
                    }
                }
            }
            if (q < 0)
                return FOREIGN;
            if (named == 1) {
                if (get_iid(&st->iid[ID_DNAMES - 1], iid) < 0)
                    return FOREIGN; /* a name not interned (yet): "#iid" in the general reader */
                code = (int)get_iid(&st->dn_code, iid);
            }
            if (code >= 0) {
                if (x0 && !extras_closed)
                    extras_closed = 1;
                if (has_std[code])
                    break; /* the first one counts */
                if (!has_int || value_fields != 1)
                    return FOREIGN;
                std_val[code] = (int64_t)v;
                has_std[code] = 1;
            }
            else {
                if (extras_closed)
                    return FOREIGN;
                if (!x0)
                    x0 = at; /* the whole field, tag included: Python parses the run as a TrackEvent */
                x1 = b.p;
            }
            break;
        }
        default:
            return FOREIGN; /* a field cltrace does not write: the general reader parses (and checks) it */
        }
    }
    if (r < 0)
        return FOREIGN;
    if (type == T_COUNTER) {
        int64_t v[C_NCOLS] = {index, (int64_t)uuid, ts, counter};
        for (int k = 0; k < C_NCOLS; k++)
            if (put(&o->c[k], v[k]))
                return NOMEM;
        return OK;
    }
    if (type != T_BEGIN && type != T_END)
        return -1; /* instants and the rest: Python reads them */
    if (type == T_END) {
        int64_t v[P_NCOLS] = {index, T_END, (int64_t)uuid, ts, (int64_t)st->id, st->gen, -1, -1, 0, 0, 0, 0, 0, 0,
                              0, 0, -1, -1};
        for (int k = 0; k < P_NCOLS; k++)
            if (put(&o->p[k], v[k]))
                return NOMEM;
        return OK;
    }
    if (inline_text || !has_name_iid)
        return FOREIGN;
    int64_t name = get_iid(&st->iid[ID_NAMES - 1], name_iid);
    int64_t cat = has_cat ? get_iid(&st->iid[ID_CATS - 1], cat_iid) : -1;
    if (name < 0 || (has_cat && cat < 0))
        return FOREIGN; /* "?" in the general reader: a file cltrace does not write */
    int64_t v[P_NCOLS];
    v[P_INDEX] = index;
    v[P_TYPE] = T_BEGIN;
    v[P_UUID] = (int64_t)uuid;
    v[P_TS] = ts;
    v[P_SEQ] = (int64_t)st->id;
    v[P_GEN] = st->gen;
    v[P_NAME] = name;
    v[P_CAT] = cat;
    if (has_std[0]) {
        v[P_SID_KIND] = 1;
        v[P_SID] = std_val[0];
    }
    else {
        v[P_SID_KIND] = 0;
        v[P_SID] = 0;
        for (int k = 0; k < 4; k++)
            if (has_flow[k]) {
                if (flow[k] >= (uint64_t)LIMIT)
                    return FOREIGN;
                v[P_SID_KIND] = 2;
                v[P_SID] = (int64_t)flow[k];
                break;
            }
    }
    v[P_HAS_PARENT] = has_std[1];
    v[P_PARENT] = has_std[1] ? std_val[1] : 0;
    if (has_std[2]) {
        if (__builtin_sub_overflow(std_val[2], ts, &st->dev_offset))
            return FOREIGN;
        st->has_offset = 1;
        v[P_DEV] = 1;
        v[P_RAWS] = std_val[2];
    }
    else if (st->has_offset) {
        v[P_DEV] = 1;
        if (__builtin_add_overflow(ts, st->dev_offset, &v[P_RAWS]))
            return FOREIGN;
    }
    else {
        v[P_DEV] = 0;
        v[P_RAWS] = 0;
    }
    v[P_HAS_RAWE] = has_std[3];
    v[P_RAWE] = has_std[3] ? std_val[3] : 0;
    if (x0) {
        int64_t id = intern(&o->extras, x0, x1 - x0, (int64_t)((st->id << 20) ^ (uint64_t)st->gen));
        if (id < 0)
            return NOMEM;
        v[P_EXTRA] = id;
    }
    else
        v[P_EXTRA] = -1;
    if (site_kind == 1)
        v[P_SITE] = get_iid(&st->iid[ID_SITES - 1], site_iid); /* -1: not interned, no site */
    else if (site_kind == 2) {
        v[P_SITE] = intern(&o->sites, site_s, site_n, 0);
        if (v[P_SITE] < 0)
            return NOMEM;
    }
    else
        v[P_SITE] = -1;
    for (int k = 0; k < P_NCOLS; k++)
        if (put(&o->p[k], v[k]))
            return NOMEM;
    return OK;
}

/* One packet: the general reader's steps, in its order. -1: leave the packet to Python. */
static int
packet(pf *o, int64_t index, const uint8_t *s, Py_ssize_t n, int *first_snapshot)
{
    buf b = {s, s + n};
    field f;
    int r;
    int has_clock = 0, cleared = 0;
    uint64_t ts = 0, clock = 0, seq = 0, flags = 0;
    const uint8_t *interned_s = NULL, *snap_s = NULL, *def_s = NULL, *te_s = NULL;
    Py_ssize_t interned_n = 0, snap_n = 0, def_n = 0, te_n = 0;
    int descriptor = 0, data = 0; /* data: members of TracePacket's "data" oneof seen (the last one counts) */
    while ((r = next_field(&b, &f)) > 0) {
        if ((f.num == TP_SNAPSHOT || f.num == TP_TRACK_EVENT || f.num == TP_DESCRIPTOR) && ++data > 1)
            return FOREIGN;
        switch (f.num) {
        case TP_TIMESTAMP:
            if (f.wire == 0)
                ts = f.v;
            break;
        case TP_CLOCK_ID:
            if (f.wire == 0) {
                clock = f.v & 0xFFFFFFFFu;
                has_clock = 1;
            }
            break;
        case TP_SEQ:
            if (f.wire == 0)
                seq = f.v & 0xFFFFFFFFu;
            break;
        case TP_FLAGS:
            if (f.wire == 0)
                flags = f.v & 0xFFFFFFFFu;
            break;
        case TP_CLEARED:
            if (f.wire == 0)
                cleared = f.v != 0;
            break;
        case TP_INTERNED:
            if (f.wire != 2 || interned_s)
                return FOREIGN;
            interned_s = f.s;
            interned_n = f.n;
            break;
        case TP_SNAPSHOT:
            if (f.wire != 2 || snap_s)
                return FOREIGN;
            snap_s = f.s;
            snap_n = f.n;
            break;
        case TP_DEFAULTS:
            if (f.wire != 2 || def_s)
                return FOREIGN;
            def_s = f.s;
            def_n = f.n;
            break;
        case TP_TRACK_EVENT:
            if (f.wire != 2 || te_s)
                return FOREIGN;
            te_s = f.s;
            te_n = f.n;
            break;
        case TP_DESCRIPTOR:
            if (f.wire != 2)
                return FOREIGN;
            descriptor = 1;
            break;
        case TP_FIRST_ON_SEQ:
            break;
        default:
            return FOREIGN; /* a field cltrace does not write: the general reader parses (and checks) it */
        }
    }
    if (r < 0)
        return FOREIGN;
    if (index == 0)
        *first_snapshot = snap_s != NULL;
    seqstate *st = get_seq(o, seq);
    if (!st)
        return NOMEM;
    if ((flags & SEQ_CLEARED) || cleared) {
        st->clock = st->uuid = 0;
        st->gen++;
        for (int t = 0; t < N_TABLES; t++)
            st->iid[t].n = 0;
        st->dn_code.n = 0;
    }
    int rc;
    if (def_s && (rc = defaults(st, def_s, def_n)) != OK)
        return rc;
    if (interned_s && (rc = interned(o, st, interned_s, interned_n)) != OK)
        return rc;
    if (snap_s)
        return snapshot(st, snap_s, snap_n);
    if (descriptor)
        return -1;
    if (te_s)
        return track_event(o, st, index, ts, has_clock, clock, te_s, te_n);
    return OK;
}

static void
pf_free(pf *o)
{
    for (Py_ssize_t i = 0; i < o->nseqs; i++) {
        for (int t = 0; t < N_TABLES; t++)
            col_free(&o->seqs[i].iid[t]);
        col_free(&o->seqs[i].dn_code);
    }
    PyMem_RawFree(o->seqs);
    for (int k = 0; k < P_NCOLS; k++)
        col_free(&o->p[k]);
    for (int k = 0; k < C_NCOLS; k++)
        col_free(&o->c[k]);
    col_free(&o->ent_seq);
    col_free(&o->ent_gen);
    col_free(&o->ent_table);
    col_free(&o->ent_iid);
    col_free(&o->ent_off);
    col_free(&o->ent_len);
    arena_free(&o->ent_text);
    col_free(&o->py_off);
    col_free(&o->py_len);
    col_free(&o->py_index);
    intern_free(&o->extras);
    intern_free(&o->sites);
    PyMem_RawFree(o);
}

static pf *
pf_new(void)
{
    pf *o = PyMem_RawCalloc(1, sizeof(pf));
    if (!o)
        return NULL;
    if (intern_init(&o->extras, NULL) || intern_init(&o->sites, NULL)) {
        pf_free(o);
        return NULL;
    }
    return o;
}

/* The complete packets of ``data`` (the file's next bytes) through the sequences' state: the dict of the
 * module docstring for them (rows, counters and packets left to Python: this window's; entries, extras,
 * sites: all so far, their texts copied), "end" the bytes of ``data`` those packets fill; None where the
 * file leaves cltrace's layout (the state is then spent). */
static PyObject *
pf_scan(pf *o, Py_buffer *b)
{
    if (o->broken)
        Py_RETURN_NONE;
    const uint8_t *base = b->buf, *end = base + b->len, *p = base;
    int outcome = OK;
    int64_t last_end = 0;
    Py_BEGIN_ALLOW_THREADS
    while (p < end) {
        if (*p != 0x0a) {
            const uint8_t *q = p;
            while (q < end && *q == 0)
                q++;
            if (q != end)
                outcome = FOREIGN; /* the general reader names the bad byte */
            break;
        }
        buf hb = {p + 1, end};
        uint64_t size;
        if (!varint(&hb, &size)) {
            if (end - (p + 1) >= 10)
                outcome = FOREIGN; /* a bad length, not a cut one */
            break;
        }
        if (size > (uint64_t)(end - hb.p))
            break; /* cut off inside the last packet (or the next window holds the rest) */
        const uint8_t *s = hb.p;
        int rc = packet(o, o->index, s, (Py_ssize_t)size, &o->first_snapshot);
        if (rc == -1) {
            if (put(&o->py_off, s - base) || put(&o->py_len, (int64_t)size) || put(&o->py_index, o->index))
                rc = NOMEM;
            else
                rc = OK;
        }
        if (rc != OK) {
            outcome = rc;
            break;
        }
        p = s + size;
        last_end = p - base;
        o->index++;
    }
    Py_END_ALLOW_THREADS
    if (outcome != OK) {
        o->broken = 1;
        if (outcome == NOMEM)
            return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    PyObject *cols = PyTuple_New(P_NCOLS);
    if (!cols)
        return NULL;
    for (int k = 0; k < P_NCOLS; k++)
        PyTuple_SET_ITEM(cols, k, col_bytes(&o->p[k]));
    return Py_BuildValue("{sNs(NNNN)s(NNNNNNN)sNsNs(NNN)sLsLsi}", "rows", cols, "counters",
                         col_bytes(&o->c[C_INDEX]), col_bytes(&o->c[C_UUID]), col_bytes(&o->c[C_TS]),
                         col_bytes(&o->c[C_VALUE]), "entries", col_copy(&o->ent_seq), col_copy(&o->ent_gen),
                         col_copy(&o->ent_table), col_copy(&o->ent_iid), col_copy(&o->ent_off),
                         col_copy(&o->ent_len), PyBytes_FromStringAndSize((const char *)o->ent_text.v, o->ent_text.n),
                         "extras", owned_table(&o->extras), "sites", owned_table(&o->sites), "python",
                         col_bytes(&o->py_off), col_bytes(&o->py_len), col_bytes(&o->py_index), "packets",
                         (long long)o->index, "end", (long long)last_end, "first_snapshot", o->first_snapshot);
}

static PyObject *
pftrace(PyObject *self, PyObject *args)
{
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:pftrace", &b))
        return NULL;
    pf *o = pf_new();
    PyObject *res = o ? pf_scan(o, &b) : PyErr_NoMemory();
    if (o)
        pf_free(o);
    PyBuffer_Release(&b);
    return res;
}

#define PF_CAPSULE "cltrace.scan.pftrace_state"

static void
pf_capsule_free(PyObject *cap)
{
    pf *o = PyCapsule_GetPointer(cap, PF_CAPSULE);
    if (o)
        pf_free(o);
}

static PyObject *
pftrace_open(PyObject *self, PyObject *noargs)
{
    pf *o = pf_new();
    if (!o)
        return PyErr_NoMemory();
    PyObject *cap = PyCapsule_New(o, PF_CAPSULE, pf_capsule_free);
    if (!cap)
        pf_free(o);
    return cap;
}

/* A scan's state is used by one thread at a time: the caller (``read/windows.py``) feeds it in order. */
static PyObject *
pftrace_feed(PyObject *self, PyObject *args)
{
    PyObject *cap;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "Oy*:pftrace_feed", &cap, &b))
        return NULL;
    pf *o = PyCapsule_GetPointer(cap, PF_CAPSULE);
    PyObject *res = o ? pf_scan(o, &b) : NULL;
    PyBuffer_Release(&b);
    return res;
}

/* compressed(data) -> bytes: int64 triples (packet offset, zlib start, zlib end) of the packets whose one
 * field is compressed_packets (field 50), for ``inflate.py`` to expand in place; the walk stops where
 * the packets do (a cut-off or zero-filled tail, a foreign byte). */
static PyObject *
compressed(PyObject *self, PyObject *args)
{
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:compressed", &b))
        return NULL;
    col out = {0};
    int nomem = 0;
    const uint8_t *base = b.buf, *end = base + b.len, *p = base;
    Py_BEGIN_ALLOW_THREADS
    while (p < end && *p == 0x0a) {
        buf hb = {p + 1, end};
        uint64_t size;
        if (!varint(&hb, &size) || size > (uint64_t)(end - hb.p))
            break;
        const uint8_t *s = hb.p, *e = s + size;
        if (size > 2 && s[0] == 0x92 && s[1] == 0x03) { /* tag of field 50, length-delimited */
            buf fb = {s + 2, e};
            uint64_t n;
            if (varint(&fb, &n) && n == (uint64_t)(e - fb.p)) {
                if (put(&out, p - base) || put(&out, fb.p - base) || put(&out, e - base)) {
                    nomem = 1;
                    break;
                }
            }
        }
        p = e;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyObject *res = nomem ? PyErr_NoMemory() : col_bytes(&out);
    col_free(&out);
    return res;
}

static PyMethodDef methods[] = {
    {"chrome", chrome, METH_VARARGS, "Columns of a cltrace Chrome JSON trace, or None (not its layout)."},
    {"chrome_open", chrome_open, METH_NOARGS, "A scan of a Chrome JSON trace fed a window at a time (chrome_feed)."},
    {"chrome_feed", chrome_feed, METH_VARARGS, "The next window's columns, as chrome gives them, or None."},
    {"pftrace", pftrace, METH_VARARGS, "Columns of a cltrace .pftrace, or None (not its layout)."},
    {"pftrace_open", pftrace_open, METH_NOARGS, "A scan of a .pftrace fed a window at a time (pftrace_feed)."},
    {"pftrace_feed", pftrace_feed, METH_VARARGS, "The next window's columns, as pftrace gives them, or None."},
    {"compressed", compressed, METH_VARARGS, "Offsets of the packets that hold compressed packets."},
    {"field_numbers", field_numbers, METH_NOARGS, "The protobuf field numbers this scanner reads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.scan", "Trace files written by cltrace, scanned into columns.", -1,
    methods,
};

PyObject *
cltrace_scan_module(void)
{
    return PyModule_Create(&module);
}
