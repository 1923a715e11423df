/* The .pftrace writer's per-batch work in one C pass: from a SpanBatch's columns straight to packet bytes.
 *
 * A ``Writer`` owns what the numpy path keeps between writes (``order.HoldBack`` and the sequences' state):
 * each track's template ids, incremental clock and last device offset; the parents that arrived lately (a
 * window of 65 536) and the last descendant ids of parents still to come; the rows held for a parent or for
 * the next write (with copies of their extra bytes); the interned name templates already in the pool.
 * A write is two calls with Python between them, for the few new ids only:
 *   prepare(attrs, thread, status, site, cat, name, track, deep, errors) -> (firsts, new_tracks, hmiss, dmiss)
 *     the rows whose annotation bytes Python must build (runs of equal attributes as ``rows._extras`` finds
 *     them, one per distinct (attrs object, thread, failure, site), an error text its own), the tracks to
 *     open, and the (name key, site) templates not yet in the pool, host ones then device ones, each sorted
 *     as ``Tracks.prefix_ids`` interns them;
 *   write(id, parent, cat, thread, hb, he, track, ds, de, raws, rawe, leaf, region, hpids, dpids, extras,
 *         counters, pool, pool_off, pool_len, consts, mono) -> (bytes, run_tracks, opened, rows)
 *     the packets: groups and last descendants (``HoldBack.groups``), hold-back (``HoldBack.hold_back``),
 *     order (``order.order``) and encoding (``layout.encode_rows``), the GIL released throughout.
 *   drain(pool, pool_off, pool_len, consts, mono) -> the same tuple for every held row (at close).
 * Python then writes each run's sequence header (a track's first packet) and pending interned data first.
 * The bytes are those of the numpy path, byte for byte (tests/test_perfetto_native.py holds them to it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../../_ext.h"
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../../_mix.h"

#include "_wire.h"

enum { K_PACKET, K_TS, K_ABS, K_TYPE, K_FLOW = K_TYPE + 3, NCONSTS = K_FLOW + 2 };
enum { FLOW_OUT = 1, FLOW_IN = 2 };
enum { EV_HB, EV_HE, EV_DB, EV_DE, EV_ROW };
#define ARRIVED_WINDOW 65536
#define MAX_HELD_GROUPS 4096
#define MAX_TRACK (1 << 20)
#define EMPTY INT64_MIN

static int reserve(void **p, size_t *cap, size_t need, size_t size);

/* ---- a hash map of (int64, int64) -> int64, linear probing ------------------------------------------ */
typedef struct {
    int64_t k1, k2, v;
} slot_t;
typedef struct {
    slot_t *s;
    size_t cap, n;
    size_t *used, nused, cap_used; /* the slots filled, where ``map_reset`` is to clear only those */
    int per_call;
} map_t;

static inline size_t
home(const map_t *m, int64_t a, int64_t b)
{
    return (size_t)(mix((uint64_t)a ^ mix((uint64_t)b + 0x9e3779b97f4a7c15ULL)) & (m->cap - 1));
}

/* Empties the map with room for ``need`` keys, reused between calls (no fresh pages each write); a
 * per-call map clears only the slots it filled (a batch of 16384 spans: 1.5 MB of slots a map). */
static int
map_reset(map_t *m, size_t need)
{
    size_t cap = 64;
    while (cap < 2 * need)
        cap *= 2;
    if (cap > m->cap) {
        free(m->s);
        m->s = malloc(cap * sizeof(slot_t));
        m->cap = m->s ? cap : 0;
        if (!m->s)
            return -1;
        for (size_t i = 0; i < m->cap; i++)
            m->s[i].k1 = EMPTY;
    } else if (m->per_call) {
        for (size_t j = 0; j < m->nused; j++)
            m->s[m->used[j]].k1 = EMPTY;
    } else if (m->n) {
        for (size_t i = 0; i < m->cap; i++)
            m->s[i].k1 = EMPTY;
    }
    m->n = m->nused = 0;
    return 0;
}

static inline slot_t *
map_find(const map_t *m, int64_t a, int64_t b)
{
    if (!m->n)
        return NULL;
    for (size_t i = home(m, a, b);; i = (i + 1) & (m->cap - 1)) {
        slot_t *s = &m->s[i];
        if (s->k1 == EMPTY)
            return NULL;
        if (s->k1 == a && s->k2 == b)
            return s;
    }
}

static slot_t *map_put(map_t *m, int64_t a, int64_t b, int64_t v, int *fresh);

static int
map_grow(map_t *m)
{
    map_t g;
    memset(&g, 0, sizeof g);
    if (map_reset(&g, m->cap ? m->cap : 32) < 0)
        return -1;
    g.used = m->used;
    g.cap_used = m->cap_used;
    g.per_call = m->per_call;
    for (size_t i = 0; i < m->cap; i++)
        if (m->s[i].k1 != EMPTY && !map_put(&g, m->s[i].k1, m->s[i].k2, m->s[i].v, NULL)) {
            free(g.s);
            return -1;
        }
    free(m->s);
    *m = g;
    return 0;
}

/* The slot of (a, b), inserted with value v where absent (*fresh set). NULL: out of memory. */
static slot_t *
map_put(map_t *m, int64_t a, int64_t b, int64_t v, int *fresh)
{
    if (2 * (m->n + 1) > m->cap + 2 && map_grow(m) < 0) /* at most half full, less a slot or so */
        return NULL;
    for (size_t i = home(m, a, b);; i = (i + 1) & (m->cap - 1)) {
        slot_t *s = &m->s[i];
        if (s->k1 == EMPTY) {
            if (m->per_call) {
                if (reserve((void **)&m->used, &m->cap_used, m->nused + 1, sizeof(size_t)) < 0)
                    return NULL;
                m->used[m->nused++] = i;
            }
            s->k1 = a;
            s->k2 = b;
            s->v = v;
            m->n++;
            if (fresh)
                *fresh = 1;
            return s;
        }
        if (s->k1 == a && s->k2 == b) {
            if (fresh)
                *fresh = 0;
            return s;
        }
    }
}

/* Removes a slot, shifting later entries of its cluster back (no tombstones). */
static void
map_del(map_t *m, slot_t *s)
{
    const size_t mask = m->cap - 1;
    size_t i = (size_t)(s - m->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->s[j].k1 == EMPTY)
            break;
        size_t k = home(m, m->s[j].k1, m->s[j].k2);
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].k1 = EMPTY;
    m->n--;
}

static int
reserve(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}
#define RESERVE(arr, cap, need) reserve((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ---- rows and events ------------------------------------------------------------------------------------ */
typedef struct {
    int64_t tail, hdr[4], last, offset;
    uint8_t has_offset, has_last, known, mark;
} track_t;

/* One packet's fields (``columns.py``), with its extra bytes (borrowed, or owned where held). */
typedef struct {
    int64_t track, ts, k1, k3, g, pre, sid, parent, raws, rawe;
    int32_t k2, flow, spanann, raw, rawend;
    const uint8_t *x;
    int64_t xlen;
} row_t;

/* What ordering and hold-back read of a row; the rest is read from the columns when it is encoded.
 * Aligned so that copies are vector moves (unaligned, gcc copied it with ``rep movs``: 25 % of a write). */
typedef struct {
    int64_t ts, k1, k3, g;
    int32_t track;
    uint32_t pos, idx;
    uint8_t k2, kind, held; /* held: 1 for a parent, 2 for the next write */
} __attribute__((aligned(16))) ev_t;

