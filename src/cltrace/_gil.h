/* When cltrace's C code gives up the GIL around pure-C work.
 *
 * Each release lets another thread take the GIL, and CPython asks a holder to drop it only after a whole
 * switch interval passes *without any switch*. A thread that takes and drops the GIL often (cltrace's
 * worker, releasing around each step of its C work, beside launching threads that drop it around driver
 * calls and waits) keeps switches coming, so a third thread that waits may get no turn for a long time.
 * Work on fewer than ``clt_release_rows`` rows keeps the GIL (a fraction of a millisecond); longer work
 * releases it, and waits for the device or for a thread always do. ``CLTRACE_GIL_ROWS`` sets the
 * threshold (0: release around all work), read at first use. */
#ifndef CLTRACE_GIL_H
#define CLTRACE_GIL_H

#include <Python.h>
#include <stdlib.h>

#define CLT_RELEASE_ROWS_DEFAULT 65536

static Py_ssize_t clt_release_rows_ = -1; /* read at first use (the GIL held) */

static Py_ssize_t
clt_release_rows(void)
{
    if (clt_release_rows_ < 0) {
        const char *v = getenv("CLTRACE_GIL_ROWS");
        char *end = NULL;
        long long x = v != NULL && *v ? strtoll(v, &end, 10) : -1;
        clt_release_rows_ = end != NULL && *end == '\0' && x >= 0 ? (Py_ssize_t)x : CLT_RELEASE_ROWS_DEFAULT;
    }
    return clt_release_rows_;
}

/* Like Py_BEGIN_ALLOW_THREADS / Py_END_ALLOW_THREADS, for work on ``rows`` rows. */
#define CLT_BEGIN_WORK(rows)                                                                                 \
    {                                                                                                        \
        PyThreadState *clt_ts_ = (Py_ssize_t)(rows) >= clt_release_rows() ? PyEval_SaveThread() : NULL;
#define CLT_END_WORK                                                                                         \
    if (clt_ts_ != NULL)                                                                                     \
        PyEval_RestoreThread(clt_ts_);                                                                       \
    }

#endif
