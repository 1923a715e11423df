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
 * Who reads, and when (measured on an H200 by a probe git history keeps: benchmarks/inline_probe.py before 7c93b17): while a thread enqueues, any
 * other thread's stamp read or release slows each of its enqueues by 3-5 us (both spin on the driver's
 * lock), and a read costs 4-8 us; right after the launching thread's own wait a read costs ~1 us.
 * So the launching thread harvests: every ``harvest_k`` commands tracked, if the command tracked
 * PROBE_BACK launches ago on its queue is complete (the device keeps up: the loop is launch-bound and
 * the wait costs nothing), it waits for its newest command there and reads + releases what it tracked (GIL
 * released; held for the reads while other threads launch too, so none enqueues meanwhile) (1.04x a
 * raw loop, against 1.2-1.6x for any other thread reading). Otherwise the
 * device is behind and the host has time to spare: the harvest is declined, and this thread reads
 * those commands once they are ``stale_ns`` old. It also reads whatever waits once the program has
 * been quiet (no command tracked) for ``quiet_ns``; the resolver's ``peek`` reads a ticket itself
 * only then, or once the ticket is stale.
 *
 * A slot's life: ``track`` (HOLDS: the reaper has it retained) -> the harvest, the reaper or the resolver
 * reads its stamps (HAS_DATA) -> the event is released (HOLDS cleared) -> the resolver is done with the
 * record (``done``: DONE) -> the slot is free. The command tracked last, tracked again (a projected region's
 * end is its last launch), shares its ticket: ``done`` frees it after the last of its records. Slots live in
 * blocks of 4096, freed when every slot of the block is; the mutex guards slot states and the incoming
 * list only: no OpenCL call and no allocation beyond an occasional block happen under it on the hot path.
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
#define PROBE_BACK 64 /* the harvest asks the status of the command this many launches back on the queue */
#define SPIN_NS 2000000 /* the longest a harvest may poll its newest command (``spin_ns``'s bound) */
/* While other threads launch too, a harvest reads with the GIL held (see harvest()), and every launching
 * thread waits for it: harvests come SHARED_DIV times as often, each that much shorter. Two threads on an
 * H200 (benchmarks/stall_parts.py, in git history before 7c93b17): the longest pause 10.4-10.6 ms -> 7.7-8.9 ms at the same launch rate
 * (0.43 ms a harvest of ~130 commands, against ~2 ms for ~1000). Harvesting only what is complete without
 * waiting for the newest cut the pause as much, but each read then cost 5.7 us and the launch rate fell by 20 %. */
#define SHARED_DIV 8

enum { HOLDS = 1, HAS_DATA = 2, DONE = 4, FAILED = 8 };

typedef struct {
    cl_event ev;
    int64_t st[4];
    int64_t at; /* when tracked (CLOCK_MONOTONIC ns) */
    int32_t status;
    uint16_t state;
    uint16_t shared; /* records beyond the first that hold this ticket (``track`` of the same event again) */
} slot_t;

typedef struct {
    slot_t s[BLOCK];
    uint32_t freed;
} block_t;

typedef struct {
    uint64_t t;
    cl_event ev;
    uintptr_t queue; /* an in-order queue's identity (its commands complete in order), 0 if unknown */
    cl_command_queue qh; /* its cl_command_queue, NULL if unknown */
    int64_t at; /* when tracked (CLOCK_MONOTONIC ns) */
} held_t;

typedef struct {
    int64_t st[4];
    int32_t status;
    int failed;
} result_t;

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
static int64_t quiet_ns = 2000000, stale_ns = 50000000;   /* see the top of this file */
static size_t harvest_k = 1024, harvest_gap = 1024;       /* harvest_k 0: no harvest */
/* While other threads launch, a harvest keeps the GIL through its wait for the newest command for up to this
 * long, so that no other thread enqueues between the wait and the reads (see harvest()); past it, the wait
 * goes on without the GIL. 0: the wait always without it. */
