/* runtime.cpp — owns the CPU emulation of the CUDA runtime calls llmi makes, and the block
 * scheduler that runs kernels (include/emu_block.h).  Device memory is host memory from malloc
 * (exact size, so ASan sees overruns; 0xff-filled, so a read of memory never written is NaN),
 * registered so that copies can check their direction; stream work is queued and runs at the
 * next synchronising call, so that a host that reads a result before synchronising, or
 * reuses a pinned buffer before its copy ran, sees what it would see on a GPU.  Graph
 * capture records the queued operations; a launch replays them.  Errors in how CUDA is used
 * print "EMU ERROR: ..." and make the process exit 97 (LLMI_EMU_ABORT=1: abort at once).
 * The GPU has LLMI_EMU_GPU_MIB of memory (default 4096); LLMI_EMU_NO_GPU=1 hides it. */
#include "cuda_runtime.h"
#include "cublasLt.h"
#include "cublas_v2.h"
#include "cusolverDn.h"
#include <stdarg.h>
#include <time.h>
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include <unistd.h>
#include <algorithm>
#include <climits>
#include <deque>
#include <memory>
#include <string>
#include <chrono>

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;
thread_local EmuBlock *emu_blk;
thread_local long emu_wseq, emu_bsync;
thread_local int emu_tid;
int emu_fill_byte = 0xff;
std::mutex emu_atomic_mu;
static std::atomic<int> emu_errors;
static std::mutex g_mu;   /* the runtime's state (one host thread at a time in practice) */

/* what ran, for LLMI_EMU_STATS=1 (a test can check that a path it means to cover ran);
 * LLMI_EMU_COUNT=TEXT also counts the launches of kernels whose name holds TEXT */
static std::atomic<long> n_launches, n_captures, n_graph_launches, n_counted;
static const char *const emu_count_text = getenv("LLMI_EMU_COUNT");
static void emu_print_stats() {
    fprintf(stderr, "EMU stats: %ld kernel launches, %ld graph captures, %ld graph launches\n", n_launches.load(),
            n_captures.load(), n_graph_launches.load());
    if (emu_count_text) fprintf(stderr, "EMU count: %ld launches of %s\n", n_counted.load(), emu_count_text);
}
static struct EmuStatsAtExit {
    EmuStatsAtExit() { if (getenv("LLMI_EMU_STATS")) atexit(emu_print_stats); }
} emu_stats_at_exit;
static void emu_report_exit() {
    if (emu_errors.load()) {
        fprintf(stderr, "EMU: %d emulator error(s)\n", emu_errors.load());
        fflush(stderr);
        _exit(97);
    }
}
void emu_error(const char *fmt, ...) {
    static std::once_flag once;
    std::call_once(once, [] { atexit(emu_report_exit); });
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "EMU ERROR: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    emu_errors++;
    if (getenv("LLMI_EMU_ABORT")) abort();
}

/* ---------------- memory registry ---------------- */
struct Alloc { size_t n; bool device; };
static std::map<uintptr_t, Alloc> g_allocs;
static size_t g_dev_bytes;
static size_t emu_total_bytes() {
    const char *e = getenv("LLMI_EMU_GPU_MIB");
    return (size_t)(e ? atol(e) : 4096) << 20;
}
/* 1 device, 2 pinned host, 0 other host memory; range must lie inside one allocation */
static int mem_kind(const void *p, size_t n, bool *whole) {
    std::lock_guard<std::mutex> g(g_mu);
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) { *whole = true; return 0; }
    --it;
    if (a >= it->first + it->second.n) { *whole = true; return 0; }
    *whole = a + n <= it->first + it->second.n;
    return it->second.device ? 1 : 2;
}
bool emu_dev_range(const void *p, size_t n) {
    bool w;
    return mem_kind(p, n, &w) == 1 && w;
}
/* NULL, or into (or just past) device or pinned memory: what a kernel may be given */
static bool gpu_addressable(const void *p) {
    bool w;
    return !p || mem_kind(p, 1, &w) || mem_kind((const char *)p - 1, 1, &w);
}
/* A kernel's pointer argument must be NULL or point into (or just past) device or pinned
 * memory: a pageable host pointer is an illegal address on the GPU. */
