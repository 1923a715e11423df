/* cltrace._ext, the one native module: the layouts its stages share with each other and with Python,
 * and each stage's sub-module constructor (called once by PyInit__ext in _ext.c).
 *
 * The module exports every constant below (``cltrace._ext.R_ID`` ...); tests/test_native_layout.py holds
 * Python's copies (record/recorder.py's R_*, timeline/stamps.py's C_* and F_*) equal to them. */
#ifndef CLTRACE_EXT_H
#define CLTRACE_EXT_H
#include <Python.h>

/* A raw record, as the hot path appends it: a tuple of N_FIELDS (record/recorder.py's R_*). */
enum { R_CAT, R_NAME, R_ID, R_PARENT, R_PATH, R_THREAD, R_HB, R_HE, R_QUEUE, R_EV0, R_EV1, R_ATTRS, R_STATUS,
       R_ERROR, R_SITE, N_FIELDS };

/* The resolver's int64 columns of a batch of records, one row each (timeline/stamps.py's C_*). */
enum { C_ID, C_PARENT, C_HB, C_HE, C_QUEUE, C_PATH, C_THREAD, C_NAME, C_CAT, C_FLAGS, C_SITE, N_COLS };

/* Bits of C_FLAGS (timeline/stamps.py's F_*): on the device; a region's two markers; failed; has attributes;
 * a thread key past 64 bits (read by the caller); its events traded for the reaper's tickets. */
enum { F_DEV = 1, F_TWO = 2, F_ERROR = 4, F_ATTRS = 8, F_BIG_THREAD = 16, F_TICKETS = 32 };

/* The stages: each builds its sub-module (cltrace._ext.<name>), NULL with an exception set on failure. */
PyObject *cltrace_stamps_module(void);   /* timeline/_stamps.c (with _reaper.c, _opencl.c) */
PyObject *cltrace_resolve_module(void);  /* timeline/_resolve.c */
PyObject *cltrace_stats_module(void);    /* timeline/_stats.c */
PyObject *cltrace_region_module(void);   /* record/_region.c */
PyObject *cltrace_chrome_module(void);   /* export/_chrome.c */
PyObject *cltrace_writer_module(void);   /* export/perfetto/_writer.c */
PyObject *cltrace_scan_module(void);     /* read/_scan.c */

#endif
