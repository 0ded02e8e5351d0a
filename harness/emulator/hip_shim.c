/* A substitute libamdhip64.so.7 for running FlyDSL on a CPU.
 *
 * FlyDSL's libfly_jit_runtime.so imports these hip_4.2-versioned functions. Memory calls act on host
 * memory (device pointers are host addresses); module load / get-function / launch / unload are
 * forwarded to Python callbacks registered with emuSetCallbacks(). Streams and events are no-ops
 * because every launch completes synchronously inside hipModuleLaunchKernel.
 *
 * Device memory (hipMalloc, hipExtMallocWithFlags) is a shared mapping of a memfd, so one rank process can
 * export it with hipIpcGetMemHandle and another map the same pages with hipIpcOpenMemHandle (through
 * /proc/<pid>/fd/<fd>): the emulated loads and stores of every rank then reach it, and CPU atomics on it
 * are real cross-process atomics. "Uncached" means nothing on a CPU: every access is coherent.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

/* ---- device memory: memfd-backed shared mappings (IPC-able) ---------------------------------------- */
#define MAX_MAPS 4096
struct mapping { void *p; size_t n; int fd; int imported; };
static struct mapping maps[MAX_MAPS];
static pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;

static int map_add(void *p, size_t n, int fd, int imported) {
    pthread_mutex_lock(&maps_mu);
    for (int i = 0; i < MAX_MAPS; i++)
        if (!maps[i].p) { maps[i] = (struct mapping){p, n, fd, imported}; pthread_mutex_unlock(&maps_mu); return 0; }
    pthread_mutex_unlock(&maps_mu);
    return -1;
}
static int map_take(void *p, int imported, struct mapping *out) {
    pthread_mutex_lock(&maps_mu);
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].p == p && maps[i].imported == imported) {
            *out = maps[i]; maps[i].p = NULL; pthread_mutex_unlock(&maps_mu); return 0;
        }
    pthread_mutex_unlock(&maps_mu);
    return -1;
}
static int map_find(const void *p, struct mapping *out) {
    pthread_mutex_lock(&maps_mu);
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].p == p && !maps[i].imported) { *out = maps[i]; pthread_mutex_unlock(&maps_mu); return 0; }
    pthread_mutex_unlock(&maps_mu);
    return -1;
}

static hipError_t shared_alloc(void **p, size_t n) {
    size_t size = ((n ? n : 1) + 4095) / 4096 * 4096;   /* page-aligned: at least a device allocator's 256 */
    int fd = memfd_create("amdk-emu-device", MFD_CLOEXEC);
    if (fd < 0) return ret(hipErrorOutOfMemory);
    if (ftruncate(fd, (off_t)size) != 0) { close(fd); return ret(hipErrorOutOfMemory); }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return ret(hipErrorOutOfMemory); }
    if (map_add(m, size, fd, 0) != 0) { munmap(m, size); close(fd); return ret(hipErrorOutOfMemory); }
    *p = m;
    return hipSuccess;
}

hipError_t hipMalloc(void **p, size_t n) { return shared_alloc(p, n); }
hipError_t hipExtMallocWithFlags(void **p, size_t n, unsigned flags) { (void)flags; return shared_alloc(p, n); }
hipError_t hipFree(void *p) {
    struct mapping m;
    if (!p) return hipSuccess;
    if (map_take(p, 0, &m) != 0) return ret(hipErrorInvalidValue);
    munmap(m.p, m.n);
    close(m.fd);
    return hipSuccess;
}

/* hipIpcMemHandle_t: 64 opaque bytes; ours carry the exporting pid, its memfd number and the size. */
typedef struct { char reserved[64]; } hipIpcMemHandle_t;
struct ipc_payload { uint32_t magic; int32_t pid; int32_t fd; uint32_t pad; uint64_t size; };
#define IPC_MAGIC 0x414d444bu

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *p) {
    struct mapping m;
    if (!handle || map_find(p, &m) != 0) return ret(hipErrorInvalidValue);   /* a hipMalloc base only */
    struct ipc_payload pl = {IPC_MAGIC, (int32_t)getpid(), m.fd, 0, m.n};
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &pl, sizeof pl);
    return hipSuccess;
}
hipError_t hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t handle, unsigned flags) {
    struct ipc_payload pl;
    char path[64];
    (void)flags;
    memcpy(&pl, &handle, sizeof pl);
    if (!p || pl.magic != IPC_MAGIC) return ret(hipErrorInvalidValue);
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pl.pid, pl.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return ret(hipErrorInvalidValue);
    void *m = mmap(NULL, pl.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return ret(hipErrorOutOfMemory); }
    if (map_add(m, pl.size, fd, 1) != 0) { munmap(m, pl.size); close(fd); return ret(hipErrorOutOfMemory); }
    *p = m;
    return hipSuccess;
}
hipError_t hipIpcCloseMemHandle(void *p) {
    struct mapping m;
    if (map_take(p, 1, &m) != 0) return ret(hipErrorInvalidValue);
    munmap(m.p, m.n);
    close(m.fd);
    return hipSuccess;
}

/* Cross-process atomics for the emulator's system-scope accesses (called through ctypes). */
uint32_t emuAtomicRmw32(uint32_t *p, int op, uint32_t v, uint32_t cmp) {
    switch (op) {
    case 0: return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    case 1: return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
    case 2: { uint32_t e = cmp; __atomic_compare_exchange_n(p, &e, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); return e; }
    case 3: return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
    default: return __atomic_load_n(p, __ATOMIC_SEQ_CST);
    }
}

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
