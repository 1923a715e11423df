/* The reaper: a native thread that reads each traced command's stamps once it completes and releases
 * its event, without the GIL.
 *
 * Why: a launch loop can hold the GIL so tightly that no other Python thread runs until it stops
 * (measured on an H200: a sleeping thread ticked 0 times in 1 s). Records waiting for the Python
 * resolver then kept their pyopencl Events, and NVIDIA's enqueue blocked once ~130k were unreleased.
 * Now the hot path trades each event for a *ticket* (``track``: one retain, a slot, no wait); the
 * record carries the ticket, the user's Event is freed as usual, and this thread releases our
 * reference as soon as the command is done. Held events are those still running on the device.
 *
 * A slot's life: ``track`` (HOLDS: the reaper has it retained) -> the reaper or the resolver reads its
 * stamps (HAS_DATA) -> the reaper releases the event (HOLDS cleared) -> the resolver is done with the
 * record (``done``: DONE) -> the slot is free. Slots live in blocks of 4096, freed when every slot
 * of the block is; the mutex guards slot states and the incoming list only: no OpenCL call and no
 * allocation beyond an occasional block happen under it on the hot path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <stdlib.h>

#include "_opencl.h"
#include "_reaper.h"

#ifndef _WIN32
#include <pthread.h>
#include <time.h>

#define BLOCK_BITS 12
#define BLOCK (1u << BLOCK_BITS)
#define DEEP_SLEEP_ROUNDS 64 /* empty rounds (at the slowest pace: ~0.1 s) before sleeping until woken */
#define MAX_BUSY 32 /* in-order queues skipped past their first running command, per round */
#define DIR_SIZE (1u << 16) /* blocks addressable at once: 268M tickets in flight, far past any cap */

enum { HOLDS = 1, HAS_DATA = 2, DONE = 4, FAILED = 8 };

typedef struct {
    cl_event ev;
    int64_t st[4];
    int32_t status;
    uint32_t state;
} slot_t;

typedef struct {
    slot_t s[BLOCK];
    uint32_t freed;
} block_t;

typedef struct {
    uint64_t t;
    cl_event ev;
    uintptr_t queue; /* an in-order queue's identity (its commands complete in order), 0 if unknown */
} held_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static block_t *dir[DIR_SIZE];
static uint64_t next_ticket = BLOCK; /* 0 means no ticket; every block issues all of its slots */
static held_t *incoming;          /* tracked since the reaper last looked; under mu */
static size_t n_in, cap_in;
static held_t *held; /* the reaper's own list of events it still holds */
static size_t n_held, cap_held;
static int running, idle, stopping;
static int paused; /* ``pause(True)``: track() declines, records keep their Events */
static long poll_min_ns = 250000, poll_max_ns = 2000000; /* the reaper's pace (``reaper_config``) */
static pthread_t thread;
/* Counters (under mu): for tests, ``cltrace devices`` and the benchmarks. */
static uint64_t n_tracked, n_reaped, n_inline, n_live, n_rounds;

static slot_t *
slot_of(uint64_t t)
{
    block_t *b = dir[(t >> BLOCK_BITS) & (DIR_SIZE - 1)];
    return b == NULL ? NULL : &b->s[t & (BLOCK - 1)];
}

/* Under mu: mark one of the slot's two owners gone; the slot is free when both are. */
static void
free_slot(uint64_t t)
{
    block_t **pb = &dir[(t >> BLOCK_BITS) & (DIR_SIZE - 1)];
    slot_t *s = &(*pb)->s[t & (BLOCK - 1)];
    s->state = 0;
    s->ev = NULL;
    if (++(*pb)->freed == BLOCK) {
        free(*pb);
        *pb = NULL;
    }
}

static int
grow(held_t **a, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    held_t *p = realloc(*a, c * sizeof(held_t));
    if (p == NULL)
        return -1;
    *a = p;
    *cap = c;
    return 0;
}

static void
nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

