/* The few OpenCL types, constants and entry points the stamps and the reaper use, resolved at run time
 * (``opencl_load`` in _opencl.c) from the library pyopencl has loaded: no OpenCL header or link-time library. */
#ifndef CLTRACE_OPENCL_H
#define CLTRACE_OPENCL_H
#include <stdint.h>
#include <stddef.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef void *cl_event;
typedef void *cl_command_queue;

#ifdef _WIN32
#define CL_API_CALL __stdcall
#else
#define CL_API_CALL
#endif

#define CL_SUCCESS 0
#define CL_COMPLETE 0
#define CL_PROFILING_INFO_NOT_AVAILABLE (-7)
#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3
#define CL_PROFILING_COMMAND_QUEUED 0x1280
#define CL_PROFILING_COMMAND_SUBMIT 0x1281
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283

typedef cl_int(CL_API_CALL *profiling_info_fn)(cl_event, cl_uint, size_t, void *, size_t *);
typedef cl_int(CL_API_CALL *event_info_fn)(cl_event, cl_uint, size_t, void *, size_t *);
typedef cl_int(CL_API_CALL *wait_fn)(cl_uint, const cl_event *);
typedef cl_int(CL_API_CALL *refcount_fn)(cl_event);

extern profiling_info_fn get_profiling_info;
extern event_info_fn get_event_info;
extern wait_fn wait_for_events;
extern refcount_fn retain_event, release_event;

/* Resolve the entry points in the library at ``path``; -1 with OSError set if it cannot. */
int opencl_load(const char *path);
/* One event's status (0 complete, > 0 not yet, < 0 failed or unreadable) and, when 0, its four stamps. */
cl_int read_one(cl_event ev, int64_t *st);
/* clWaitForEvents on all of them; after an error (a failed command) on each alone. GIL not touched. */
void wait_all(const cl_event *evs, size_t n);

#endif