void emu_check_kernel_ptr(const char *kernel, int index, const void *p) {
    if (gpu_addressable(p)) return;
    emu_error("launch of %s: pointer argument %d (%p) is not device or pinned memory", kernel, index, p);
}
static const char *kind_name(int k) { return k == 1 ? "device" : k == 2 ? "pinned host" : "pageable host"; }

static thread_local cudaError_t t_last = cudaSuccess;
static cudaError_t set_err(cudaError_t e) { if (e != cudaSuccess) t_last = e; return e; }

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "emulated cuda error";
    }
}
extern "C" const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
extern "C" cudaError_t cudaGetLastError(void) { cudaError_t e = t_last; t_last = cudaSuccess; return e; }
extern "C" cudaError_t cudaPeekAtLastError(void) { return t_last; }
extern "C" cudaError_t cudaGetDeviceCount(int *n) {
    if (getenv("LLMI_EMU_NO_GPU")) { *n = 0; return set_err(cudaErrorNoDevice); }
    *n = 1; return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : set_err(cudaErrorInvalidDevice); }
extern "C" cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (d != 0) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "EMU H100 (CPU emulation)");
    p->totalGlobalMem = emu_total_bytes();
    p->sharedMemPerBlock = 48 << 10; p->sharedMemPerBlockOptin = 227 << 10;
    p->major = 9; p->minor = 0; p->multiProcessorCount = 132; p->warpSize = 32; p->maxThreadsPerBlock = 1024;
    p->l2CacheSize = 50 << 20;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDriverGetVersion(int *v) { *v = 12080; return cudaSuccess; }
extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { *v = 12080; return cudaSuccess; }
extern "C" cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    std::lock_guard<std::mutex> g(g_mu);
    *t = emu_total_bytes();
    *f = g_dev_bytes < *t ? *t - g_dev_bytes : 0;
    return cudaSuccess;
}
static cudaError_t emu_alloc(void **p, size_t n, bool device) {
    if (!p) return set_err(cudaErrorInvalidValue);
    {
        std::lock_guard<std::mutex> g(g_mu);
        if (device && g_dev_bytes + n > emu_total_bytes()) { *p = NULL; return set_err(cudaErrorMemoryAllocation); }
    }
    void *m = malloc(n ? n : 1);
    if (!m) { *p = NULL; return set_err(cudaErrorMemoryAllocation); }
    /* uninitialised device memory reads as NaN (0xff bytes) where cheap enough to fill */
    if (device && n <= ((size_t)256 << 20)) memset(m, emu_fill_byte, n);
    std::lock_guard<std::mutex> g(g_mu);
    g_allocs[(uintptr_t)m] = Alloc{n ? n : 1, device};
    if (device) g_dev_bytes += n;
    *p = m;
    return cudaSuccess;
}
static void flush_all();
static cudaError_t emu_release(void *p, bool device) {
    if (!p) return cudaSuccess;
    flush_all();   /* cudaFree synchronises */
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second.device != device) {
        emu_error("%s(%p): not a %s allocation", device ? "cudaFree" : "cudaFreeHost", p, device ? "device" : "pinned");
        return set_err(cudaErrorInvalidValue);
    }
    if (device) g_dev_bytes -= it->second.n == 1 ? 0 : it->second.n;
    g_allocs.erase(it);
    free(p);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMalloc(void **p, size_t n) { return emu_alloc(p, n, true); }
extern "C" cudaError_t cudaFree(void *p) { return emu_release(p, true); }
extern "C" cudaError_t cudaMallocHost(void **p, size_t n) { return emu_alloc(p, n, false); }
extern "C" cudaError_t cudaFreeHost(void *p) { return emu_release(p, false); }