static int64_t shared_hold_ns = 200000;
/* How long a harvest polls its newest command before it reads only the completed front of its queue
 * instead (never waiting for the rest). A launch-bound loop's newest completes within a few us. Where the
 * device is busy with the host's run-ahead, a full poll drains the queue (2-3.5 ms a harvest) while reading
 * the front of a busy queue costs ~6 us a command on NVIDIA's driver (6 ms a harvest): on an H100
 * (benchmarks/bench_overlap.py, 512-1024 steps with device regions) 2 ms gave 1.08-1.37x and 50 us
 * 1.16-1.27x, within each other's noise, so the poll keeps its 2 ms and only its timeout changed. */
static int64_t spin_ns = SPIN_NS;
static size_t since_harvest;                              /* commands tracked since the last harvest */
static int64_t last_track_ns;                             /* the last command tracked from the hot path */
static pthread_t last_tracker;                            /* the thread that tracked it */
static int64_t tracker_switch_ns = INT64_MIN / 2;         /* when the tracking thread last changed */
static cl_event last_ev;                                  /* the event of the newest ticket ``track`` issued */
static uint64_t last_ticket;                              /* and that ticket */
static pthread_t thread;
/* Counters (under mu): for tests, ``cltrace devices`` and the benchmarks. */
static uint64_t n_tracked, n_reaped, n_inline, n_live, n_rounds, n_harvests, n_harvested, n_declined, n_front, n_shared;
static int64_t harvest_total_ns;

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Under mu: has the program handed us a command within ``quiet_ns``? */
static int
busy(int64_t now)
{
    return now - last_track_ns < quiet_ns;
}

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

/* Read one held event: its status (> 0 still running) and, when done, its result. */
static cl_int
reap_one(cl_event ev, result_t *r)
{
    cl_int s = read_one(ev, r->st);
    if (s > 0)
        return s;
    r->failed = 0;
    if (s < 0) {
        memset(r->st, 0, sizeof(r->st));
        cl_int exec = 0;
        r->failed = get_event_info(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(cl_int), &exec, NULL) != CL_SUCCESS ||
                    exec < 0;
    }
    r->status = s;
    return s;
}

/* Under mu: a done command's result into its slot, unless one is there already; 1 if it was put. */
static int
keep_result(slot_t *sl, const result_t *r)
{
    if (sl->state & HAS_DATA)
        return 0;
    memcpy(sl->st, r->st, sizeof(sl->st));
    sl->status = r->status;
    sl->state |= HAS_DATA | (r->failed ? FAILED : 0);
    return 1;
}

/* Done commands' results into their slots, then their events released (the reaper's and the harvest's). */
static void
settle_done(const held_t *done, const result_t *res, size_t k)
{
    if (!k)
        return;
    pthread_mutex_lock(&mu);
    for (size_t j = 0; j < k; j++) {
        slot_t *sl = slot_of(done[j].t);
        keep_result(sl, &res[j]);
        sl->state &= ~HOLDS;
        if (sl->state & DONE)
            free_slot(done[j].t);
    }
    n_reaped += k;
    n_live -= k;
    pthread_mutex_unlock(&mu);
    for (size_t j = 0; j < k; j++) /* after the slots say so: nobody copies a released handle */
        release_event(done[j].ev);
}