static void *
reap_loop(void *arg)
{
    (void)arg;
    long pause_ns = poll_min_ns;
    int empty_rounds = 0;
    held_t *done_list = NULL;
    size_t cap_done = 0;
    struct { int64_t st[4]; int32_t status; int failed; } *res = NULL;
    size_t cap_res = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        /* Nothing to do for a while (tracing stopped, or a program between phases): sleep until track()
         * wakes it. While commands come, it naps between rounds instead, so no launch pays a wake-up. */
        if (!stopping && n_in == 0 && n_held == 0 && empty_rounds >= DEEP_SLEEP_ROUNDS) {
            idle = 1;
            while (!stopping && n_in == 0)
                pthread_cond_wait(&cv, &mu);
            idle = 0;
            empty_rounds = 0;
        }
        if (stopping) {
            pthread_mutex_unlock(&mu);
            break;
        }
        if (n_in && grow(&held, &cap_held, n_held + n_in) == 0) {
            memcpy(held + n_held, incoming, n_in * sizeof(held_t));
            n_held += n_in;
            n_in = 0;
        }
        n_rounds++;
        pthread_mutex_unlock(&mu);

        /* Outside the lock: the reaper holds every event of its list, nobody else releases them. */
        size_t n = n_held, kept = 0, k = 0;
        if (grow(&done_list, &cap_done, n) < 0) {
            nap(1000000);
            continue;
        }
        if (n > cap_res) {
            void *p = realloc(res, n * sizeof(*res));
            if (p == NULL) {
                nap(1000000);
                continue;
            }
            res = p;
            cap_res = n;
        }
        /* Commands of one in-order queue complete in order: past its first one still running, the
         * rest of that queue waits for the next round unread (a launch loop keeps hundreds in flight,
         * and every driver call here competes with the program's enqueues for the driver's lock). */
        uintptr_t busy[MAX_BUSY];
        int n_busy = 0, full_scan = (n_rounds & 63) == 0;
        for (size_t i = 0; i < n; i++) {
            uintptr_t q = held[i].queue;
            if (q && !full_scan) {
                int skip = 0;
                for (int b = 0; b < n_busy; b++)
                    if (busy[b] == q) {
                        skip = 1;
                        break;
                    }
                if (skip) {
                    held[kept++] = held[i];
                    continue;
                }
            }
            cl_int s = read_one(held[i].ev, res[k].st);
            if (s > 0) {
                if (q && n_busy < MAX_BUSY)
                    busy[n_busy++] = q;
                held[kept++] = held[i];
                continue;
            }
            if (s < 0) {
                memset(res[k].st, 0, sizeof(res[k].st));
                cl_int exec = 0;
                res[k].failed = get_event_info(held[i].ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(cl_int),
                                               &exec, NULL) != CL_SUCCESS || exec < 0;
            } else {
                res[k].failed = 0;
            }
            res[k].status = s;
            done_list[k++] = held[i];
        }
        n_held = kept;
        if (k) {
            pthread_mutex_lock(&mu);
            for (size_t j = 0; j < k; j++) {
                slot_t *sl = slot_of(done_list[j].t);
                if (!(sl->state & HAS_DATA)) {
                    memcpy(sl->st, res[j].st, sizeof(sl->st));
                    sl->status = res[j].status;
                    sl->state |= HAS_DATA | (res[j].failed ? FAILED : 0);
                }
                sl->state &= ~HOLDS;
                if (sl->state & DONE)
                    free_slot(done_list[j].t);
            }
            n_reaped += k;
            n_live -= k;
            pthread_mutex_unlock(&mu);
            for (size_t j = 0; j < k; j++) /* after the slots say so: nobody copies a released handle */
                release_event(done_list[j].ev);
        }
        /* Poll often while commands complete, less while the device is busy with long ones or none come. */
        empty_rounds = n == 0 ? empty_rounds + 1 : 0;
        pause_ns = k ? poll_min_ns : (pause_ns < poll_max_ns ? pause_ns * 2 : poll_max_ns);
        nap(pause_ns);
    }
    free(done_list);
    free(res);
    return NULL;
}

static void
after_fork_child(void)
{
    /* The parent's thread is not in the child, nor are its commands: start empty (the blocks leak). */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    mu = m;
    cv = c;
    memset(dir, 0, sizeof(dir));
    incoming = NULL;
    n_in = cap_in = 0;
    held = NULL;
    n_held = cap_held = 0;
    running = idle = stopping = 0;
    n_tracked = n_reaped = n_inline = n_live = n_rounds = 0;
}

