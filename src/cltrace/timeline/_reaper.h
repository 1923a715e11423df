/* The reaper thread (_reaper.c): tickets for events, their stamps read and the events released off the GIL. */
#ifndef CLTRACE_REAPER_H
#define CLTRACE_REAPER_H
#include <Python.h>
#include <stdint.h>

int reaper_available(void);
/* Retain ``ev``'s cl_event and give it a ticket; -1 (no exception set) if it cannot: keep the Event then.
 * ``queue`` (its pyopencl queue, or NULL) lets the reaper read an in-order queue's commands in order. */
int reaper_track(PyObject *ev, PyObject *queue, uint64_t *ticket);
PyObject *reaper_peek(PyObject *self, PyObject *args);
/* peek on C arrays (the GIL released by the caller): status, stamps[4] and failed of each ticket; -1: out of memory. */
int reaper_peek_into(const uint64_t *ts, size_t n, int32_t *status, int64_t *st, uint8_t *failed);
PyObject *reaper_wait(PyObject *self, PyObject *arg);
PyObject *reaper_done(PyObject *self, PyObject *arg);
PyObject *reaper_stats(PyObject *self, PyObject *unused);
PyObject *reaper_stop(PyObject *self, PyObject *unused);
PyObject *reaper_pause(PyObject *self, PyObject *arg);
PyObject *reaper_config(PyObject *self, PyObject *args);

#endif