/* ---------------- streams, queue, capture ---------------- */
/* Work queued on a stream.  `ordered`: the legacy stream or a blocking one, which CUDA orders
 * against each other; a cudaStreamNonBlocking stream is ordered only against itself. */
struct Op { cudaStream_t s; bool ordered; long seq; std::string what; std::function<void()> fn; };
struct CUgraph_st { std::vector<Op> ops; };
struct CUgraphExec_st { std::vector<Op> ops; };
struct CUstream_st { bool capturing = false; CUgraph_st *graph = nullptr; unsigned flags = 0; };
struct CUevent_st { double t = -1; bool timing = true; cudaStream_t s = nullptr; long seq = 0; };
static std::deque<Op> g_queue;
static long g_seq;
static thread_local bool t_flushing;
static std::vector<CUstream_st *> g_streams;
static const cudaStream_t ALL_STREAMS = (cudaStream_t)~(uintptr_t)0;
static bool is_ordered(cudaStream_t s) { return !s || !(s->flags & cudaStreamNonBlocking); }

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
/* Runs, in submission order, the queued work that `target` has to wait for up to its
 * operation number `upto`: its own, and for the legacy or a blocking stream everything on
 * those; ALL_STREAMS runs everything.  Other streams' work stays queued, as it may still be
 * running on a GPU: a host that reads its results now reads them stale. */
static void run_ops(cudaStream_t target, long upto) {
    if (t_flushing) return;
    t_flushing = true;
    const bool ordered = target != ALL_STREAMS && is_ordered(target);
    for (;;) {
        Op op;
        {
            std::lock_guard<std::mutex> g(g_mu);
            auto it = g_queue.begin();
            for (; it != g_queue.end() && it->seq <= upto; ++it)
                if (target == ALL_STREAMS || (ordered ? it->ordered : it->s == target)) break;
            if (it == g_queue.end() || it->seq > upto) break;
            op = std::move(*it);
            g_queue.erase(it);
        }
        op.fn();
    }
    t_flushing = false;
}
static void flush_all() { run_ops(ALL_STREAMS, LONG_MAX); }
static bool any_capturing() {
    for (auto *s : g_streams) if (s->capturing) return true;
    return false;
}
/* a call that waits for the legacy stream: illegal beside a capturing stream */
static cudaError_t capture_check(cudaStream_t s, const char *what) {
    if ((s && s->capturing) || (!s && any_capturing())) {
        emu_error("%s during stream capture", what);
        return set_err(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}
/* queues op on s (or records it into s's capture); returns its operation number */
long emu_enqueue(cudaStream_t s, const char *what, std::function<void()> op) {
    if (s && s->capturing) { s->graph->ops.push_back(Op{s, true, 0, what, std::move(op)}); return 0; }
    std::lock_guard<std::mutex> g(g_mu);
    g_queue.push_back(Op{s, is_ordered(s), ++g_seq, what, std::move(op)});
    return g_seq;
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new CUstream_st;
    (*s)->flags = flags;
    g_streams.push_back(*s);
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    run_ops(s, LONG_MAX);   /* (CUDA lets it finish later; its queue must not outlive it here) */
    for (size_t i = 0; i < g_streams.size(); i++) if (g_streams[i] == s) g_streams.erase(g_streams.begin() + (long)i);
    if (s && s->capturing) emu_error("cudaStreamDestroy on a capturing stream");
    delete s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cudaError_t e = capture_check(s, "cudaStreamSynchronize");
    if (!e) run_ops(s, LONG_MAX);
    return e;
}
extern "C" cudaError_t cudaDeviceSynchronize(void) {
    cudaError_t e = capture_check(NULL, "cudaDeviceSynchronize");
    if (!e) flush_all();
    return e;
}
extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode) {
    if (!s) return set_err(cudaErrorStreamCaptureUnsupported);
    if (s->capturing) return set_err(cudaErrorInvalidValue);
    s->capturing = true;
    s->graph = new CUgraph_st;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    /* the legacy stream is never captured here */
    *status = s && s->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    if (!s || !s->capturing) return set_err(cudaErrorInvalidValue);
    s->capturing = false;
    *g = s->graph;
    s->graph = nullptr;
    n_captures++;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = new CUgraphExec_st{g->ops};
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e) return set_err(cudaErrorInvalidValue);
    for (auto &op : e->ops) emu_enqueue(s, op.what.c_str(), op.fn);
    n_graph_launches++;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new CUevent_st; return cudaSuccess; }
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new CUevent_st;
    (*e)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) { flush_all(); delete e; return cudaSuccess; }
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    e->s = s;
    e->seq = emu_enqueue(s, "event", [e]() { e->t = now_ms(); });
    return cudaSuccess;
}
/* waits for the work before the event's last record on its stream, not for everything */
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e->seq) run_ops(e->s, e->seq);
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a->timing || !b->timing || a->t < 0 || b->t < 0) return set_err(cudaErrorInvalidResourceHandle);
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}