typedef struct {
    PyObject_HEAD
    track_t *tracks;
    size_t ntracks;
    map_t arrived, pend, groups, prefix;
    int64_t *ring;
    size_t ring_n, ring_at;
    row_t *held, *tail;
    size_t nheld, cap_held, ntail, cap_tail;
    int64_t stamp;
    /* a write's scratch, reused */
    Py_ssize_t n;  /* spans of the prepared batch (-1: none) */
    int64_t *xid, *hpre, *dpre, *md, *group, *up;
    size_t cap_n;
    uint8_t *padded; /* the pool's bytes with room to read 16 past any template */
    size_t cap_padded;
    uint8_t *flows, *state;
    int64_t *miss;  /* (key, site, row slot) triples from prepare: host ones, then device ones */
    size_t nmiss, nhmiss, cap_miss;
    int64_t *missmap;
    size_t cap_missmap;
    map_t ids, arr, bgroups, mins, xkeys, seen;
    ev_t *ev, *ev2;
    size_t cap_ev, cap_ev2;
    row_t *rows;
    size_t nrows, cap_rows;
    uint8_t **frees;
    size_t nfrees, cap_frees;
    const uint8_t **xp;
    int64_t *xl;
    size_t cap_x;
    uint8_t *out;
    size_t cap_out;
    int64_t *runs, *opened, *written, *bend;
    size_t nruns, nopened, nwritten, cap_runs, cap_opened, cap_written, cap_bend;
    int bucketed; /* ev holds each track's events together, runs (ascending) ending at bend[track] */
    size_t xbytes; /* the batch's annotation bytes, for the output's bound */
} Writer;

static int
track_room(Writer *w, int64_t t)
{
    if ((size_t)t < w->ntracks)
        return 0;
    size_t n = w->ntracks ? w->ntracks : 16;
    while (n <= (size_t)t)
        n *= 2;
    track_t *p = realloc(w->tracks, n * sizeof(track_t));
    if (!p)
        return -1;
    memset(p + w->ntracks, 0, (n - w->ntracks) * sizeof(track_t));
    w->tracks = p;
    w->ntracks = n;
    return 0;
}

/* ---- prepare ------------------------------------------------------------------------------------------ */
static int
cmp_miss(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

#define NEED(buf, count, size, what)                                                                        \
    if ((buf).len != (Py_ssize_t)(count) * (Py_ssize_t)(size)) {                                            \
        PyErr_Format(PyExc_ValueError, "%s: %s must hold %zd items of %d bytes", fn, what, (Py_ssize_t)(count), \
                     (int)(size));                                                                          \
        goto done;                                                                                          \
    }

/* A name template's key, as ``Tracks.prefix_ids`` packs it. */
static inline int64_t
prefix_key(int64_t track, int64_t cat, int64_t name)
{
    return (int64_t)(((uint64_t)track << 44) | ((uint64_t)cat << 28) | (uint64_t)name);
}

/* A miss: its slot in the batch's template table (-2 - slot), added once per distinct key. */
static int64_t
miss(Writer *w, int64_t key, int64_t site)
{
    int fresh;
    slot_t *s = map_put(&w->seen, key, site, (int64_t)w->nmiss, &fresh);
    if (!s)
        return INT64_MIN;
    if (fresh) {
        if (RESERVE(w->miss, w->cap_miss, 3 * (w->nmiss + 1)) < 0)
            return INT64_MIN;
        w->miss[3 * w->nmiss] = key;
        w->miss[3 * w->nmiss + 1] = site;
        w->miss[3 * w->nmiss + 2] = (int64_t)w->nmiss;
        w->nmiss++;
    }
    return -2 - s->v;
}

static PyObject *
w_prepare(Writer *w, PyObject *args)
{
    const char *fn = "prepare";
    PyObject *attrs, *deep_o, *errors, *result = NULL, *firsts = NULL, *tracks = NULL, *hm = NULL, *dm = NULL;
    Py_buffer thr_b, st_b, site_b, cat_b, name_b, trk_b, deep_b = {0};
    if (!PyArg_ParseTuple(args, "O!y*y*y*y*y*y*OO:prepare", &PyList_Type, &attrs, &thr_b, &st_b, &site_b, &cat_b,
                          &name_b, &trk_b, &deep_o, &errors))
        return NULL;
    int have_deep = deep_o != Py_None;
    if (have_deep && PyObject_GetBuffer(deep_o, &deep_b, PyBUF_SIMPLE) < 0)
        goto done;
    w->n = -1;
    const Py_ssize_t n = PyList_GET_SIZE(attrs);
    NEED(thr_b, n, 8, "thread");
    NEED(st_b, n, 1, "status");
    NEED(site_b, n, 4, "site");
    NEED(cat_b, n, 2, "cat");
    NEED(name_b, n, 4, "name");
    NEED(trk_b, n, 8, "track");
    if (errors != Py_None && (!PyList_Check(errors) || PyList_GET_SIZE(errors) != n)) {
        PyErr_SetString(PyExc_ValueError, "prepare: errors must be None or a list, one per span");
        goto done;
    }
    const int64_t *thr = thr_b.buf, *trk = trk_b.buf;
    const int8_t *st = st_b.buf;
    const int32_t *site = site_b.buf, *name = name_b.buf;
    const int16_t *cat = cat_b.buf;
    const uint8_t *deep = have_deep ? deep_b.buf : NULL;
    const Py_ssize_t ndeep = have_deep ? deep_b.len : 0;
    int64_t most = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (thr[i] < 0 || thr[i] >= MAX_TRACK || trk[i] < 0 || trk[i] >= MAX_TRACK || cat[i] < 0 || name[i] < 0 ||
            name[i] >= (1 << 28)) {
            PyErr_SetString(PyExc_ValueError, "prepare: a track, category or name id is out of range");
            goto done;
        }
        if (thr[i] > most)
            most = thr[i];
        if (trk[i] > most)
            most = trk[i];
    }
    size_t had = w->cap_n;
    if (RESERVE(w->xid, w->cap_n, (size_t)n + 1) < 0 || track_room(w, most) < 0)
        goto nomem;
    if (w->cap_n != had) { /* the other per-span arrays share cap_n: grown with it */
        int64_t **arrs[] = {&w->hpre, &w->dpre, &w->md, &w->group, &w->up};
        for (size_t j = 0; j < sizeof arrs / sizeof *arrs; j++) {
            int64_t *p = realloc(*arrs[j], w->cap_n * 8);
            if (!p)
                goto nomem;
            *arrs[j] = p;
        }
        uint8_t *f = realloc(w->flows, w->cap_n), *s = realloc(w->state, w->cap_n);
        if (f)
            w->flows = f;
        if (s)
            w->state = s;
        if (!f || !s)
            goto nomem;
    }
    firsts = PyList_New(0);
    tracks = PyList_New(0);
    if (!firsts || !tracks)
        goto done;

    /* Annotation bytes, as ``rows._extras`` numbers them: a row starts a run where its thread, failure, site
     * (with callers anywhere), error text or attributes differ from the row before, attributes compared by
     * value (``!=``; where any comparison raises, every row starts one); each run that needs bytes takes
     * those of the first run with its (attrs object, thread, failure, site), or new ones (an error text
     * makes its own). Python makes the new ones, for ``firsts``. */
    int all_changed = 0;
restart:
    if (map_reset(&w->xkeys, 64) < 0)
        goto nomem;
    if (PyList_SetSlice(firsts, 0, PyList_GET_SIZE(firsts), NULL) < 0)
        goto done;
    int64_t nfirst = 0, head = -1;
    PyObject *pa = NULL, *pe = NULL, *truth_of = NULL;
    int64_t pt = -1, ps = 0;
    int pb = -1, truth = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyList_GET_ITEM(attrs, i), *e = errors == Py_None ? Py_None : PyList_GET_ITEM(errors, i);
        const int bad = st[i] != 0;
        const int64_t t = thr[i], s = have_deep ? site[i] : 0;
        int changed = i == 0 || all_changed || t != pt || bad != pb || s != ps;
        if (i && a != pa) {
            int eq = PyObject_RichCompareBool(a, pa, Py_EQ);
            if (eq < 0) {
                if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError))
                    goto done;
                PyErr_Clear();
                all_changed = 1;
                goto restart;
            }
            changed |= !eq;
        }
        if (i && e != pe) {
            int eq = PyObject_RichCompareBool(e, pe, Py_EQ);
            if (eq < 0)
                goto done;
            changed |= !eq;
        }
        pa = a, pt = t, pb = bad, ps = s, pe = e;
        if (a != truth_of) {
            truth = PyObject_IsTrue(a);
            if (truth < 0)
                goto done;
            truth_of = a;
        }
        int need = truth || bad || (deep && site[i] >= 0 && site[i] < ndeep && deep[site[i]]);
        if (need && changed) {
            int fresh = 1;
            if (e == Py_None) {
                slot_t *sl = map_put(&w->xkeys, (int64_t)(intptr_t)a,
                                     (int64_t)(((uint64_t)t << 34) | ((uint64_t)(s + 1) << 1) | (uint64_t)bad),
                                     nfirst, &fresh);
                if (!sl)
                    goto nomem;
                head = sl->v;
            }
            if (fresh) {
                head = nfirst++;
                PyObject *o = PyLong_FromSsize_t(i);
                if (!o || PyList_Append(firsts, o) < 0) {
                    Py_XDECREF(o);
                    goto done;
                }
                Py_DECREF(o);
            }
        }
        w->xid[i] = need ? head : -1;
    }

    /* Tracks not seen yet: host threads ascending, then device tracks ascending (``Tracks.open``'s order). */
    for (int half = 0; half < 2; half++) {
        const int64_t *col = half ? trk : thr;
        Py_ssize_t from = PyList_GET_SIZE(tracks);
        for (Py_ssize_t i = 0; i < n; i++) {
            track_t *tk = &w->tracks[col[i]];
            if ((half && !col[i]) || tk->known || tk->mark)
                continue;
            tk->mark = 1;
            PyObject *o = PyLong_FromLongLong(col[i]);
            if (!o || PyList_Append(tracks, o) < 0) {
                Py_XDECREF(o);
                goto done;
            }
            Py_DECREF(o);
        }
        PyObject *part = PyList_GetSlice(tracks, from, PyList_GET_SIZE(tracks));
        if (!part || PyList_Sort(part) < 0 || PyList_SetSlice(tracks, from, PyList_GET_SIZE(tracks), part) < 0) {
            Py_XDECREF(part);
            goto done;
        }
        Py_DECREF(part);
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(tracks); j++)
        w->tracks[PyLong_AsLongLong(PyList_GET_ITEM(tracks, j))].mark = 0;

    /* Name templates: from the cache, else a miss for Python to make (host ones, then device ones). */
    w->nmiss = w->nhmiss = 0;
    if (map_reset(&w->seen, 16) < 0)
        goto nomem;
    for (int half = 0; half < 2; half++) {
        int64_t lk = EMPTY, ls = 0, lv = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (half && !trk[i]) {
                w->dpre[i] = -1;
                continue;
            }
            const int64_t key = prefix_key(half ? trk[i] : thr[i], cat[i], name[i]), s = half ? -1 : site[i];
            if (key != lk || s != ls) {
                slot_t *sl = map_find(&w->prefix, key, s);
                lv = sl ? sl->v : miss(w, key, s);
                if (lv == INT64_MIN)
                    goto nomem;
                lk = key, ls = s;
            }
            (half ? w->dpre : w->hpre)[i] = lv;
        }
        if (!half)
            w->nhmiss = w->nmiss;
    }
    qsort(w->miss, w->nhmiss, 3 * sizeof(int64_t), cmp_miss);
    qsort(w->miss + 3 * w->nhmiss, w->nmiss - w->nhmiss, 3 * sizeof(int64_t), cmp_miss);
    hm = PyList_New((Py_ssize_t)w->nhmiss);
    dm = PyList_New((Py_ssize_t)(w->nmiss - w->nhmiss));
    if (!hm || !dm)
        goto done;
    for (size_t j = 0; j < w->nmiss; j++) {
        PyObject *o = Py_BuildValue("(LL)", (long long)w->miss[3 * j], (long long)w->miss[3 * j + 1]);
        if (!o)
            goto done;
        if (j < w->nhmiss)
            PyList_SET_ITEM(hm, (Py_ssize_t)j, o);
        else
            PyList_SET_ITEM(dm, (Py_ssize_t)(j - w->nhmiss), o);
    }
    w->n = n;
    result = PyTuple_Pack(4, firsts, tracks, hm, dm);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(firsts);
    Py_XDECREF(tracks);
    Py_XDECREF(hm);
    Py_XDECREF(dm);
    PyBuffer_Release(&thr_b);
    PyBuffer_Release(&st_b);
    PyBuffer_Release(&site_b);
    PyBuffer_Release(&cat_b);
    PyBuffer_Release(&name_b);
    PyBuffer_Release(&trk_b);
    if (deep_b.obj)
        PyBuffer_Release(&deep_b);
    return result;
}

