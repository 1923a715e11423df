/* cltrace._ext, the one native module: the layouts its stages share with each other and with Python.
 *
 * The module exports every constant below (``cltrace._ext.R_ID`` ...); tests/test_native_layout.py holds
 * Python's copies (timeline/raw.py's R_*, timeline/stamps.py's C_* and F_*) equal to them. */
#ifndef CLTRACE_EXT_H
#define CLTRACE_EXT_H
#include <Python.h>

/* A raw record, as the hot path appends it: a tuple of N_FIELDS (timeline/raw.py's R_*). */
enum { R_CAT, R_NAME, R_ID, R_PARENT, R_PATH, R_THREAD, R_HB, R_HE, R_QUEUE, R_EV0, R_EV1, R_ATTRS, R_STATUS,
       R_ERROR, R_SITE, N_FIELDS };

/* The resolver's int64 columns of a batch of records, one row each (timeline/stamps.py's C_*). */
enum { C_ID, C_PARENT, C_HB, C_HE, C_QUEUE, C_PATH, C_THREAD, C_NAME, C_CAT, C_FLAGS, C_SITE, N_COLS };

/* Bits of C_FLAGS (timeline/stamps.py's F_*): on the device; a region's two markers; failed; has attributes;
 * a thread key past 64 bits (read by the caller); its events traded for the reaper's tickets. */
enum { F_DEV = 1, F_TWO = 2, F_ERROR = 4, F_ATTRS = 8, F_BIG_THREAD = 16, F_TICKETS = 32 };

#endif