/* Whether ``queue`` (a pyopencl CommandQueue) executes in order; asked once per queue object in a row. */
static int
in_order(PyObject *queue)
{
    static PyObject *last = NULL, *attr = NULL;
    static int last_answer = 0;
    if (queue == last)
        return last_answer;
    if (attr == NULL && (attr = PyUnicode_InternFromString("properties")) == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *v = PyObject_GetAttr(queue, attr);
    long props = v == NULL ? -1 : PyLong_AsLong(v);
    Py_XDECREF(v);
    if (props == -1) {
        PyErr_Clear();
        return 0;
    }
    last = queue; /* an identity only, never dereferenced: a new queue at a freed one's address is asked again
                     at the next other queue, and a wrong answer only costs an extra read */
    last_answer = (props & 1) == 0; /* CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE */
    return last_answer;
}

int
reaper_track(PyObject *ev, PyObject *queue, uint64_t *ticket)
{
    static PyObject *attr = NULL;
    if (retain_event == NULL || stopping || paused)
        return -1;
    if (attr == NULL && (attr = PyUnicode_InternFromString("int_ptr")) == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject *v = PyObject_GetAttr(ev, attr);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    uint64_t h = (uint64_t)PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if ((h == (uint64_t)-1 && PyErr_Occurred()) || h == 0) {
        PyErr_Clear();
        return -1;
    }
    if (retain_event((cl_event)(uintptr_t)h) != CL_SUCCESS)
        return -1;
    uintptr_t queue_key = queue != NULL && queue != Py_None && in_order(queue) ? (uintptr_t)queue : 0;
    pthread_mutex_lock(&mu);
    uint64_t t = next_ticket;
    block_t **pb = &dir[(t >> BLOCK_BITS) & (DIR_SIZE - 1)];
    if (*pb == NULL)
        *pb = calloc(1, sizeof(block_t));
    if (*pb == NULL || (*pb)->s[t & (BLOCK - 1)].state != 0 || grow(&incoming, &cap_in, n_in + 1) < 0) {
        pthread_mutex_unlock(&mu);
        release_event((cl_event)(uintptr_t)h);
        return -1;
    }
    next_ticket++;
    slot_t *s = &(*pb)->s[t & (BLOCK - 1)];
    s->ev = (cl_event)(uintptr_t)h;
    s->state = HOLDS;
    incoming[n_in].t = t;
    incoming[n_in].ev = s->ev;
    incoming[n_in].queue = queue_key;
    n_in++;
    n_tracked++;
    n_live++;
    if (!running) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, 256 * 1024);
        running = pthread_create(&thread, &a, reap_loop, NULL) == 0;
        pthread_attr_destroy(&a);
    } else if (idle) {
        pthread_cond_signal(&cv);
    }
    pthread_mutex_unlock(&mu);
    *ticket = t;
    return 0;
}

/* Tickets from a uint64 buffer; -1 (exception set) if it is not one. */
static int
tickets_of(PyObject *obj, Py_buffer *b, Py_ssize_t *n)
{
    if (PyObject_GetBuffer(obj, b, PyBUF_SIMPLE) < 0)
        return -1;
    if (b->len % (Py_ssize_t)sizeof(uint64_t)) {
        PyBuffer_Release(b);
        PyErr_SetString(PyExc_ValueError, "tickets: need a uint64[N] buffer");
        return -1;
    }
    *n = b->len / (Py_ssize_t)sizeof(uint64_t);
    return 0;
}

#define CHUNK 1024 /* tickets per hold of the mutex: a launching thread never waits long for it */

/* Events of tickets whose stamps are not read yet, retained for the caller (released by ``unhold``). */
static size_t
hold_unread(const uint64_t *ts, size_t n, cl_event *evs, size_t *rows)
{
    size_t m = 0;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        pthread_mutex_lock(&mu);
        for (size_t i = i0; i < i1; i++) {
            slot_t *s = ts[i] ? slot_of(ts[i]) : NULL;
            if (s != NULL && (s->state & (HOLDS | HAS_DATA)) == HOLDS) {
                retain_event(s->ev); /* valid: the reaper releases only after clearing HOLDS under mu */
                evs[m] = s->ev;
                rows[m++] = i;
            }
        }
        pthread_mutex_unlock(&mu);
    }
    return m;
}

static void
unhold(cl_event *evs, size_t m)
{
    for (size_t j = 0; j < m; j++)
        release_event(evs[j]);
}