/* ---------------- copies ---------------- */
/* The kinds of memory a copy touches, checked against its direction; dn and sn bytes from
 * dst and src must each lie inside one allocation. */
static bool check_copy(void *dst, size_t dn, const void *src, size_t sn, enum cudaMemcpyKind k, const char *what,
                       int *dk_out, int *sk_out) {
    bool dw, sw;
    int dk = mem_kind(dst, dn, &dw), sk = mem_kind(src, sn, &sw);
    *dk_out = dk; *sk_out = sk;
    if (!dw || !sw) {
        emu_error("%s runs past the end of its %s allocation", what, !dw ? "destination" : "source");
        return false;
    }
    bool ok = true;
    switch (k) {
    case cudaMemcpyHostToDevice: ok = dk == 1 && sk != 1; break;
    case cudaMemcpyDeviceToHost: ok = dk != 1 && sk == 1; break;
    case cudaMemcpyDeviceToDevice: ok = dk == 1 && sk == 1; break;
    case cudaMemcpyHostToHost: ok = dk != 1 && sk != 1; break;
    default: break;
    }
    if (!ok) emu_error("%s kind %d but destination is %s memory and source %s memory", what, (int)k, kind_name(dk), kind_name(sk));
    return ok;
}
/* height rows of width bytes, dpitch and spitch apart (a plain copy: one row), queued on s.
 * From pageable memory the rows are staged now, so the caller may reuse its buffer at once;
 * into pageable memory the call returns when the copy is done.  dk, sk: the memory kinds. */
static cudaError_t copy_rows_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                                   enum cudaMemcpyKind k, cudaStream_t s, const char *what, int *dk, int *sk) {
    *dk = *sk = 0;
    if (width > dpitch || width > spitch) return set_err(cudaErrorInvalidValue);
    if (!width || !height) return cudaSuccess;
    const size_t dn = dpitch * (height - 1) + width, sn = spitch * (height - 1) + width;
    if (!check_copy(dst, dn, src, sn, k, what, dk, sk)) return set_err(cudaErrorInvalidValue);
    if (s && s->capturing && (*dk == 0 || *sk == 0)) {
        emu_error("%s with pageable host memory during stream capture", what);
        return set_err(cudaErrorStreamCaptureUnsupported);
    }
    std::shared_ptr<std::vector<unsigned char>> staged;
    if (*sk == 0 && *dk != 0)
        staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src, (const unsigned char *)src + sn);
    long q = emu_enqueue(s, what, [=]() {
        const unsigned char *from = staged ? staged->data() : (const unsigned char *)src;
        for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, from + r * spitch, width);
    });
    if (*dk == 0 && *sk != 0) run_ops(s, q);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t s) {
    int dk, sk;
    return copy_rows_async(dst, n, src, n, n, 1, k, s, "cudaMemcpyAsync", &dk, &sk);
}
/* On the legacy stream, returning as CUDA's "API synchronization behavior" says: a copy
 * from pageable memory to the device once the source is staged (the transfer may not have
 * finished), from pinned memory to the device or into host memory once done, device to
 * device at once. */
extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    cudaError_t e = capture_check(NULL, "cudaMemcpy");
    if (e) return e;
    int dk, sk;
    e = copy_rows_async(dst, n, src, n, n, 1, k, NULL, "cudaMemcpy", &dk, &sk);
    if (!e && (dk == 2 || sk == 2 || (dk == 0 && sk == 0))) run_ops(NULL, g_seq);
    return e;
}
extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                         size_t height, enum cudaMemcpyKind k, cudaStream_t s) {
    int dk, sk;
    return copy_rows_async(dst, dpitch, src, spitch, width, height, k, s, "cudaMemcpy2DAsync", &dk, &sk);
}
extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    bool w;
    int k = mem_kind(p, n, &w);
    if (n && (k != 1 || !w)) { emu_error("cudaMemset(Async) of %zu bytes on %s memory%s", n, kind_name(k), w ? "" : " past its end"); return set_err(cudaErrorInvalidValue); }
    emu_enqueue(s, "cudaMemsetAsync", [=]() { memset(p, v, n); });
    return cudaSuccess;
}
/* device memory: queued on the legacy stream, returning at once (asynchronous, as CUDA's
 * "API synchronization behavior" says of cudaMemset on device memory) */
extern "C" cudaError_t cudaMemset(void *p, int v, size_t n) {
    cudaError_t e = capture_check(NULL, "cudaMemset");
    return e ? e : cudaMemsetAsync(p, v, n, NULL);
}

