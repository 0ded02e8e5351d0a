/* A substitute libamdhip64.so.7 for running FlyDSL on a CPU.
 *
 * FlyDSL's libfly_jit_runtime.so imports these hip_4.2-versioned functions. Memory calls act on host
 * memory (device pointers are host addresses); module load / get-function / launch / unload are
 * forwarded to Python callbacks registered with emuSetCallbacks(). Streams and events are no-ops
 * because every launch completes synchronously inside hipModuleLaunchKernel.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorOutOfMemory = 2, hipErrorInvalidImage = 200,
       hipErrorNotFound = 500, hipErrorLaunchFailure = 719 };

typedef int64_t (*load_cb_t)(const void *image);
typedef int64_t (*getfn_cb_t)(int64_t module, const char *name);
typedef int (*launch_cb_t)(int64_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, unsigned shared_bytes, void **params, void **extra);
typedef void (*unload_cb_t)(int64_t module);

static load_cb_t load_cb;
static getfn_cb_t getfn_cb;
static launch_cb_t launch_cb;
static unload_cb_t unload_cb;
static hipError_t last_error = hipSuccess;
static int current_device = 0;

void emuSetCallbacks(load_cb_t l, getfn_cb_t g, launch_cb_t x, unload_cb_t u) {
    load_cb = l; getfn_cb = g; launch_cb = x; unload_cb = u;
}

static hipError_t ret(hipError_t e) { if (e != hipSuccess) last_error = e; return e; }

hipError_t hipGetDeviceCount(int *count) { *count = 1; return hipSuccess; }
hipError_t hipGetDevice(int *dev) { *dev = current_device; return hipSuccess; }
hipError_t hipSetDevice(int dev) { if (dev != 0) return ret(hipErrorInvalidValue); current_device = dev; return hipSuccess; }
hipError_t hipDeviceSynchronize(void) { return hipSuccess; }
hipError_t hipGetLastError(void) { hipError_t e = last_error; last_error = hipSuccess; return e; }

const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
    }
}

hipError_t hipMalloc(void **p, size_t n) {
    /* 256-byte alignment like a device allocator; zero-sized requests still get a unique pointer. */
    *p = aligned_alloc(256, ((n ? n : 1) + 255) / 256 * 256);
    return *p ? hipSuccess : ret(hipErrorOutOfMemory);
}
hipError_t hipFree(void *p) { free(p); return hipSuccess; }
hipError_t hipMemcpy(void *d, const void *s, size_t n, int kind) { (void)kind; memmove(d, s, n); return hipSuccess; }
hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, int kind, void *stream) {
    (void)kind; (void)stream; memmove(d, s, n); return hipSuccess;
}
hipError_t hipMemset(void *d, int v, size_t n) { memset(d, v, n); return hipSuccess; }
hipError_t hipMemsetD16Async(void *d, unsigned short v, size_t n, void *stream) {
    (void)stream; uint16_t *p = d; for (size_t i = 0; i < n; i++) p[i] = v; return hipSuccess;
}
hipError_t hipMemsetD32Async(void *d, int v, size_t n, void *stream) {
    (void)stream; int32_t *p = d; for (size_t i = 0; i < n; i++) p[i] = v; return hipSuccess;
}
hipError_t hipHostRegister(void *p, size_t n, unsigned flags) { (void)p; (void)n; (void)flags; return hipSuccess; }
hipError_t hipHostUnregister(void *p) { (void)p; return hipSuccess; }
hipError_t hipHostGetDevicePointer(void **d, void *h, unsigned flags) { (void)flags; *d = h; return hipSuccess; }

/* Streams and events: handles are distinct non-null tokens; all work is already complete. */
static char token;
hipError_t hipStreamCreate(void **s) { *s = &token; return hipSuccess; }
hipError_t hipStreamDestroy(void *s) { (void)s; return hipSuccess; }
hipError_t hipStreamSynchronize(void *s) { (void)s; return hipSuccess; }
hipError_t hipStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; return hipSuccess; }
hipError_t hipEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = &token; return hipSuccess; }
hipError_t hipEventDestroy(void *e) { (void)e; return hipSuccess; }
hipError_t hipEventRecord(void *e, void *s) { (void)e; (void)s; return hipSuccess; }
hipError_t hipEventSynchronize(void *e) { (void)e; return hipSuccess; }

hipError_t hipModuleLoadData(void **module, const void *image) {
    if (!load_cb) return ret(hipErrorInvalidImage);
    int64_t h = load_cb(image);
    if (h <= 0) return ret(hipErrorInvalidImage);
    *module = (void *)(intptr_t)h;
    return hipSuccess;
}
hipError_t hipModuleUnload(void *module) {
    if (unload_cb) unload_cb((int64_t)(intptr_t)module);
    return hipSuccess;
}
hipError_t hipModuleGetFunction(void **fn, void *module, const char *name) {
    if (!getfn_cb) return ret(hipErrorNotFound);
    int64_t h = getfn_cb((int64_t)(intptr_t)module, name);
    if (h <= 0) return ret(hipErrorNotFound);
    *fn = (void *)(intptr_t)h;
    return hipSuccess;
}
hipError_t hipModuleLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared_bytes, void *stream, void **params, void **extra) {
    (void)stream;
    if (!launch_cb) return ret(hipErrorLaunchFailure);
    return ret(launch_cb((int64_t)(intptr_t)fn, gx, gy, gz, bx, by, bz, shared_bytes, params, extra));
}
hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *fn, int block_size, size_t smem) {
    (void)fn; (void)smem;
    /* 4 SIMDs x 8 waves per CU on CDNA; enough for FlyDSL's persistent-grid sizing. */
    int waves = (block_size + 63) / 64;
    *blocks = waves > 0 ? (32 / waves > 0 ? 32 / waves : 1) : 1;
    return hipSuccess;
}