/* ---- write -------------------------------------------------------------------------------------------- */
typedef struct {
    const int64_t *id, *par, *thr, *hb, *he, *trk, *ds, *de, *raws, *rawe;
    const int64_t *md, *group, *hpre, *dpre, *xid;
    const uint8_t *flows;
    const uint8_t *const *xp;
    const int64_t *xl;
    const row_t *rows;
} cols_t;

static inline __attribute__((always_inline)) void
load(const cols_t *c, const ev_t *e, row_t *r)
{
    if (e->kind == EV_ROW) {
        *r = c->rows[e->idx];
        return;
    }
    const uint32_t i = e->idx;
    const int dev = e->kind >= EV_DB, end = e->kind == EV_HE || e->kind == EV_DE, f = c->flows[i];
    r->track = e->track;
    r->ts = e->ts;
    r->k1 = e->k1;
    r->k2 = e->k2;
    r->k3 = e->k3;
    r->g = e->g;
    r->x = NULL;
    r->xlen = 0;
    r->raw = r->rawend = 0;
    r->raws = r->rawe = 0;
    r->parent = 0;
    if (end) {
        r->pre = -1;
        r->flow = r->spanann = 0;
        r->sid = 0;
        return;
    }
    r->sid = c->id[i];
    r->spanann = !f;
    if (!dev) {
        r->pre = c->hpre[i];
        r->flow = f ? FLOW_OUT : 0;
        r->parent = c->par[i];
        int64_t x = c->xid[i];
        if (x >= 0) {
            r->x = c->xp[x];
            r->xlen = c->xl[x];
        }
    } else {
        r->pre = c->dpre[i];
        r->flow = f ? FLOW_IN : 0;
        r->raw = 1;
        r->raws = c->raws[i];
        r->rawe = c->rawe[i];
        r->rawend = (uint64_t)c->rawe[i] - (uint64_t)c->raws[i] != (uint64_t)c->de[i] - (uint64_t)c->ds[i];
    }
}

static inline int
ev_less(const ev_t *a, const ev_t *b)
{
    if (a->ts != b->ts)
        return a->ts < b->ts;
    if (a->k1 != b->k1)
        return a->k1 < b->k1;
    if (a->k2 != b->k2)
        return a->k2 < b->k2;
    if (a->k3 != b->k3)
        return a->k3 < b->k3;
    return a->pos < b->pos;
}

/* Moves a[i] back to its place among the sorted a[0..i); returns that place. */
static inline size_t
insert_back(ev_t *a, size_t i)
{
    ev_t v = a[i];
    size_t j = i;
    while (j && ev_less(&v, &a[j - 1])) {
        a[j] = a[j - 1];
        j--;
    }
    a[j] = v;
    return j;
}

/* Merge sort that costs one comparison per half already in order (a track's rows mostly are). */
static void
msort(ev_t *a, ev_t *tmp, size_t n)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            insert_back(a, i);
        return;
    }
    size_t h = n / 2;
    msort(a, tmp, h);
    msort(a + h, tmp, n - h);
    if (!ev_less(&a[h], &a[h - 1]))
        return;
    memcpy(tmp, a, h * sizeof(ev_t));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        a[k++] = ev_less(&a[j], &tmp[i]) ? a[j++] : tmp[i++];
    while (i < h)
        a[k++] = tmp[i++];
}

/* Nearly in order (a region's BEGIN comes after its children's): insertion within a budget of moves, else
 * the merge sort. */