/* peek's work on C arrays, the GIL released by the caller: -1 out of memory (nothing written). */
int
reaper_peek_into(const uint64_t *ts, size_t n, int32_t *status, int64_t *st, uint8_t *failed)
{
    cl_event *evs = malloc((n ? n : 1) * sizeof(cl_event));
    size_t *rows = malloc((n ? n : 1) * sizeof(size_t));
    if (evs == NULL || rows == NULL) {
        free(evs);
        free(rows);
        return -1;
    }
    /* Commands the reaper has not reached yet are read here (their stamps kept for the next peek). */
    size_t m = hold_unread(ts, n, evs, rows);
    int32_t *rs = malloc((m ? m : 1) * sizeof(int32_t));
    int64_t *rst = malloc((m ? m : 1) * 4 * sizeof(int64_t));
    uint8_t *rf = malloc(m ? m : 1);
    if (rs && rst && rf) {
        for (size_t j = 0; j < m; j++) {
            memset(rst + 4 * j, 0, 4 * sizeof(int64_t));
            rs[j] = read_one(evs[j], rst + 4 * j);
            cl_int exec = 0;
            rf[j] = rs[j] < 0 && (get_event_info(evs[j], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(cl_int), &exec,
                                                 NULL) != CL_SUCCESS || exec < 0);
        }
    }
    for (size_t i0 = 0, j = 0; i0 < n; i0 += CHUNK) {
        size_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        pthread_mutex_lock(&mu);
        for (size_t i = i0; i < i1; i++) {
            slot_t *s = ts[i] ? slot_of(ts[i]) : NULL;
            if (j < m && rows[j] == i) {
                if (rs && rst && rf && rs[j] <= 0 && s != NULL && !(s->state & HAS_DATA)) {
                    memcpy(s->st, rst + 4 * j, sizeof(s->st));
                    s->status = rs[j];
                    s->state |= HAS_DATA | (rf[j] ? FAILED : 0);
                    n_inline++;
                }
                j++;
            }
            if (s == NULL || s->state == 0 || (s->state & DONE)) { /* not ours, or already done with */
                status[i] = -58; /* CL_INVALID_EVENT */
                memset(st + 4 * i, 0, 4 * sizeof(int64_t));
                failed[i] = 1;
            } else if (s->state & HAS_DATA) {
                status[i] = s->status;
                memcpy(st + 4 * i, s->st, sizeof(s->st));
                failed[i] = (s->state & FAILED) != 0;
            } else {
                status[i] = 1; /* still running */
                memset(st + 4 * i, 0, 4 * sizeof(int64_t));
                failed[i] = 0;
            }
        }
        pthread_mutex_unlock(&mu);
    }
    free(rs);
    free(rst);
    free(rf);
    unhold(evs, m);
    free(evs);
    free(rows);
    return 0;
}