/* ---------------- kernels ---------------- */
static std::map<const void *, int> g_max_dyn_smem;
extern "C" cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *fn) {
    if (!fn) return set_err(cudaErrorInvalidValue);
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_max_dyn_smem.find(fn);
    a->maxDynamicSharedSizeBytes = it == g_max_dyn_smem.end() ? 48 << 10 : it->second;
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    return cudaSuccess;
}
extern "C" cudaError_t cudaFuncSetAttribute(const void *fn, enum cudaFuncAttribute at, int v) {
    if (at != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > (227 << 10)) return set_err(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(g_mu);
    g_max_dyn_smem[fn] = v;
    return cudaSuccess;
}
int emu_launch_check(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem) {
    const unsigned long nt = (unsigned long)block.x * block.y * block.z;
    int limit;
    {
        std::lock_guard<std::mutex> g(g_mu);
        auto it = g_max_dyn_smem.find(fn);
        limit = it == g_max_dyn_smem.end() ? 48 << 10 : it->second;
    }
    if (!grid.x || !grid.y || !grid.z || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u || !nt || nt > 1024 ||
        block.z > 64) {
        emu_error("launch of %s: invalid configuration grid (%u,%u,%u) block (%u,%u,%u)", name, grid.x, grid.y, grid.z,
                  block.x, block.y, block.z);
        set_err(cudaErrorInvalidConfiguration);
        return 1;
    }
    if (smem > (size_t)limit) {
        emu_error("launch of %s: %zu bytes of dynamic shared memory, the kernel's limit is %d", name, smem, limit);
        set_err(cudaErrorInvalidValue);
        return 1;
    }
    if (nt % 32) emu_error("launch of %s: %lu threads a block, not whole warps (the emulator needs whole warps)", name, nt);
    n_launches++;
    if (emu_count_text && strstr(name, emu_count_text)) n_counted++;
    return 0;
}
void *emu_static_smem(int id, size_t bytes) {
    EmuBlock *b = emu_blk;
    auto it = b->statics.find(id);
    if (it != b->statics.end()) {
        if (it->second.second != bytes) emu_error("static shared variable %d: size %zu then %zu", id, it->second.second, bytes);
        return it->second.first;
    }
    void *p = malloc(bytes);
    memset(p, emu_fill_byte, bytes);
    b->statics[id] = {p, bytes};
    return p;
}
/* ---- fibers ----
 * A block's threads are fibers with 1 MiB stacks (mmap'd once, reused), run by emu_run_blocks
 * on the launching host thread.  ASan is not told of the stack switches (its fiber
 * annotations halve the emulation's speed): run without detect_stack_use_after_return. */
/* x86-64 SysV context switch: callee-saved registers on the old stack, then the new stack */
extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(".text\n.globl emu_switch\n.type emu_switch,@function\nemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_switch, .-emu_switch\n");
struct EmuFiber {
    void *sp = nullptr;
    void *stack = nullptr;
    size_t stack_bytes = 0;
    int tid = 0;
    uint3 tidx;
    long wseq = 0, bsync = 0;
    bool done = false, blocked = false;
};
thread_local EmuFiber *emu_cur;
static thread_local void *t_sched_sp;
static thread_local std::vector<EmuFiber> *t_fibers;
static thread_local std::vector<int> *t_runq;
static thread_local const std::function<void()> *t_body;
static const size_t FIBER_STACK = (size_t)1 << 20;

/* (not a local: a local whose address is taken gets ASan redzones, and an exiting fiber's
 * frame never returns to clear them before the stack is reused) */
static thread_local void *t_dead_sp;
static void fiber_to_sched(EmuFiber *f, bool exiting) {
    f->wseq = emu_wseq; f->bsync = emu_bsync;
    emu_switch(exiting ? &t_dead_sp : &f->sp, t_sched_sp);
}
/* Threads run in thread order between barriers, so a thread that reads what a lower thread
 * writes without a barrier between sees the new value, as a race would show on a GPU;
 * LLMI_EMU_ORDER=reverse runs them (and a launch's blocks) last to first, which shows the
 * other direction. */
static bool emu_reverse() {
    static const bool r = getenv("LLMI_EMU_ORDER") && !strcmp(getenv("LLMI_EMU_ORDER"), "reverse");
    return r;
}
bool emu_cp_async_at_issue() { return emu_reverse(); }
void emu_barrier_wait(EmuBarrier &b) {
    EmuFiber *f = emu_cur;
    if (++b.arrived == b.needed) {
        b.arrived = 0;
        if (emu_reverse()) std::reverse(b.waiters.begin(), b.waiters.end());
        for (int w : b.waiters) { (*t_fibers)[w].blocked = false; t_runq->push_back(w); }
        b.waiters.clear();
        return;
    }
    b.waiters.push_back(f->tid);
    f->blocked = true;
    fiber_to_sched(f, false);
}
static void __attribute__((noreturn, used)) fiber_entry() {
    EmuFiber *f = emu_cur;
    (*t_body)();
    f->done = true;
    fiber_to_sched(f, true);
    __builtin_unreachable();
}
void emu_run_blocks(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    const int nt = (int)(block.x * block.y * block.z);
    const long nb = (long)grid.x * grid.y * grid.z;
    static thread_local std::vector<EmuFiber> pool;
    if ((int)pool.size() < nt) pool.resize(nt);
    for (int i = 0; i < nt; i++)
        if (!pool[i].stack) {
            void *st = mmap(nullptr, FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (st == MAP_FAILED) { emu_error("%s: no memory for a fiber stack", name); return; }
            pool[i].stack = st;
            pool[i].stack_bytes = FIBER_STACK;
        }
    EmuBlock B(nt);
    B.smem_bytes = smem;
    /* exact size (ASan sees an overrun), aligned as the largest __align__ kernels/ asks */
    void *sm = nullptr;
    if (posix_memalign(&sm, 128, smem ? smem : 1)) { emu_error("%s: no host memory for %zu bytes of shared memory", name, smem); return; }
    B.smem = (unsigned char *)sm;
    B.warps = new EmuWarp[(nt + 31) / 32];
    for (int w = 0; w < (nt + 31) / 32; w++) B.warps[w].bar.needed = 32;
    std::vector<int> runq;
    t_fibers = &pool; t_runq = &runq; t_body = &body;
    blockDim = block; gridDim = grid;
    emu_blk = &B;
    /* blocks one after another, in reverse too: a block that depends on another of the same
     * launch having run (or not yet) shows in one of the two orders */
    for (long i = 0; i < nb; i++) {
        const long b = emu_reverse() ? nb - 1 - i : i;
        blockIdx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / grid.x / grid.y)};
        memset(B.smem, emu_fill_byte, smem);
        runq.clear();
        for (int t = 0; t < nt; t++) {
            EmuFiber &f = pool[t];
            f.tid = t; f.wseq = 0; f.bsync = 0; f.done = false; f.blocked = false;
            f.tidx = uint3{(unsigned)(t % block.x), (unsigned)(t / block.x % block.y), (unsigned)(t / (block.x * block.y))};
            uintptr_t top = ((uintptr_t)f.stack + f.stack_bytes) & ~(uintptr_t)15;
            void **sp = (void **)top;
            *--sp = nullptr;                   /* fiber_entry's return address: it never returns */
            *--sp = (void *)fiber_entry;       /* emu_switch's ret */
            for (int r = 0; r < 6; r++) *--sp = nullptr;
            f.sp = sp;
            runq.push_back(t);
        }
        if (emu_reverse()) std::reverse(runq.begin(), runq.end());
        size_t head = 0;
        while (head < runq.size()) {
            EmuFiber &f = pool[runq[head++]];
            if (f.done || f.blocked) continue;
            emu_cur = &f; emu_tid = f.tid; threadIdx = f.tidx; emu_wseq = f.wseq; emu_bsync = f.bsync;
            emu_switch(&t_sched_sp, f.sp);
            if (head > 4096 && head * 2 > runq.size()) { runq.erase(runq.begin(), runq.begin() + (long)head); head = 0; }
        }
        int n_done = 0, at_block = (int)B.bar.waiters.size();
        for (int t = 0; t < nt; t++) n_done += pool[t].done;
        if (n_done != nt) {
#if defined(__SANITIZE_ADDRESS__)
            /* the stuck fibers' frames never return: clear their redzones for the next launch */
            for (int t = 0; t < nt; t++) __asan_unpoison_memory_region(pool[t].stack, pool[t].stack_bytes);
#endif
            emu_error("%s block %ld: deadlock: %d of %d threads finished, %d wait at __syncthreads, %d at warp operations",
                      name, b, n_done, nt, at_block, nt - n_done - at_block);
            break;
        }
        for (int t = 1; t < nt; t++)
            if (pool[t].bsync != pool[0].bsync) { emu_error("%s block %ld: thread %d ran %ld __syncthreads, thread 0 %ld", name, b, t, pool[t].bsync, pool[0].bsync); break; }
        for (int t = 0; t < nt; t++)
            if (pool[t].wseq != pool[t & ~31].wseq) { emu_error("%s block %ld: lane %d ran %ld warp ops, its lane 0 %ld", name, b, t, pool[t].wseq, pool[t & ~31].wseq); break; }
        for (int t = 0; t < nt; t++)
            if (!B.cp_pending[t].empty()) {
                emu_error("%s block %ld: thread %d ended with %zu cp.async copies never waited for", name, b, t,
                          B.cp_pending[t].size());
                break;
            }
        for (auto &q : B.cp_pending) q.clear();
        for (auto &g : B.cp_groups) g = 0;
        for (auto &kv : B.statics) free(kv.second.first);
        B.statics.clear();
    }
    for (auto &kv : B.statics) free(kv.second.first);
    delete[] B.warps;
    free(B.smem);
    emu_cur = nullptr;
}