static void
sort_nearly(ev_t *a, ev_t *tmp, size_t n)
{
    size_t budget = 8 * n + 64;
    for (size_t i = 1; i < n; i++) {
        if (!ev_less(&a[i], &a[i - 1]))
            continue;
        size_t j = insert_back(a, i);
        if ((budget -= i - j < budget ? i - j : budget) == 0) {
            msort(a, tmp, n);
            return;
        }
    }
}

/* Merges the sorted a[0..h) and a[h..n), copying the shorter part out. */
static void
merge(ev_t *a, ev_t *tmp, size_t h, size_t n)
{
    if (!h || h == n || !ev_less(&a[h], &a[h - 1]))
        return;
    if (h <= n - h) {
        memcpy(tmp, a, h * sizeof(ev_t));
        size_t i = 0, j = h, k = 0;
        while (i < h && j < n)
            a[k++] = ev_less(&a[j], &tmp[i]) ? a[j++] : tmp[i++];
        while (i < h)
            a[k++] = tmp[i++];
    } else {
        size_t m = n - h;
        memcpy(tmp, a + h, m * sizeof(ev_t));
        size_t i = h, j = m, k = n; /* from the back: i, j count what is left of each */
        while (i && j)
            a[--k] = ev_less(&tmp[j - 1], &a[i - 1]) ? a[--i] : tmp[--j];
        while (j)
            a[--k] = tmp[--j];
    }
}

/* One track's events in order: they come as a few segments of one kind each (BEGINs in record order, ENDs,
 * carried rows), each nearly in order; sorted one by one, then merged. */
static void
sort_track(ev_t *a, ev_t *tmp, size_t n)
{
    size_t lo = 0;
    while (lo < n) {
        size_t hi = lo + 1;
        while (hi < n && a[hi].kind == a[lo].kind)
            hi++;
        sort_nearly(a + lo, tmp, hi - lo);
        merge(a, tmp, lo, hi);
        lo = hi;
    }
}

/* A template: one 16-byte move where it fits (the pool is padded, the output has slack). */
static inline uint8_t *
copy16(uint8_t *p, const uint8_t *src, int64_t n)
{
    if (n <= 16) {
        memcpy(p, src, 16);
        return p + n;
    }
    memcpy(p, src, (size_t)n);
    return p + n;
}

#define PUT(p, x) ((p) = copy16((p), (x).at, (x).len))

typedef struct {
    piece packet, tstag, abs_clock, type[3], flows[2];
    const strings *pool;
    int64_t mono;
} consts_t;

/* One row's packet (``layout.encode_rows`` and ``_packets.c`` say the rules), on its track's sequence. */
static inline uint8_t *
encode_row(uint8_t *p, const row_t *r, track_t *tk, const consts_t *k, const piece tail)
{
    const strings *pool = k->pool;
    const int64_t ts = r->ts;
    const int absolute = ts < tk->last;
    const uint64_t tsv = absolute ? (uint64_t)ts + (uint64_t)k->mono : (uint64_t)ts - (uint64_t)tk->last;
    if (!absolute)
        tk->last = ts;
    int64_t te = k->type[r->k2].len;
    piece name = {NULL, 0}, a_sid = {NULL, 0}, a_par = {NULL, 0}, a_rs = {NULL, 0}, a_re = {NULL, 0};
    const uint64_t sid = (uint64_t)r->sid, par = (uint64_t)r->parent, raws = (uint64_t)r->raws,
                   rawe = (uint64_t)r->rawe;
    int vs = 0;
    if (r->pre >= 0) {
        name = get(pool, r->pre);
        te += name.len;
    }
    if (r->flow || r->spanann) {
        vs = vlen(sid);
        if (r->flow)
            te += k->flows[r->flow - 1].len + vs;
        if (r->spanann) {
            a_sid = get(pool, tk->hdr[0] + vs - 1);
            te += a_sid.len + vs;
        }
    }
    if (par) {
        int v = vlen(par);
        a_par = get(pool, tk->hdr[1] + v - 1);
        te += a_par.len + v;
    }
    if (r->raw) {
        int64_t off = (int64_t)(raws - (uint64_t)ts);
        if (!tk->has_offset || off != tk->offset) {
            int v = vlen(raws);
            a_rs = get(pool, tk->hdr[2] + v - 1);
            te += a_rs.len + v;
            tk->offset = off;
            tk->has_offset = 1;
        }
    }
    if (r->rawend) {
        int v = vlen(rawe);
        a_re = get(pool, tk->hdr[3] + v - 1);
        te += a_re.len + v;
    }
    te += r->xlen;
    const int64_t body =
        k->tstag.len + vlen(tsv) + (absolute ? k->abs_clock.len : 0) + tail.len + vlen((uint64_t)te) + te;
    PUT(p, k->packet);
    p = put_varint(p, (uint64_t)body);
    PUT(p, k->tstag);
    p = put_varint(p, tsv);
    if (absolute)
        PUT(p, k->abs_clock);
    PUT(p, tail);
    p = put_varint(p, (uint64_t)te);
    PUT(p, k->type[r->k2]);
    if (name.at)
        PUT(p, name);
    const piece none = {NULL, 0};
    p = put_slice_fields(p, r->flow ? k->flows[r->flow - 1] : none, a_sid, sid, a_par, par, a_rs, raws, a_re, rawe);
    if (r->xlen)
        p = copy(p, r->x, r->xlen);
    return p;
}

/* A row kept past this write: its extra bytes copied (the batch's go away). */
static int
keep(row_t **arr, size_t *n, size_t *cap, const row_t *r, int64_t g)
{
    if (reserve((void **)arr, cap, *n + 1, sizeof(row_t)) < 0)
        return -1;
    row_t *k = &(*arr)[(*n)++];
    *k = *r;
    k->g = g;
    if (r->xlen) {
        uint8_t *x = malloc((size_t)r->xlen);
        if (!x) {
            (*n)--;
            return -1;
        }
        memcpy(x, r->x, (size_t)r->xlen);
        k->x = x;
    } else {
        k->x = NULL;
    }
    return 0;
}

/* A carried row; extra bytes it ``owns`` are freed once this write's packets are encoded. */
static int
carry(Writer *w, const row_t *r, int64_t g, int owns)
{
    if (RESERVE(w->rows, w->cap_rows, w->nrows + 1) < 0 || RESERVE(w->frees, w->cap_frees, w->nfrees + 1) < 0)
        return -1;
    w->rows[w->nrows] = *r;
    w->rows[w->nrows++].g = g;
    if (owns && r->x)
        w->frees[w->nfrees++] = (uint8_t *)r->x;
    return 0;
}

/* Room for ``more`` events: taken before ``add_event``, which does not check. */
static int
ev_room(Writer *w, size_t ne, size_t more)
{
    return RESERVE(w->ev, w->cap_ev, ne + more + 1);
}

static inline void
add_event(Writer *w, size_t *ne, const cols_t *c, int kind, uint32_t idx)
{
    const int64_t track = kind == EV_ROW ? c->rows[idx].track : kind >= EV_DB ? c->trk[idx] : c->thr[idx];
    ev_t *e = w->bucketed ? &w->ev[w->bend[track]++] : &w->ev[*ne];
    e->pos = (uint32_t)*ne;
    e->kind = (uint8_t)kind;
    e->idx = idx;
    e->held = 0;
    if (kind == EV_ROW) {
        const row_t *r = &c->rows[idx];
        e->ts = r->ts, e->k1 = r->k1, e->k2 = (uint8_t)r->k2, e->k3 = r->k3, e->g = r->g;
        e->track = (int32_t)r->track;
    } else {
        const int dev = kind >= EV_DB, end = kind == EV_HE || kind == EV_DE;
        e->track = (int32_t)(dev ? c->trk[idx] : c->thr[idx]);
        e->ts = dev ? (end ? c->de[idx] : c->ds[idx]) : (end ? c->he[idx] : c->hb[idx]);
        e->k1 = end ? c->md[idx] : c->id[idx];
        e->k2 = (uint8_t)end;
        e->k3 = end ? -c->id[idx] : 0;
        e->g = c->group[idx];
    }
    (*ne)++;
}