PyObject *
reaper_peek(PyObject *self, PyObject *args)
{
    PyObject *to, *so, *sto, *fo;
    Py_buffer tb, sb, stb, fb;
    Py_ssize_t n;
    int err;
    if (!PyArg_ParseTuple(args, "OOOO:peek", &to, &so, &sto, &fo) || tickets_of(to, &tb, &n) < 0)
        return NULL;
    if (PyObject_GetBuffer(so, &sb, PyBUF_WRITABLE) < 0)
        goto fail0;
    if (PyObject_GetBuffer(sto, &stb, PyBUF_WRITABLE) < 0)
        goto fail1;
    if (PyObject_GetBuffer(fo, &fb, PyBUF_WRITABLE) < 0)
        goto fail2;
    if (sb.len != n * 4 || stb.len != n * 32 || fb.len != n) {
        PyErr_SetString(PyExc_ValueError, "peek: need tickets uint64[N], status int32[N], stamps int64[N, 4], failed uint8[N]");
        goto fail3;
    }
    Py_BEGIN_ALLOW_THREADS
    err = reaper_peek_into(tb.buf, (size_t)n, sb.buf, stb.buf, fb.buf);
    Py_END_ALLOW_THREADS
    if (err < 0) {
        PyErr_NoMemory();
        goto fail3;
    }
    PyBuffer_Release(&fb);
    PyBuffer_Release(&stb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    Py_RETURN_NONE;
fail3:
    PyBuffer_Release(&fb);
fail2:
    PyBuffer_Release(&stb);
fail1:
    PyBuffer_Release(&sb);
fail0:
    PyBuffer_Release(&tb);
    return NULL;
}

PyObject *
reaper_wait(PyObject *self, PyObject *arg)
{
    Py_buffer tb;
    Py_ssize_t n;
    if (tickets_of(arg, &tb, &n) < 0)
        return NULL;
    cl_event *evs = malloc((n ? n : 1) * sizeof(cl_event));
    size_t *rows = malloc((n ? n : 1) * sizeof(size_t));
    if (evs == NULL || rows == NULL) {
        free(evs);
        free(rows);
        PyBuffer_Release(&tb);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    size_t m = hold_unread(tb.buf, (size_t)n, evs, rows);
    wait_all(evs, m);
    unhold(evs, m);
    Py_END_ALLOW_THREADS
    free(evs);
    free(rows);
    PyBuffer_Release(&tb);
    Py_RETURN_NONE;
}

PyObject *
reaper_done(PyObject *self, PyObject *arg)
{
    Py_buffer tb;
    Py_ssize_t n;
    if (tickets_of(arg, &tb, &n) < 0)
        return NULL;
    const uint64_t *ts = tb.buf;
    for (Py_ssize_t i0 = 0; i0 < n; i0 += CHUNK) {
        Py_ssize_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        pthread_mutex_lock(&mu);
        for (Py_ssize_t i = i0; i < i1; i++) {
            slot_t *s = ts[i] ? slot_of(ts[i]) : NULL;
            if (s == NULL || (s->state & DONE) || s->state == 0)
                continue;
            s->state |= DONE;
            if (!(s->state & HOLDS))
                free_slot(ts[i]);
        }
        pthread_mutex_unlock(&mu);
    }
    PyBuffer_Release(&tb);
    Py_RETURN_NONE;
}

PyObject *
reaper_stats(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&mu);
    uint64_t tracked = n_tracked, reaped = n_reaped, inl = n_inline, live = n_live, rounds = n_rounds;
    int run = running && !stopping;
    size_t blocks = 0;
    for (size_t i = 0; i < DIR_SIZE; i++)
        blocks += dir[i] != NULL;
    pthread_mutex_unlock(&mu);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:n,s:O}", "tracked", (unsigned long long)tracked, "reaped",
                         (unsigned long long)reaped, "read_inline", (unsigned long long)inl, "held",
                         (unsigned long long)live, "rounds", (unsigned long long)rounds, "blocks", (Py_ssize_t)blocks,
                         "running", run ? Py_True : Py_False);
}

PyObject *
reaper_stop(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&mu);
    int join = running && !stopping;
    stopping = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    if (join) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(thread, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

PyObject *
reaper_config(PyObject *self, PyObject *args)
{
    long lo, hi;
    if (!PyArg_ParseTuple(args, "ll:reaper_config", &lo, &hi))
        return NULL;
    if (lo < 1000 || hi < lo || hi > 1000000000L) {
        PyErr_SetString(PyExc_ValueError, "reaper_config: need 1000 <= min_ns <= max_ns <= 1e9");
        return NULL;
    }
    poll_min_ns = lo;
    poll_max_ns = hi;
    Py_RETURN_NONE;
}

PyObject *
reaper_pause(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = paused;
    paused = on;
    return PyBool_FromLong(was);
}

int
reaper_available(void)
{
    static int registered = 0;
    if (!registered) {
        if (pthread_atfork(NULL, NULL, after_fork_child) != 0)
            return 0;
        registered = 1;
    }
    return retain_event != NULL && release_event != NULL;
}

#else /* _WIN32: no reaper; records keep their pyopencl Events */

int reaper_available(void) { return 0; }
int reaper_peek_into(const uint64_t *ts, size_t n, int32_t *status, int64_t *st, uint8_t *failed) { return -1; }
int reaper_track(PyObject *ev, PyObject *queue, uint64_t *ticket) { (void)ev; (void)queue; (void)ticket; return -1; }
PyObject *reaper_config(PyObject *self, PyObject *args) { return none(); }
static PyObject *none(void) { PyErr_SetString(PyExc_RuntimeError, "no reaper on this platform"); return NULL; }
PyObject *reaper_peek(PyObject *self, PyObject *args) { return none(); }
PyObject *reaper_wait(PyObject *self, PyObject *arg) { return none(); }
PyObject *reaper_done(PyObject *self, PyObject *arg) { return none(); }
PyObject *reaper_stats(PyObject *self, PyObject *unused) { return none(); }
PyObject *reaper_stop(PyObject *self, PyObject *unused) { Py_RETURN_NONE; }
PyObject *reaper_pause(PyObject *self, PyObject *arg) { Py_RETURN_FALSE; }

#endif