static void *
reap_loop(void *arg)
{
    (void)arg;
    long pause_ns = poll_min_ns;
    int empty_rounds = 0;
    held_t *done_list = NULL;
    size_t cap_done = 0;
    result_t *res = NULL;
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
        /* While the program launches, only what is stale: the rest is the launching thread's harvest. */
        const int64_t now = now_ns();
        const int launching = busy(now);
        size_t take = n_in;
        if (launching)
            for (take = 0; take < n_in && now - incoming[take].at >= stale_ns; take++)
                ;
        if (take && grow(&held, &cap_held, n_held + take) == 0) {
            memcpy(held + n_held, incoming, take * sizeof(held_t));
            n_held += take;
            memmove(incoming, incoming + take, (n_in - take) * sizeof(held_t));
            n_in -= take;
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
        uintptr_t busy_q[MAX_BUSY];
        int n_busy = 0, full_scan = (n_rounds & 63) == 0;
        for (size_t i = 0; i < n; i++) {
            uintptr_t q = held[i].queue;
            if (launching && now - held[i].at < stale_ns) {
                held[kept++] = held[i];
                continue;
            }
            if (q && !full_scan) {
                int skip = 0;
                for (int b = 0; b < n_busy; b++)
                    if (busy_q[b] == q) {
                        skip = 1;
                        break;
                    }
                if (skip) {
                    held[kept++] = held[i];
                    continue;
                }
            }
            if (reap_one(held[i].ev, &res[k]) > 0) {
                if (q && n_busy < MAX_BUSY)
                    busy_q[n_busy++] = q;
                held[kept++] = held[i];
                continue;
            }
            done_list[k++] = held[i];
        }
        n_held = kept; /* only this thread moves entries into its list or out of it */
        settle_done(done_list, res, k);
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
    n_tracked = n_reaped = n_inline = n_live = n_rounds = n_harvests = n_harvested = n_declined = n_front = n_shared = 0;
    last_ev = NULL;
    last_ticket = 0;
    harvest_total_ns = last_track_ns = 0;
    tracker_switch_ns = INT64_MIN / 2;
    harvest_gap = harvest_k;
    since_harvest = 0;
}

/* Whether ``queue`` (a pyopencl CommandQueue) executes in order, and its cl_command_queue (NULL if
 * unknown); asked once per queue object in a row. */
static int
queue_info(PyObject *queue, cl_command_queue *qh)
{
    static PyObject *last = NULL, *attr = NULL, *ptr = NULL;
    static int last_answer = 0;
    static cl_command_queue last_qh = NULL;
    if (queue == last) {
        *qh = last_qh;
        return last_answer;
    }
    *qh = NULL;
    if ((attr == NULL && (attr = PyUnicode_InternFromString("properties")) == NULL) ||
        (ptr == NULL && (ptr = PyUnicode_InternFromString("int_ptr")) == NULL)) {
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
    v = PyObject_GetAttr(queue, ptr);
    uint64_t h = v == NULL ? 0 : (uint64_t)PyLong_AsUnsignedLongLong(v);
    Py_XDECREF(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        h = 0;
    }
    last = queue; /* an identity only, never dereferenced: a new queue at a freed one's address is asked again
                     at the next other queue, and a wrong answer only costs an extra read (or a declined harvest) */
    last_answer = (props & 1) == 0; /* CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE */
    last_qh = (cl_command_queue)(uintptr_t)h;
    *qh = last_qh;
    return last_answer;
}

static int
is_complete(cl_event ev)
{
    cl_int exec = 1;
    return get_event_info(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(cl_int), &exec, NULL) == CL_SUCCESS &&
           exec == CL_COMPLETE;
}

/* The launching thread's harvest (see the top of this file), called by ``reaper_track`` with the GIL
 * held for ``qh``, the queue the caller holds (so the handle is alive). */
static void
harvest(cl_command_queue qh)
{
    pthread_mutex_lock(&mu);
    cl_event probe = NULL, newest = NULL;
    size_t seen = 0;
    for (size_t i = n_in; i-- > 0;)
        if (incoming[i].qh == qh) {
            if (newest == NULL)
                newest = incoming[i].ev;
            if (++seen == PROBE_BACK) {
                probe = incoming[i].ev;
                break;
            }
        }
    if (probe == NULL)
        newest = NULL;
    else { /* valid: only a harvest or the reaper releases, after taking the entry out of the list */
        retain_event(probe);
        retain_event(newest);
    }
    const uint64_t upto = next_ticket;
    const size_t most = n_in;
    const int others = now_ns() - tracker_switch_ns < stale_ns; /* another thread launched lately */
    pthread_mutex_unlock(&mu);
    size_t k = 0;
    int ok = 0;
    const int64_t t0 = now_ns();
    held_t *mine = NULL;
    result_t *res = NULL;
    /* Alone, the wait for the device and the reads run without the GIL (the resolver works beside them).
     * While other threads launch, the reads hold it, so that none enqueues meanwhile (a read beside an
     * enqueue costs both several us: 8 ms a harvest of 1024 against 2.6 ms, measured on an H200), and so
     * does the first ``shared_hold_ns`` of the wait: a wait that let the others enqueue left the queue busy
     * and the reads after it cost 2.5-6 us each (H200, two threads launching on one queue, stall_parts.py in git history:
     * the longest pause 7.6 -> 5.2 ms, iterations 890 -> 1 009 a second). A longer wait (a CPU device
     * behind the program, as PoCL's) goes on without the GIL. */
    PyThreadState *ts = others && shared_hold_ns > 0 ? NULL : PyEval_SaveThread();
    int front = 0; /* the newest is still running: read the completed front of the queue, never wait */
    if (probe != NULL) {
        /* The device keeps up if the command PROBE_BACK launches ago is done. In a launch-bound loop the
         * newest completes within a few us: the harvest waits for it, then reads everything (a read right
         * after the wait costs ~1 us on NVIDIA's driver). A device busy with the host's run-ahead (a
         * training step that keeps it busy) would make that wait drain the queue, and the host lose its
         * lead: past ``spin_ns`` the harvest reads only what is complete, in order, and leaves the rest
         * running (it was declined, and the reaper's thread read those commands later, beside the enqueues). */
        ok = is_complete(probe);
        const int64_t from = now_ns();
        for (int64_t until = from + spin_ns; ok && !is_complete(newest);) {
            const int64_t now = now_ns();
            if (now >= until) {
                front = 1;
                break;
            } else if (ts == NULL && now - from >= shared_hold_ns)
                ts = PyEval_SaveThread();
        }
        release_event(probe);
    }
    if (ts == NULL && !ok) /* declined: nothing to read */
        ts = PyEval_SaveThread();
    mine = ok ? malloc(2 * most * sizeof(held_t)) : NULL; /* [0, most): taken; [most, ..): handed back */
    res = mine != NULL ? malloc(most * sizeof(result_t)) : NULL;
    /* A wait on the newest, already complete, never a clFinish: a finish could wait for a command another
     * thread enqueued meanwhile behind a user event it sets later (a hang the untraced program has not).
     * The reads cost the same after either (H200: 363-393 ms of harvests for 400k commands, against
     * 369-510 ms after a finish and 358-470 ms after no wait at all). */
    ok = res != NULL && (front || wait_for_events(1, &newest) == CL_SUCCESS);
    if (newest != NULL)
        release_event(newest);
    if (others && ts != NULL) {
        PyEval_RestoreThread(ts);
        ts = NULL;
    }
    size_t m = 0;
    if (ok) {
        /* What was tracked on this queue before the newest is done (in order): take it out of the reaper's way. */
        pthread_mutex_lock(&mu);
        size_t kept = 0;
        for (size_t i = 0; i < n_in; i++) {
            if (incoming[i].qh == qh && incoming[i].t < upto && m < most)
                mine[m++] = incoming[i];
            else
                incoming[kept++] = incoming[i];
        }
        n_in = kept;
        pthread_mutex_unlock(&mu);
        size_t back = 0;
        int behind = 0; /* an in-order queue's first running command: the rest of it is running too */
        for (size_t j = 0; j < m; j++) {
            if ((behind && mine[j].queue) || reap_one(mine[j].ev, &res[k]) > 0) {
                mine[most + back++] = mine[j]; /* still running (or enqueued after the newest by another
                                                  thread): handed back below */
                behind |= front;
            } else
                mine[k++] = mine[j];
        }
        settle_done(mine, res, k);
        if (back) {
            pthread_mutex_lock(&mu);
            if (grow(&incoming, &cap_in, n_in + back) == 0) {
                memcpy(incoming + n_in, mine + most, back * sizeof(held_t));
                n_in += back;
            } else { /* out of memory: let the event go unread, its span keeps no device time */
                for (size_t j = most; j < most + back; j++) {
                    slot_t *sl = slot_of(mine[j].t);
                    sl->status = -5; /* CL_OUT_OF_RESOURCES */
                    sl->state = (sl->state | HAS_DATA | FAILED) & ~HOLDS;
                    if (sl->state & DONE)
                        free_slot(mine[j].t);
                    release_event(mine[j].ev);
                    n_live--;
                }
            }
            pthread_mutex_unlock(&mu);
        }
    }
    free(mine);
    free(res);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    const int64_t spent = now_ns() - t0;
    pthread_mutex_lock(&mu);
    if (ok) {
        n_harvests++;
        n_harvested += k;
        n_front += front;
    } else {
        n_declined++;
    }
    harvest_total_ns += spent;
    harvest_gap = ok ? (others ? harvest_k / SHARED_DIV + 1 : harvest_k) : harvest_k / 4 + 1;
    pthread_mutex_unlock(&mu);
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
    cl_command_queue qh = NULL;
    const int known = queue != NULL && queue != Py_None;
    uintptr_t queue_key = known && queue_info(queue, &qh) ? (uintptr_t)queue : 0;
    const int64_t now = now_ns();
    pthread_mutex_lock(&mu);
    if ((cl_event)(uintptr_t)h == last_ev) {
        /* The command tracked last, again (a projected region ends at its last launch): one ticket, read once.
         * Its event is still ours while the slot HOLDS it, so the handle is not a new event at a freed one's address. */
        slot_t *s = slot_of(last_ticket);
        if (s != NULL && (s->state & (HOLDS | DONE)) == HOLDS && s->shared < UINT16_MAX) {
            s->shared++;
            n_shared++;
            if (known)
                last_track_ns = now;
            pthread_mutex_unlock(&mu);
            release_event((cl_event)(uintptr_t)h);
            *ticket = last_ticket;
            return 0;
        }
    }
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
    s->shared = 0;
    s->at = now;
    last_ev = s->ev;
    last_ticket = t;
    incoming[n_in].t = t;
    incoming[n_in].ev = s->ev;
    incoming[n_in].queue = queue_key;
    incoming[n_in].qh = qh;
    incoming[n_in].at = now;
    n_in++;
    if (known) {
        last_track_ns = now;
        if (!pthread_equal(last_tracker, pthread_self())) {
            last_tracker = pthread_self();
            tracker_switch_ns = now;
        }
    }
    const int due = qh != NULL && harvest_k && ++since_harvest >= harvest_gap;
    if (due) {
        since_harvest = 0;
        harvest_gap = (size_t)-1; /* one harvest at a time; it sets the next gap */
    }
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
    if (due)
        harvest(qh);
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

/* Events of tickets whose stamps are not read yet, retained for the caller (released by ``unhold``).
 * ``polite``: while the program launches, only tickets already stale (the rest are the harvest's). */
static size_t
hold_unread(const uint64_t *ts, size_t n, cl_event *evs, size_t *rows, int polite)
{
    size_t m = 0;
    const int64_t now = now_ns();
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        pthread_mutex_lock(&mu);
        const int wait_stale = polite && busy(now);
        for (size_t i = i0; i < i1; i++) {
            slot_t *s = ts[i] ? slot_of(ts[i]) : NULL;
            if (s != NULL && (s->state & (HOLDS | HAS_DATA)) == HOLDS && !(wait_stale && now - s->at < stale_ns)) {
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

/* Read the held events of rows ``rows`` of ``ts`` and keep the done ones' results in their slots
 * (read for the next peek; the reaper or a harvest still releases them). -1: out of memory. */
static int
read_into_slots(const uint64_t *ts, const cl_event *evs, const size_t *rows, size_t m)
{
    result_t *res = malloc((m ? m : 1) * sizeof(result_t));
    if (res == NULL)
        return -1;
    for (size_t j = 0; j < m; j++) {
        cl_int s = reap_one(evs[j], &res[j]);
        if (s > 0)
            res[j].status = s;
    }
    for (size_t j0 = 0; j0 < m; j0 += CHUNK) {
        size_t j1 = j0 + CHUNK < m ? j0 + CHUNK : m;
        pthread_mutex_lock(&mu);
        for (size_t j = j0; j < j1; j++) {
            slot_t *s = slot_of(ts[rows[j]]);
            if (res[j].status <= 0 && s != NULL)
                n_inline += keep_result(s, &res[j]);
        }
        pthread_mutex_unlock(&mu);
    }
    free(res);
    return 0;
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
    /* Commands nobody has read yet are read here, unless the launching thread will (its harvest). */
    size_t m = hold_unread(ts, n, evs, rows, 1);
    int err = read_into_slots(ts, evs, rows, m);
    unhold(evs, m);
    free(evs);
    free(rows);
    if (err < 0)
        return -1;
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t i1 = i0 + CHUNK < n ? i0 + CHUNK : n;
        pthread_mutex_lock(&mu);
        for (size_t i = i0; i < i1; i++) {
            slot_t *s = ts[i] ? slot_of(ts[i]) : NULL;
            if (s == NULL || s->state == 0 || (s->state & DONE)) { /* not ours, or already done with */
                status[i] = -58; /* CL_INVALID_EVENT */
                memset(st + 4 * i, 0, 4 * sizeof(int64_t));
                failed[i] = 1;
            } else if (s->state & HAS_DATA) {
                status[i] = s->status;
                memcpy(st + 4 * i, s->st, sizeof(s->st));
                failed[i] = (s->state & FAILED) != 0;
            } else {
                status[i] = 1; /* still running, or left to the harvest */
                memset(st + 4 * i, 0, 4 * sizeof(int64_t));
                failed[i] = 0;
            }
        }
        pthread_mutex_unlock(&mu);
    }
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

#define TAKE_RATIO 8 /* take_and_read passes over the incoming list only for at least 1/8 of its length */

static int
cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* ``wait``'s own reads of the tickets nobody has taken yet: they leave the incoming list with the reaper's
 * reference, are read (what still runs, after a wait) and released here, so no retain and release of our own
 * and no second reader beside the reaper (at ``stop()`` it reads the same tail once the program is quiet).
 * Returns how many it settled; -1 out of memory (nothing taken). */
static long
take_and_read(const uint64_t *ts, size_t n)
{
    pthread_mutex_lock(&mu);
    const int few = n * TAKE_RATIO < n_in; /* a few tickets (a profile's field read): not worth a pass over the list */
    pthread_mutex_unlock(&mu);
    if (few || n == 0)
        return 0;
    uint64_t *want = malloc(n * sizeof(uint64_t));
    held_t *mine = malloc(n * sizeof(held_t));
    result_t *res = malloc(n * sizeof(result_t));
    cl_event *run = malloc(n * sizeof(cl_event));
    if (want == NULL || mine == NULL || res == NULL || run == NULL) {
        free(want);
        free(mine);
        free(res);
        free(run);
        return -1;
    }
    memcpy(want, ts, n * sizeof(uint64_t));
    qsort(want, n, sizeof(uint64_t), cmp_u64);
    pthread_mutex_lock(&mu);
    size_t m = 0, kept = 0; /* m <= n: a ticket is in the list once */
    for (size_t i = 0; i < n_in; i++) {
        const slot_t *sl = slot_of(incoming[i].t);
        if (sl != NULL && !(sl->state & HAS_DATA) &&
            bsearch(&incoming[i].t, want, n, sizeof(uint64_t), cmp_u64) != NULL)
            mine[m++] = incoming[i];
        else
            incoming[kept++] = incoming[i];
    }
    n_in = kept;
    pthread_mutex_unlock(&mu);
    free(want);
    size_t r = 0;
    for (size_t j = 0; j < m; j++)
        if ((res[j].status = reap_one(mine[j].ev, &res[j])) > 0)
            run[r++] = mine[j].ev;
    if (r) { /* read right after the wait, where a read is cheap */
        wait_all(run, r);
        for (size_t j = 0; j < m; j++)
            if (res[j].status > 0 && (res[j].status = reap_one(mine[j].ev, &res[j])) > 0) {
                res[j].status = -5; /* still not done after the wait: CL_OUT_OF_RESOURCES, its span keeps no device time */
                res[j].failed = 1;
                memset(res[j].st, 0, sizeof(res[j].st));
            }
    }
    settle_done(mine, res, m);
    free(mine);
    free(res);
    free(run);
    return (long)m;
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
    int err;
    cl_event *run_evs = NULL;
    size_t *run_rows = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = take_and_read(tb.buf, (size_t)n) < 0 ? -1 : 0;
    size_t m = err ? 0 : hold_unread(tb.buf, (size_t)n, evs, rows, 0);
    /* Read first, then wait only for what is still running: at ``stop()`` the program has mostly finished
     * its queues, and a wait on thousands of complete events cost more than their reads (H200: 4.2-5.2 ms
     * for 2,400-2,750 tickets at the end of a training loop). */
    size_t r = 0;
    if (err == 0)
        err = read_into_slots(tb.buf, evs, rows, m);
    if (err == 0) {
        run_evs = malloc((m ? m : 1) * sizeof(cl_event));
        run_rows = malloc((m ? m : 1) * sizeof(size_t));
        if (run_evs == NULL || run_rows == NULL)
            err = -1;
        else {
            pthread_mutex_lock(&mu);
            for (size_t j = 0; j < m; j++) {
                slot_t *s = slot_of(((const uint64_t *)tb.buf)[rows[j]]);
                if (s != NULL && !(s->state & HAS_DATA)) {
                    run_evs[r] = evs[j];
                    run_rows[r++] = rows[j];
                }
            }
            pthread_mutex_unlock(&mu);
        }
    }
    if (err == 0 && r) {
        wait_all(run_evs, r);
        err = read_into_slots(tb.buf, run_evs, run_rows, r); /* right after the wait, where a read is cheap */
    }
    unhold(evs, m);
    Py_END_ALLOW_THREADS
    free(run_evs);
    free(run_rows);
    free(evs);
    free(rows);
    PyBuffer_Release(&tb);
    if (err < 0)
        return PyErr_NoMemory();
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
            if (s->shared) { /* another record still holds this ticket */
                s->shared--;
                continue;
            }
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
    uint64_t tracked = n_tracked, reaped = n_reaped, inl = n_inline, live = n_live, rounds = n_rounds,
             harvests = n_harvests, harvested = n_harvested, declined = n_declined, front = n_front, shared = n_shared;
    int64_t harvest_ms = harvest_total_ns / 1000000;
    int run = running && !stopping;
    size_t blocks = 0;
    for (size_t i = 0; i < DIR_SIZE; i++)
        blocks += dir[i] != NULL;
    pthread_mutex_unlock(&mu);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:n,s:O,s:K,s:K,s:K,s:K,s:L,s:K}", "tracked", (unsigned long long)tracked,
                         "reaped", (unsigned long long)reaped, "read_inline", (unsigned long long)inl, "held",
                         (unsigned long long)live, "rounds", (unsigned long long)rounds, "blocks", (Py_ssize_t)blocks,
                         "running", run ? Py_True : Py_False, "harvests", (unsigned long long)harvests, "harvested",
                         (unsigned long long)harvested, "harvests_declined", (unsigned long long)declined,
                         "harvests_front", (unsigned long long)front, "harvest_ms", (long long)harvest_ms,
                         "shared", (unsigned long long)shared);
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
    long long every = -1, quiet = -1, stale = -1, hold = -1, spin = -1;
    if (!PyArg_ParseTuple(args, "ll|LLLLL:reaper_config", &lo, &hi, &every, &quiet, &stale, &hold, &spin))
        return NULL;
    if (lo < 1000 || hi < lo || hi > 1000000000L || every < -1 || every > (1LL << 30) || quiet < -1 ||
        quiet > 10000000000LL || stale < -1 || stale > 100000000000LL || hold < -1 || hold > SPIN_NS ||
        spin < -1 || spin > SPIN_NS) {
        PyErr_SetString(PyExc_ValueError, "reaper_config: need 1000 <= min_ns <= max_ns <= 1e9, 0 <= harvest_every "
                                          "<= 2**30, 0 <= quiet_ns <= 1e10, 0 <= stale_ns <= 1e11, 0 <= shared_hold_ns "
                                          "<= 2e6, 0 <= spin_ns <= 2e6 (-1: unchanged)");
        return NULL;
    }
    pthread_mutex_lock(&mu);
    PyObject *was = Py_BuildValue("(llnLLLL)", poll_min_ns, poll_max_ns, (Py_ssize_t)harvest_k, (long long)quiet_ns,
                                  (long long)stale_ns, (long long)shared_hold_ns, (long long)spin_ns);
    poll_min_ns = lo;
    poll_max_ns = hi;
    if (every >= 0) {
        harvest_gap = harvest_k = (size_t)every;
        since_harvest = 0;
    }
    if (quiet >= 0)
        quiet_ns = quiet;
    if (stale >= 0)
        stale_ns = stale;
    if (hold >= 0)
        shared_hold_ns = hold;
    if (spin >= 0)
        spin_ns = spin;
    pthread_mutex_unlock(&mu);
    return was;
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