static int
cmp_held(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    if (x->track != y->track)
        return x->track < y->track ? -1 : 1;
    if (x->g != y->g)
        return x->g < y->g ? -1 : 1;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

static int
cmp_pair(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The events ev[0..*rows) not held, each track's in time order (ties in nesting order), encoded; *rows
 * becomes the number written. -1: no memory; -2: a track not known. */
static int
emit(Writer *w, size_t *rows, const cols_t *c, const consts_t *k, size_t *size, int hold_tail)
{
    const size_t ne = *rows;
    if (RESERVE(w->ev2, w->cap_ev2, ne + 1) < 0 || RESERVE(w->bend, w->cap_bend, w->ntracks + 1) < 0)
        return -1;
    if (!w->bucketed) { /* counting sort by track into ev2, which becomes ev */
        int64_t *count = w->bend;
        w->nruns = 0;
        for (size_t i = 0; i < ne; i++) {
            int32_t t = w->ev[i].track;
            if (t < 0 || (size_t)t >= w->ntracks || !w->tracks[t].known)
                return -2;
            if (!w->tracks[t].mark) {
                w->tracks[t].mark = 1;
                count[t] = 0;
                if (RESERVE(w->runs, w->cap_runs, w->nruns + 1) < 0)
                    return -1;
                w->runs[w->nruns++] = t;
            }
            count[t]++;
        }
        qsort(w->runs, w->nruns, sizeof(int64_t), cmp_i64);
        int64_t at = 0;
        for (size_t r = 0; r < w->nruns; r++) {
            int64_t t = w->runs[r], m = count[t];
            count[t] = at;
            at += m;
            w->tracks[t].mark = 0;
        }
        for (size_t i = 0; i < ne; i++)
            w->ev2[count[w->ev[i].track]++] = w->ev[i];
        ev_t *swap = w->ev;
        size_t cap = w->cap_ev;
        w->ev = w->ev2;
        w->cap_ev = w->cap_ev2;
        w->ev2 = swap;
        w->cap_ev2 = cap;
        w->bucketed = 1;
    }
    const strings *pool = k->pool;
    size_t longest = 0;
    for (Py_ssize_t i = 0; i < pool->n; i++)
        if ((size_t)pool->len[i] > longest)
            longest = (size_t)pool->len[i];
    size_t bound = ne * (11 * longest + 8 * 10) + w->xbytes; /* 11 pieces and 8 varints a row at most */
    for (size_t j = 0; j < w->nrows; j++)
        bound += (size_t)w->rows[j].xlen;
    if (RESERVE(w->out, w->cap_out, bound + 16) < 0 || RESERVE(w->written, w->cap_written, w->nruns + 1) < 0)
        return -1;
    uint8_t *p = w->out;
    w->nopened = w->nwritten = 0;
    size_t lo = 0, kept = 0;
    for (size_t r = 0; r < w->nruns; r++) {
        const int64_t t = w->runs[r];
        track_t *tk = &w->tracks[t];
        const size_t hi = (size_t)w->bend[t];
        if (tk->tail < 0 || tk->tail >= pool->n)
            return -2;
        for (int a = 0; a < 4; a++)
            if (tk->hdr[a] < 0 || tk->hdr[a] + 9 >= pool->n)
                return -2;
        sort_track(w->ev + lo, w->ev2, hi - lo);
        if (hold_tail) { /* the rows at the track's latest time wait for the next write (a device command
                          * may come late): the last of its sorted run not held for a parent */
            size_t q = hi;
            while (q > lo && w->ev[q - 1].held)
                q--;
            const int64_t latest = q > lo ? w->ev[q - 1].ts : 0;
            for (size_t i = q; i-- > lo;) {
                ev_t *e = &w->ev[i];
                if (e->held)
                    continue;
                if (e->ts != latest)
                    break;
                row_t r;
                load(c, e, &r);
                if (keep(&w->tail, &w->ntail, &w->cap_tail, &r, 0) < 0)
                    return -1;
                e->held = 2;
            }
        }
        const piece tail = get(pool, tk->tail);
        const size_t from = kept;
        for (size_t i = lo; i < hi; i++) {
            const ev_t *e = &w->ev[i];
            if (e->held)
                continue;
            if (kept++ == from) {
                w->written[w->nwritten++] = t;
                if (!tk->has_last) {
                    tk->has_last = 1;
                    tk->last = e->ts;
                    if (RESERVE(w->opened, w->cap_opened, 2 * (w->nopened + 1)) < 0)
                        return -1;
                    w->opened[2 * w->nopened] = t;
                    w->opened[2 * w->nopened++ + 1] = e->ts;
                }
            }
            row_t row;
            load(c, e, &row);
            p = encode_row(p, &row, tk, k, tail);
        }
        lo = hi;
    }
    *size = (size_t)(p - w->out);
    *rows = kept;
    return 0;
}

static void
release_carried(Writer *w)
{
    for (size_t i = 0; i < w->nfrees; i++)
        free(w->frees[i]);
    w->nfrees = 0;
    w->nrows = 0;
}

/* The batch part of a write, the GIL released: 0, -1 (no memory), -2 (an id out of range), -3 (a cycle). */
static int
plan(Writer *w, Py_ssize_t n, cols_t *c, const uint8_t *leaf, Py_ssize_t nleaf, const uint8_t *region,
     const int16_t *cat, const int64_t *counters, Py_ssize_t ncounters, size_t *ne_out)
{
    int64_t *md = w->md, *group = w->group, *up = w->up;
    uint8_t *st = w->state;
    const int64_t *id = c->id, *par = c->par;
    /* groups: the in-batch parent, the topmost in-batch ancestor, the parent still to come it waits for */
    if (map_reset(&w->ids, (size_t)n) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!map_put(&w->ids, id[i], 0, i, NULL))
            return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        slot_t *s = par[i] ? map_find(&w->ids, par[i], 0) : NULL;
        up[i] = s ? s->v : -1;
        md[i] = id[i];
        st[i] = 0;
        group[i] = 0;
    }
    /* tops by walking up, memoized: state 1 = on the current path, 2 = done (group[i] holds its group) */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i;
        while (st[j] == 0 && up[j] >= 0 && up[j] != j) {
            st[j] = 1;
            j = up[j];
        }
        int64_t g;
        if (st[j] == 1) { /* a cycle through j: the numpy path's pointer doubling settles on one of its
                           * spans (in the batch: group 0) where its length is a power of 2, else refuses */
            size_t len = 1;
            for (Py_ssize_t q = up[j]; q != j; q = up[q])
                len++;
            if (len & (len - 1))
                return -3;
            g = 0;
        } else if (st[j] == 2) {
            g = group[j];
        } else if (up[j] == j) {
            g = 0;
        } else {
            int64_t p = par[j];
            g = p && !map_find(&w->arrived, p, 0) ? p : 0;
        }
        for (Py_ssize_t q = i; st[q] == 1; q = up[q]) {
            st[q] = 2;
            group[q] = g;
        }
        if (st[j] == 0) {
            st[j] = 2;
            group[j] = g;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const int lf = cat[i] < nleaf && leaf[cat[i]];
        w->flows[i] = c->trk[i] != 0 && !(cat[i] < nleaf && region[cat[i]]);
        if (!lf && w->pend.n) {
            slot_t *s = map_find(&w->pend, id[i], 0);
            if (s) {
                if (s->v > md[i])
                    md[i] = s->v;
                map_del(&w->pend, s);
            }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* last descendant ids, carried up while they grow */
        Py_ssize_t q = i;
        while (up[q] >= 0 && up[q] != q && md[up[q]] < md[q]) {
            md[up[q]] = md[q];
            q = up[q];
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (up[i] < 0 && group[i]) {
            int fresh;
            slot_t *s = map_put(&w->pend, par[i], 0, md[i], &fresh);
            if (!s)
                return -1;
            if (!fresh && s->v < md[i])
                s->v = md[i];
        }
    }
    /* carried rows: counters, last write's tail, held rows whose parent arrived or whose group is here */
    w->nrows = 0;
    for (Py_ssize_t j = 0; j < ncounters; j++) {
        const int64_t *q = counters + 5 * j;
        int64_t i = q[0];
        row_t r = {0};
        r.track = q[1], r.ts = q[2], r.k1 = md[i], r.k2 = 2, r.k3 = -id[i], r.pre = q[3];
        r.x = c->xp[q[4]];
        r.xlen = c->xl[q[4]];
        if (carry(w, &r, group[i], 0) < 0)
            return -1;
    }
    for (size_t j = 0; j < w->ntail; j++)
        if (carry(w, &w->tail[j], 0, 1) < 0)
            return -1;
    w->ntail = 0;
    if (w->nheld) {
        if (map_reset(&w->arr, 64) < 0 || map_reset(&w->bgroups, 64) < 0) /* they grow to what they hold */
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!(cat[i] < nleaf && leaf[cat[i]]) && !map_put(&w->arr, id[i], 0, group[i], NULL))
                return -1;
            if (group[i] && !map_put(&w->bgroups, group[i], 0, 0, NULL))
                return -1;
        }
        size_t kept = 0;
        for (size_t j = 0; j < w->nheld; j++) {
            row_t *h = &w->held[j];
            slot_t *a = map_find(&w->arr, h->g, 0);
            if (a || map_find(&w->bgroups, h->g, 0)) {
                slot_t *gs = map_find(&w->groups, h->g, 0);
                if (gs)
                    map_del(&w->groups, gs);
                if (carry(w, h, a ? a->v : h->g, 1) < 0)
                    return -1;
            } else {
                w->held[kept++] = *h;
            }
        }
        w->nheld = kept;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* the parents that arrived: a window of the latest */
        if (cat[i] < nleaf && leaf[cat[i]])
            continue;
        if (w->ring_n == ARRIVED_WINDOW) {
            slot_t *s = map_find(&w->arrived, w->ring[w->ring_at], 0);
            if (s && s->v == (int64_t)w->ring_at)
                map_del(&w->arrived, s);
        } else {
            w->ring_n++;
        }
        slot_t *s = map_put(&w->arrived, id[i], 0, (int64_t)w->ring_at, NULL);
        if (!s)
            return -1;
        s->v = (int64_t)w->ring_at;
        w->ring[w->ring_at] = id[i];
        w->ring_at = (w->ring_at + 1) % ARRIVED_WINDOW;
    }
    /* events: host BEGINs, ENDs, device BEGINs, ENDs, then the carried rows (the numpy path's row order) */
    size_t ne = 0;
    if (ev_room(w, 0, 4 * (size_t)n + w->nrows) < 0 || RESERVE(w->bend, w->cap_bend, w->ntracks + 1) < 0 ||
        RESERVE(w->runs, w->cap_runs, 2 * (size_t)n + w->nrows + 1) < 0)
        return -1;
    /* each track's events go together, in the order of ``runs``: counted, then placed as they are made */
    int64_t *bend = w->bend;
    w->nruns = 0;
    for (Py_ssize_t i = 0; i < n + (Py_ssize_t)w->nrows; i++) {
        const int64_t ts[2] = {i < n ? c->thr[i] : w->rows[i - n].track, i < n ? c->trk[i] : 0};
        for (int h = 0; h < 2; h++) {
            const int64_t t = ts[h];
            if (h && !t)
                continue;
            track_t *tk = &w->tracks[t];
            if (!tk->known)
                return -2;
            if (!tk->mark) {
                tk->mark = 1;
                bend[t] = 0;
                w->runs[w->nruns++] = t;
            }
            bend[t] += i < n ? 2 : 1;
        }
    }
    qsort(w->runs, w->nruns, sizeof(int64_t), cmp_i64);
    for (size_t r = 0, at = 0; r < w->nruns; r++) {
        const int64_t t = w->runs[r], m = bend[t];
        bend[t] = (int64_t)at;
        at += (size_t)m;
        w->tracks[t].mark = 0;
    }
    w->bucketed = 1;
    for (int kind = EV_HB; kind <= EV_DE; kind++)
        for (Py_ssize_t i = 0; i < n; i++)
            if (kind < EV_DB || c->trk[i])
                add_event(w, &ne, c, kind, (uint32_t)i);
    c->rows = w->rows;
    for (size_t j = 0; j < w->nrows; j++)
        add_event(w, &ne, c, EV_ROW, (uint32_t)j);
    /* hold-back: rows waiting for a parent, at the earliest time of their (track, group) */
    size_t nwait = 0;
    if (map_reset(&w->mins, 16) < 0)
        return -1;
    for (size_t i = 0; i < ne; i++) {
        ev_t *e = &w->ev[i];
        if (!e->g)
            continue;
        int fresh;
        slot_t *s = map_put(&w->mins, e->track, e->g, e->ts, &fresh);
        if (!s)
            return -1;
        if (!fresh && e->ts < s->v)
            s->v = e->ts;
        nwait++;
    }
    if (nwait) {
        size_t first_new = w->nheld;
        for (size_t i = 0; i < ne; i++) {
            ev_t *e = &w->ev[i];
            if (e->g && map_find(&w->mins, e->track, e->g)->v == e->ts) {
                row_t r;
                e->held = 1;
                load(c, e, &r);
                if (keep(&w->held, &w->nheld, &w->cap_held, &r, e->g) < 0)
                    return -1;
            }
        }
        /* groups enter the held set in (track, group) order, as the numpy path inserts them */
        qsort(w->held + first_new, w->nheld - first_new, sizeof(row_t), cmp_held);
        for (size_t j = first_new; j < w->nheld; j++) {
            int fresh;
            if (!map_put(&w->groups, w->held[j].g, 0, w->stamp, &fresh))
                return -1;
            if (fresh)
                w->stamp++;
        }
        if (w->groups.n > MAX_HELD_GROUPS) { /* parents that never come: their oldest groups go out now */
            size_t ng = w->groups.n, cut = ng - MAX_HELD_GROUPS, q = 0;
            int64_t *pairs = malloc(2 * ng * sizeof(int64_t));
            if (!pairs)
                return -1;
            for (size_t s = 0; s < w->groups.cap; s++)
                if (w->groups.s[s].k1 != EMPTY) {
                    pairs[2 * q] = w->groups.s[s].v;
                    pairs[2 * q++ + 1] = w->groups.s[s].k1;
                }
            qsort(pairs, ng, 2 * sizeof(int64_t), cmp_pair);
            if (map_reset(&w->bgroups, cut) < 0) {
                free(pairs);
                return -1;
            }
            for (size_t j = 0; j < cut; j++) {
                int64_t g = pairs[2 * j + 1];
                slot_t *s = map_find(&w->groups, g, 0);
                if (s)
                    map_del(&w->groups, s);
                s = map_find(&w->pend, g, 0);
                if (s)
                    map_del(&w->pend, s);
                if (!map_put(&w->bgroups, g, 0, 0, NULL)) {
                    free(pairs);
                    return -1;
                }
            }
            free(pairs);
            size_t kept = 0, base = w->nrows;
            for (size_t j = 0; j < w->nheld; j++) {
                row_t *h = &w->held[j];
                if (map_find(&w->bgroups, h->g, 0)) {
                    if (carry(w, h, h->g, 1) < 0)
                        return -1;
                } else {
                    w->held[kept++] = *h;
                }
            }
            w->nheld = kept;
            c->rows = w->rows;
            if (ev_room(w, ne, w->nrows - base) < 0)
                return -1;
            w->bucketed = 0; /* appended: emit sorts them into their tracks */
            for (size_t j = base; j < w->nrows; j++)
                add_event(w, &ne, c, EV_ROW, (uint32_t)j);
        }
    }
    *ne_out = ne;
    return 0;
}

static PyObject *
result_of(Writer *w, size_t size, size_t rows)
{
    PyObject *data = PyBytes_FromStringAndSize((const char *)w->out, (Py_ssize_t)size);
    PyObject *runs = PyList_New((Py_ssize_t)w->nwritten), *opened = PyDict_New();
    PyObject *res = NULL;
    if (!data || !runs || !opened)
        goto done;
    for (size_t r = 0; r < w->nwritten; r++) {
        PyObject *o = PyLong_FromLongLong(w->written[r]);
        if (!o)
            goto done;
        PyList_SET_ITEM(runs, (Py_ssize_t)r, o);
    }
    for (size_t j = 0; j < w->nopened; j++) {
        PyObject *t = PyLong_FromLongLong(w->opened[2 * j]), *ts = PyLong_FromLongLong(w->opened[2 * j + 1]);
        int bad = !t || !ts || PyDict_SetItem(opened, t, ts) < 0;
        Py_XDECREF(t);
        Py_XDECREF(ts);
        if (bad)
            goto done;
    }
    res = Py_BuildValue("(OOOn)", data, runs, opened, (Py_ssize_t)rows);
done:
    Py_XDECREF(data);
    Py_XDECREF(runs);
    Py_XDECREF(opened);
    return res;
}

static int
check_strings(const char *fn, const Py_buffer *buf, const Py_buffer *off, const Py_buffer *len, strings *s)
{
    if (off->len != len->len || off->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s: pool offsets and lengths must be int64[K] of one size", fn);
        return 0;
    }
    s->buf = buf->buf;
    s->off = off->buf;
    s->len = len->buf;
    s->n = off->len / 8;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->off[i] < 0 || s->len[i] < 0 || s->off[i] + s->len[i] > buf->len) {
            PyErr_Format(PyExc_ValueError, "%s: pool string %zd lies outside its buffer", fn, i);
            return 0;
        }
    }
    return 1;
}

