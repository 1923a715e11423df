/* The OpenCL entry points the stamps and the reaper call, resolved at run time from the library pyopencl
 * has loaded (``opencl_load``), and the two reads both make of an event: its status and stamps, a wait. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#ifdef _WIN32
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include "_opencl.h"

profiling_info_fn get_profiling_info = NULL;
event_info_fn get_event_info = NULL;
wait_fn wait_for_events = NULL;
refcount_fn retain_event = NULL, release_event = NULL;

int
opencl_load(const char *path)
{
#ifdef _WIN32
    HMODULE lib = LoadLibraryA(path);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load %s (error %lu)", path, GetLastError());
        return -1;
    }
#define SYM(name) ((void *)GetProcAddress(lib, name))
#else
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
        return -1;
    }
#define SYM(name) dlsym(lib, name)
#endif
    /* The library stays loaded for the life of the process, like pyopencl's own reference to it. */
    profiling_info_fn p = (profiling_info_fn)SYM("clGetEventProfilingInfo");
    event_info_fn e = (event_info_fn)SYM("clGetEventInfo");
    wait_fn w = (wait_fn)SYM("clWaitForEvents");
    refcount_fn r = (refcount_fn)SYM("clRetainEvent"), u = (refcount_fn)SYM("clReleaseEvent");
#undef SYM
    if (p == NULL || e == NULL || w == NULL) {
        PyErr_Format(PyExc_OSError, "%s lacks clGetEventProfilingInfo/clGetEventInfo/clWaitForEvents", path);
        return -1;
    }
    get_profiling_info = p;
    get_event_info = e;
    wait_for_events = w;
    if (r != NULL && u != NULL) { /* the reaper's; without them records keep their Events */
        retain_event = r;
        release_event = u;
    }
    return 0;
}

/* One event: its status, and its four stamps when the status is 0. END first: for a complete
 * command that is the only call that can fail, so the usual case costs four calls and no more. */
cl_int
read_one(cl_event ev, int64_t *st)
{
    cl_ulong v[4];
    cl_int err, status;
    int retried = 0;
again:
    /* END first: for a complete command that is the only call that can fail, so the usual case costs four
     * calls and no more. (Reading QUEUED first measured the same on NVIDIA's driver and PoCL.) */
    err = get_profiling_info(ev, CL_PROFILING_COMMAND_END, sizeof(cl_ulong), &v[3], NULL);
    if (err == CL_SUCCESS &&
        ((err = get_profiling_info(ev, CL_PROFILING_COMMAND_QUEUED, sizeof(cl_ulong), &v[0], NULL)) != CL_SUCCESS ||
         (err = get_profiling_info(ev, CL_PROFILING_COMMAND_SUBMIT, sizeof(cl_ulong), &v[1], NULL)) != CL_SUCCESS ||
         (err = get_profiling_info(ev, CL_PROFILING_COMMAND_START, sizeof(cl_ulong), &v[2], NULL)) != CL_SUCCESS))
        return err;
    if (err == CL_SUCCESS) {
        st[0] = (int64_t)v[0];
        st[1] = (int64_t)v[1];
        st[2] = (int64_t)v[2];
        st[3] = (int64_t)v[3];
        return CL_COMPLETE;
    }
    if (err != CL_PROFILING_INFO_NOT_AVAILABLE)
        return err;
    /* Not complete, failed, or no profiling (a user event, a queue without profiling). */
    err = get_event_info(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(cl_int), &status, NULL);
    if (err != CL_SUCCESS)
        return err;
    if (status != CL_COMPLETE)
        return status;
    if (!retried) { /* it completed between the two calls */
        retried = 1;
        goto again;
    }
    return CL_PROFILING_INFO_NOT_AVAILABLE;
}

void
wait_all(const cl_event *evs, size_t n)
{
    if (n > 0 && wait_for_events((cl_uint)n, evs) != CL_SUCCESS) {
        for (size_t i = 0; i < n; i++)
            wait_for_events(1, &evs[i]);
    }
}
