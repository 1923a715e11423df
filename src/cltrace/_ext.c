/* cltrace._ext: the one native module. Each stage of the data path keeps its own .c file and appears here
 * as a sub-module (``cltrace._ext.stamps``, ``.resolve``, ``.stats``, ``.region``, ``.chrome``, ``.writer``,
 * ``.scan``); the shared layouts (_ext.h) are exported as ints. _ext.pyi states the interface;
 * cltrace/_native.py picks, per stage, this module or the Python reference. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_ext.h"

/* The stages: each builds its sub-module (cltrace._ext.<name>), NULL with an exception set on failure. */
PyObject *cltrace_stamps_module(void);   /* timeline/_stamps.c (with _reaper.c, _opencl.c) */
PyObject *cltrace_resolve_module(void);  /* timeline/_resolve.c */
PyObject *cltrace_stats_module(void);    /* timeline/_stats.c */
PyObject *cltrace_region_module(void);   /* record/_region.c */
PyObject *cltrace_chrome_module(void);   /* export/_chrome.c */
PyObject *cltrace_writer_module(void);   /* export/perfetto/_writer.c */
PyObject *cltrace_scan_module(void);     /* read/_scan.c */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cltrace._ext", "cltrace's native stages, one sub-module each (see _ext.pyi).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__ext(void)
{
    static const struct { const char *name; PyObject *(*make)(void); } stages[] = {
        {"stamps", cltrace_stamps_module}, {"resolve", cltrace_resolve_module}, {"stats", cltrace_stats_module},
        {"region", cltrace_region_module}, {"chrome", cltrace_chrome_module}, {"writer", cltrace_writer_module},
        {"scan", cltrace_scan_module},
    };
#define K(name) {#name, name}
    static const struct { const char *name; long value; } consts[] = {
        K(R_CAT), K(R_NAME), K(R_ID), K(R_PARENT), K(R_PATH), K(R_THREAD), K(R_HB), K(R_HE), K(R_QUEUE), K(R_EV0),
        K(R_EV1), K(R_ATTRS), K(R_STATUS), K(R_ERROR), K(R_SITE), K(N_FIELDS),
        K(C_ID), K(C_PARENT), K(C_HB), K(C_HE), K(C_QUEUE), K(C_PATH), K(C_THREAD), K(C_NAME), K(C_CAT), K(C_FLAGS),
        K(C_SITE), K(N_COLS),
        K(F_DEV), K(F_TWO), K(F_ERROR), K(F_ATTRS), K(F_BIG_THREAD), K(F_TICKETS),
    };
#undef K
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0)
            goto fail;
    PyObject *modules = PyImport_GetModuleDict(); /* borrowed */
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        PyObject *sub = stages[i].make();
        /* also importable by its name (``import cltrace._ext.stamps``), as its types' __module__ says */
        if (sub == NULL || PyDict_SetItemString(modules, PyModule_GetName(sub), sub) < 0 ||
            PyModule_AddObject(m, stages[i].name, sub) < 0) {
            Py_XDECREF(sub);
            goto fail;
        }
    }
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