/* Points the pool at a copy of its bytes with 16 bytes of room after them (``copy16``). */
static int
pad_pool(Writer *w, strings *pool, Py_ssize_t len)
{
    if (RESERVE(w->padded, w->cap_padded, (size_t)len + 16) < 0) {
        PyErr_NoMemory();
        return 0;
    }
    memcpy(w->padded, pool->buf, (size_t)len);
    memset(w->padded + len, 0, 16);
    pool->buf = w->padded;
    return 1;
}

static int
make_consts(const char *fn, const Py_buffer *kb, const strings *pool, long long mono, consts_t *k)
{
    if (kb->len != NCONSTS * 8) {
        PyErr_Format(PyExc_ValueError, "%s: consts must be int64[%d]", fn, NCONSTS);
        return 0;
    }
    const int64_t *ids = kb->buf;
    for (int j = 0; j < NCONSTS; j++) {
        if (ids[j] < 0 || ids[j] >= pool->n) {
            PyErr_Format(PyExc_ValueError, "%s: a row constant's pool id is out of range", fn);
            return 0;
        }
    }
    k->packet = get(pool, ids[K_PACKET]);
    k->tstag = get(pool, ids[K_TS]);
    k->abs_clock = get(pool, ids[K_ABS]);
    for (int j = 0; j < 3; j++)
        k->type[j] = get(pool, ids[K_TYPE + j]);
    k->flows[0] = get(pool, ids[K_FLOW]);
    k->flows[1] = get(pool, ids[K_FLOW + 1]);
    k->pool = pool;
    k->mono = (int64_t)mono;
    return 1;
}

/* The string pool (bytes, offsets, lengths) and the row constants, four buffers in a row from ``b``. */
static int
load_pool(Writer *w, const char *fn, const Py_buffer *b, long long mono, strings *pool, consts_t *k)
{
    return check_strings(fn, &b[0], &b[1], &b[2], pool) && pad_pool(w, pool, b[0].len) &&
           make_consts(fn, &b[3], pool, mono, k);
}

static const char *const FAIL[] = {"", "", "a track, template or extra id is out of range", "spans whose parents form a cycle"};

static PyObject *
w_write(Writer *w, PyObject *args, PyObject *kw)
{
    const char *fn = "write";
    enum { NB = 20 };
    Py_buffer b[NB];
    memset(b, 0, sizeof b);
    PyObject *extras = NULL, *result = NULL;
    long long mono = LLONG_MIN;
    /* keyword-only (_ext.pyi): the span columns, the track tables, the interned strings and the clock */
    static char *names[] = {"id", "parent", "cat", "thread", "host_begin", "host_end", "track", "dev_start", "dev_end",
                            "raw_start", "raw_end", "leaf", "region", "hpids", "dpids", "extras", "counters", "pool",
                            "pool_off", "pool_len", "consts", "mono", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*O!y*y*y*y*y*L:write", names, &b[0],
                                     &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11],
                                     &b[12], &b[13], &b[14], &PyList_Type, &extras, &b[15], &b[16], &b[17], &b[18],
                                     &b[19], &mono))
        return NULL;
    for (int j = 0; j <= NB + 1; j++) { /* every argument is required */
        int given = j < 15 ? b[j].obj != NULL : j == 15 ? extras != NULL : j <= NB ? b[j - 1].obj != NULL : mono != LLONG_MIN;
        if (!given) {
            PyErr_Format(PyExc_TypeError, "write() missing keyword argument '%s'", names[j]);
            goto done;
        }
    }
    const Py_ssize_t n = w->n;
    w->n = -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "write: call prepare first, for the same batch");
        goto done;
    }
    static const int i64cols[] = {0, 1, 3, 4, 5, 6, 7, 8, 9, 10};
    for (size_t j = 0; j < sizeof i64cols / sizeof *i64cols; j++)
        NEED(b[i64cols[j]], n, 8, "a span column");
    NEED(b[2], n, 2, "cat");
    NEED(b[13], w->nhmiss, 8, "hpids");
    NEED(b[14], w->nmiss - w->nhmiss, 8, "dpids");
    if (b[11].len != b[12].len || b[15].len % 40) {
        PyErr_SetString(PyExc_ValueError, "write: leaf and region tables differ in size, or counters are not int64[K, 5]");
        goto done;
    }
    strings pool;
    consts_t k;
    if (!load_pool(w, fn, &b[16], mono, &pool, &k))
        goto done;
    const Py_ssize_t nx = PyList_GET_SIZE(extras);
    size_t had = w->cap_x;
    if (RESERVE(w->xp, w->cap_x, (size_t)nx + 1) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (w->cap_x != had || !w->xl) {
        int64_t *xl = realloc(w->xl, w->cap_x * 8);
        if (!xl) {
            PyErr_NoMemory();
            goto done;
        }
        w->xl = xl;
    }
    for (Py_ssize_t j = 0; j < nx; j++) {
        PyObject *o = PyList_GET_ITEM(extras, j);
        if (!PyBytes_Check(o)) {
            PyErr_SetString(PyExc_TypeError, "write: extras must be bytes");
            goto done;
        }
        w->xp[j] = (const uint8_t *)PyBytes_AS_STRING(o);
        w->xl[j] = PyBytes_GET_SIZE(o);
    }
    const int64_t *xid = w->xid;
    for (Py_ssize_t i = 0; i < n; i++)
        if (xid[i] >= nx) {
            PyErr_SetString(PyExc_ValueError, "write: extras has fewer entries than prepare numbered");
            goto done;
        }
    const int64_t *counters = b[15].buf;
    const Py_ssize_t ncounters = b[15].len / 40;
    for (Py_ssize_t j = 0; j < ncounters; j++) {
        const int64_t *q = counters + 5 * j;
        if (q[0] < 0 || q[0] >= n || q[1] < 0 || q[1] >= MAX_TRACK || q[3] < 0 || q[3] >= pool.n || q[4] < 0 ||
            q[4] >= nx) {
            PyErr_SetString(PyExc_ValueError, "write: a counter row is out of range");
            goto done;
        }
    }
    /* the misses Python made: into the cache, and each row's template id */
    const int64_t *pids[2] = {b[13].buf, b[14].buf};
    if (RESERVE(w->missmap, w->cap_missmap, w->nmiss + 1) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t j = 0; j < w->nmiss; j++) {
        int64_t pid = j < w->nhmiss ? pids[0][j] : pids[1][j - w->nhmiss];
        if (pid < 0 || pid >= pool.n) {
            PyErr_SetString(PyExc_ValueError, "write: a template's pool id is out of range");
            goto done;
        }
        w->missmap[w->miss[3 * j + 2]] = pid;
        if (!map_put(&w->prefix, w->miss[3 * j], w->miss[3 * j + 1], pid, NULL)) {
            PyErr_NoMemory();
            goto done;
        }
    }
    w->xbytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* the cache's ids were checked when they went in */
        if (xid[i] >= 0)
            w->xbytes += (size_t)w->xl[xid[i]];
        if (w->hpre[i] < -1)
            w->hpre[i] = w->missmap[-2 - w->hpre[i]];
        if (w->dpre[i] < -1)
            w->dpre[i] = w->missmap[-2 - w->dpre[i]];
        if (w->hpre[i] >= pool.n || w->dpre[i] >= pool.n) {
            PyErr_SetString(PyExc_ValueError, "write: a template's pool id is out of range");
            goto done;
        }
    }
    cols_t c = {b[0].buf, b[1].buf, b[3].buf, b[4].buf, b[5].buf, b[6].buf, b[7].buf, b[8].buf, b[9].buf,
                b[10].buf, w->md, w->group, w->hpre, w->dpre, w->xid, w->flows, w->xp, w->xl, NULL};
    for (Py_ssize_t i = 0; i < n; i++) {
        if (c.trk[i] < 0 || c.trk[i] >= (int64_t)w->ntracks || c.thr[i] < 0 || c.thr[i] >= (int64_t)w->ntracks) {
            PyErr_SetString(PyExc_ValueError, "write: the batch's tracks are not those prepared");
            goto done;
        }
    }
    int rc;
    size_t ne = 0, size = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = plan(w, n, &c, b[11].buf, b[11].len, b[12].buf, b[2].buf, counters, ncounters, &ne);
    if (rc == 0)
        rc = emit(w, &ne, &c, &k, &size, 1);
    Py_END_ALLOW_THREADS
    release_carried(w);
    if (rc == -1)
        PyErr_NoMemory();
    else if (rc < 0)
        PyErr_Format(PyExc_ValueError, "write: %s", FAIL[-rc]);
    else
        result = result_of(w, size, ne);
done:
    for (int j = 0; j < NB; j++)
        if (b[j].obj)
            PyBuffer_Release(&b[j]);
    return result;
}

static PyObject *
w_drain(Writer *w, PyObject *args)
{
    const char *fn = "drain";
    Py_buffer b[4];
    memset(b, 0, sizeof b);
    long long mono;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*L:drain", &b[0], &b[1], &b[2], &b[3], &mono))
        return NULL;
    strings pool;
    consts_t k;
    if (!load_pool(w, fn, b, mono, &pool, &k))
        goto done;
    int rc = 0;
    size_t ne = 0, size = 0;
    cols_t c;
    memset(&c, 0, sizeof c);
    w->nrows = 0;
    for (size_t j = 0; j < w->nheld && rc == 0; j++)
        rc = carry(w, &w->held[j], w->held[j].g, 1);
    for (size_t j = 0; j < w->ntail && rc == 0; j++)
        rc = carry(w, &w->tail[j], 0, 1);
    w->nheld = w->ntail = 0;
    c.rows = w->rows;
    w->bucketed = 0;
    w->xbytes = 0;
    if (rc == 0)
        rc = ev_room(w, 0, w->nrows);
    for (size_t j = 0; j < w->nrows && rc == 0; j++)
        add_event(w, &ne, &c, EV_ROW, (uint32_t)j);
    if (rc == 0)
        rc = emit(w, &ne, &c, &k, &size, 0);
    release_carried(w);
    map_reset(&w->groups, 16);
    map_reset(&w->pend, 16);
    if (rc == -1)
        PyErr_NoMemory();
    else if (rc < 0)
        PyErr_Format(PyExc_ValueError, "drain: %s", FAIL[-rc]);
    else
        result = result_of(w, size, ne);
done:
    for (int j = 0; j < 4; j++)
        if (b[j].obj)
            PyBuffer_Release(&b[j]);
    return result;
}

static PyObject *
w_track(Writer *w, PyObject *args)
{
    long long t, tail, h[4];
    if (!PyArg_ParseTuple(args, "LLLLLL:track", &t, &tail, &h[0], &h[1], &h[2], &h[3]))
        return NULL;
    if (t < 0 || t >= MAX_TRACK) {
        PyErr_SetString(PyExc_ValueError, "track: id out of range");
        return NULL;
    }
    if (track_room(w, t) < 0)
        return PyErr_NoMemory();
    track_t *tk = &w->tracks[t];
    memset(tk, 0, sizeof *tk);
    tk->known = 1;
    tk->tail = tail;
    for (int a = 0; a < 4; a++)
        tk->hdr[a] = h[a];
    Py_RETURN_NONE;
}

static void
w_dealloc(Writer *w)
{
    for (size_t j = 0; j < w->nheld; j++)
        free((void *)w->held[j].x);
    for (size_t j = 0; j < w->ntail; j++)
        free((void *)w->tail[j].x);
    map_t *maps[] = {&w->arrived, &w->pend, &w->groups, &w->prefix, &w->ids, &w->arr, &w->bgroups, &w->mins,
                     &w->xkeys, &w->seen};
    for (size_t j = 0; j < sizeof maps / sizeof *maps; j++) {
        free(maps[j]->s);
        free(maps[j]->used);
    }
    void *arrs[] = {w->tracks, w->ring, w->held, w->tail, w->xid, w->hpre, w->dpre, w->md, w->group, w->up,
                    w->padded, w->flows, w->state, w->miss, w->missmap, w->ev, w->ev2, w->rows, w->frees,
                    (void *)w->xp, w->xl, w->out, w->runs, w->opened};
    for (size_t j = 0; j < sizeof arrs / sizeof *arrs; j++)
        free(arrs[j]);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *
w_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Writer() takes no arguments");
        return NULL;
    }
    Writer *w = (Writer *)type->tp_alloc(type, 0);
    if (!w)
        return NULL;
    w->n = -1;
    map_t *per_call[] = {&w->ids, &w->arr, &w->bgroups, &w->mins, &w->xkeys, &w->seen};
    for (size_t j = 0; j < sizeof per_call / sizeof *per_call; j++)
        per_call[j]->per_call = 1;
    w->ring = malloc(ARRIVED_WINDOW * sizeof(int64_t));
    if (!w->ring || map_reset(&w->arrived, 1024) < 0 || map_reset(&w->pend, 16) < 0 ||
        map_reset(&w->groups, 16) < 0 || map_reset(&w->prefix, 64) < 0) {
        Py_DECREF(w);
        return PyErr_NoMemory();
    }
    return (PyObject *)w;
}

static PyMethodDef w_methods[] = {
    {"prepare", (PyCFunction)w_prepare, METH_VARARGS,
     "prepare(attrs, thread, status, site, cat, name, track, deep, errors) -> (firsts, new_tracks, hmiss, dmiss)"},
    {"write", (PyCFunction)(void (*)(void))w_write, METH_VARARGS | METH_KEYWORDS,
     "write(*, id, parent, cat, thread, host_begin, host_end, track, dev_start, dev_end, raw_start, raw_end, leaf, "
     "region, hpids, dpids, extras, counters, pool, pool_off, pool_len, consts, mono) -> (bytes, run_tracks, opened, rows)"},
    {"drain", (PyCFunction)w_drain, METH_VARARGS, "drain(pool, pool_off, pool_len, consts, mono): every held row."},
    {"track", (PyCFunction)w_track, METH_VARARGS, "track(id, tail, h_span, h_parent, h_dev_start, h_dev_end)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "cltrace._ext.writer.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A .pftrace writer's state between batches (see the module).",
    .tp_new = w_new,
    .tp_dealloc = (destructor)w_dealloc,
    .tp_methods = w_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext.writer",
    "SpanBatch columns to Perfetto packets in one C pass (see cltrace.export.perfetto.fused).", -1, NULL,
};

PyObject *
cltrace_writer_module(void)
{
    if (PyType_Ready(&WriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddIntConstant(m, "NCONSTS", NCONSTS) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
