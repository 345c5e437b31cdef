/* emu_block.h — owns block and warp emulation and the kernel launch.  A block's CUDA threads
 * are fibers (own stacks, switched by runtime.cpp's emu_switch) on the host thread that runs
 * the launch, in thread order; __syncthreads and every warp operation are barriers that park
 * a fiber until its block or warp has arrived.  Warp operations check that all 32 lanes are
 * at the same operation (a divergent shuffle is an error, not a hang); a barrier that some
 * threads never reach is reported as a deadlock. */
#pragma once
void emu_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define EMU_FAIL(...) emu_error(__VA_ARGS__)

struct EmuBarrier { int needed = 0, arrived = 0; std::vector<int> waiters; };
void emu_barrier_wait(EmuBarrier &b);
struct EmuFiber;
extern thread_local EmuFiber *emu_cur;
/* A warp operation's deposits alternate between two banks (by the lanes' operation count),
 * so one barrier suffices: a lane can write the next operation's bank before the others
 * have read this one's, but not the bank after, since that needs everyone at the next. */
struct EmuWarp {
    EmuBarrier bar;
    uint64_t slot[2][32];
    long seq[2][32];
    int kind[2][32], arg[2][32];
    uint32_t ra[32][4], rb[32][2];
    const void *addr[32];
    float A[16][16], B[16][8];
};
/* a cp.async copy not landed yet: its 16 bytes, read when it was issued, and its group
 * (the thread's commit count that closed it; -1 while open) */
struct EmuCopy { unsigned char *dst; unsigned char data[16]; long group; };
struct EmuBlock {
    EmuBarrier bar;
    unsigned char *smem;
    size_t smem_bytes;
    EmuWarp *warps;
    std::map<int, std::pair<void *, size_t>> statics;   /* static __shared__ variables by declaration */
    std::vector<std::vector<EmuCopy>> cp_pending;        /* (threads) each thread's cp.async copies in flight */
    std::vector<long> cp_groups;                         /* (threads) each thread's groups committed */
    explicit EmuBlock(int n) : cp_pending((size_t)n), cp_groups((size_t)n) { bar.needed = n; }
};
extern thread_local EmuBlock *emu_blk;
extern thread_local long emu_wseq, emu_bsync;
extern thread_local int emu_tid;
extern int emu_fill_byte;

static inline void *emu_dyn_smem() { return emu_blk->smem; }
void *emu_static_smem(int id, size_t bytes);
static inline void __syncthreads() {
    emu_bsync++;
    emu_barrier_wait(emu_blk->bar);
}
static inline int emu_lane() { return emu_tid & 31; }
static inline EmuWarp &emu_warp() { return emu_blk->warps[emu_tid >> 5]; }
/* the bank this lane's next warp operation deposits into */
static inline int emu_bank() { return (int)((emu_wseq + 1) & 1); }
/* deposits this lane's operation, waits for the warp, and (lane 0) checks every lane is at
 * the same operation; returns the bank */
static inline int emu_warp_enter(EmuWarp &W, int kind, int arg, const char *what) {
    int lane = emu_lane(), b = (int)(++emu_wseq & 1);
    W.seq[b][lane] = emu_wseq; W.kind[b][lane] = kind; W.arg[b][lane] = arg;
    emu_barrier_wait(W.bar);
    if (lane == 0)
        for (int l = 1; l < 32; l++)
            if (W.seq[b][l] != W.seq[b][0] || W.kind[b][l] != W.kind[b][0] || W.arg[b][l] != W.arg[b][0]) {
                EMU_FAIL("%s: block (%u,%u,%u) warp %d lanes disagree: lane 0 op #%ld kind %d arg %d, lane %d op #%ld kind %d arg %d",
                         what, blockIdx.x, blockIdx.y, blockIdx.z, emu_tid >> 5, W.seq[b][0], W.kind[b][0], W.arg[b][0],
                         l, W.seq[b][l], W.kind[b][l], W.arg[b][l]);
                break;
            }
    return b;
}
static inline void emu_warp_bar(EmuWarp &W) { emu_barrier_wait(W.bar); }
static inline void emu_full_mask(unsigned mask, const char *what) {
    if (mask != 0xffffffffu) EMU_FAIL("%s: mask %#x (the emulator models full warps only)", what, mask);
}
template <class T> static inline T emu_shfl(T v, int kind, int arg, int src_fn(int, int), const char *what) {
    static_assert(sizeof(T) <= 8, "");
    EmuWarp &W = emu_warp();
    int lane = emu_lane();
    uint64_t x = 0; memcpy(&x, &v, sizeof v);
    W.slot[emu_bank()][lane] = x;
    int b = emu_warp_enter(W, kind, arg, what);
    uint64_t y = W.slot[b][src_fn(lane, arg)];
    T r; memcpy(&r, &y, sizeof r);
    return r;
}
static inline int emu_src_xor(int lane, int o) { return (lane ^ o) & 31; }
static inline int emu_src_up(int lane, int o) { return lane - o >= 0 ? lane - o : lane; }
static inline int emu_src_down(int lane, int o) { return lane + o < 32 ? lane + o : lane; }
static inline int emu_src_idx(int, int o) { return o & 31; }
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int o, int width = 32) {
    emu_full_mask(mask, "__shfl_xor_sync");
    if (width != 32) EMU_FAIL("__shfl_xor_sync width %d", width);
    return emu_shfl(v, 1, o, emu_src_xor, "__shfl_xor_sync");
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned o, int width = 32) {
    emu_full_mask(mask, "__shfl_up_sync");
    if (width != 32) EMU_FAIL("__shfl_up_sync width %d", width);
    return emu_shfl(v, 5, (int)o, emu_src_up, "__shfl_up_sync");
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned o, int width = 32) {
    emu_full_mask(mask, "__shfl_down_sync");
    if (width != 32) EMU_FAIL("__shfl_down_sync width %d", width);
    return emu_shfl(v, 6, (int)o, emu_src_down, "__shfl_down_sync");
}
/* the source lane may differ per lane: exchange, then each reads its own source */
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    emu_full_mask(mask, "__shfl_sync");
    if (width != 32) EMU_FAIL("__shfl_sync width %d", width);
    EmuWarp &W = emu_warp();
    int lane = emu_lane();
    uint64_t x = 0; memcpy(&x, &v, sizeof v);
    W.slot[emu_bank()][lane] = x;
    int b = emu_warp_enter(W, 7, 0, "__shfl_sync");
    uint64_t y = W.slot[b][src & 31];
    T r; memcpy(&r, &y, sizeof r);
    return r;
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu_full_mask(mask, "__ballot_sync");
    EmuWarp &W = emu_warp();
    int lane = emu_lane();
    W.slot[emu_bank()][lane] = pred != 0;
    int b = emu_warp_enter(W, 8, 0, "__ballot_sync");
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= (unsigned)(W.slot[b][l] & 1) << l;
    return r;
}
static inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, p) == 0xffffffffu; }
static inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_full_mask(mask, "__syncwarp");
    EmuWarp &W = emu_warp();
    emu_warp_enter(W, 2, 0, "__syncwarp");
}
/* atomics: one lock for all (slow, exact) */
extern std::mutex emu_atomic_mu;
template <class T, class U> static inline T atomicAdd(T *p, U v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    T old = *p; *p = (T)(old + (T)v); return old;
}
template <class T> static inline T atomicMax(T *p, T v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    T old = *p; if (v > old) *p = v; return old;
}
template <class T> static inline T atomicExch(T *p, T v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    T old = *p; *p = v; return old;
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
    std::lock_guard<std::mutex> g(emu_atomic_mu);
    T old = *p; if (old == cmp) *p = v; return old;
}

/* ---- tensor-core emulation (PTX ISA fragment layouts) ---- */
static inline float emu_h16(const char *ty, uint16_t h) {
    return ty[0] == 'b' ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c (c = d) */
static inline void emu_mma_m16n8k16(const char *ty, float d[4], const uint32_t a[4], const uint32_t b[2]) {
    EmuWarp &W = emu_warp();
    const int lane = emu_lane(), gid = lane >> 2, tig = lane & 3;
    for (int i = 0; i < 4; i++) W.ra[lane][i] = a[i];
    for (int i = 0; i < 2; i++) W.rb[lane][i] = b[i];
    emu_warp_enter(W, 3, ty[0], "mma");
    if (lane == 0) {
        for (int l = 0; l < 32; l++) {
            int g = l >> 2, t = l & 3;
            for (int i = 0; i < 8; i++) {
                int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
                int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
                W.A[row][col] = emu_h16(ty, (uint16_t)(W.ra[l][i / 2] >> (16 * (i & 1))));
            }
            for (int i = 0; i < 4; i++) {
                int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = g;
                W.B[row][col] = emu_h16(ty, (uint16_t)(W.rb[l][i / 2] >> (16 * (i & 1))));
            }
        }
    }
    emu_warp_bar(W);
    float out[4];
    for (int i = 0; i < 4; i++) {
        int row = i < 2 ? gid : gid + 8, col = tig * 2 + (i & 1);
        double s = d[i];
        for (int k = 0; k < 16; k++) s += (double)W.A[row][k] * (double)W.B[k][col];
        out[i] = (float)s;
    }
    emu_warp_bar(W);
    for (int i = 0; i < 4; i++) d[i] = out[i];
}
/* ldmatrix.sync.aligned.m8n8.{x2,x4}{.trans}.shared.b16: lanes 8m .. 8m + 7 name the rows of
 * matrix m (N matrices; the other lanes' addresses are not read), and r[m] of a lane is row
 * lane / 4, columns 2 (lane % 4) and + 1 of matrix m, or with .trans column lane / 4, rows
 * 2 (lane % 4) and + 1 (PTX ISA, "ldmatrix"). */
template <int N, bool TRANS>
static inline void emu_ldsm(uint32_t r[N], const void *row, int kind, const char *what) {
    EmuWarp &W = emu_warp();
    const int lane = emu_lane();
    W.addr[lane] = row;
    emu_warp_enter(W, kind, 0, what);
    if (lane < 8 * N) {
        const unsigned char *p = (const unsigned char *)row, *s0 = emu_blk->smem;
        if (((uintptr_t)p & 15) || p < s0 || p + 16 > s0 + emu_blk->smem_bytes)
            EMU_FAIL("%s: lane %d row address off %td misaligned or outside shared (%zu bytes)", what, lane, p - s0,
                     emu_blk->smem_bytes);
    }
    uint32_t out[N];
    const int gid = lane >> 2, tig = lane & 3;
    for (int m = 0; m < N; m++) {
        uint16_t e[2];
        for (int j = 0; j < 2; j++)
            e[j] = TRANS ? ((const uint16_t *)W.addr[8 * m + 2 * tig + j])[gid]
                         : ((const uint16_t *)W.addr[8 * m + gid])[2 * tig + j];
        out[m] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
    }
    emu_warp_bar(W);
    for (int m = 0; m < N; m++) r[m] = out[m];
}
static inline void emu_ldsm_x2_trans(uint32_t r[2], const void *row) { emu_ldsm<2, true>(r, row, 4, "ldmatrix"); }
static inline void emu_ldsm_x4_trans(uint32_t r[4], const void *row) { emu_ldsm<4, true>(r, row, 10, "ldmatrix.x4.trans"); }
static inline void emu_ldsm_x4(uint32_t r[4], const void *row) { emu_ldsm<4, false>(r, row, 9, "ldmatrix.x4"); }
static inline unsigned __cvta_generic_to_shared(const void *) { return 0; }

/* cp.async.cg.shared.global [dst], [src], 16, cp.async.commit_group, cp.async.wait_group N
 * and cp.async.wait_all (commit, then wait for every group).  A copy lands in shared memory
 * when its thread waits for its group (a read of the tile before that sees what was there),
 * or, with LLMI_EMU_ORDER=reverse, as it is issued (a copy into a buffer other warps may
 * still be reading, without a barrier between, shows in the reading warps' results). */
bool emu_cp_async_at_issue();
static inline void emu_cp_async16(void *dst, const void *src) {
    unsigned char *d = (unsigned char *)dst, *s0 = emu_blk->smem;
    if (((uintptr_t)d & 15) || ((uintptr_t)src & 15) || d < s0 || d + 16 > s0 + emu_blk->smem_bytes)
        EMU_FAIL("cp.async: thread %d: destination off %td (of %zu bytes of shared memory) or source %p not 16-byte "
                 "aligned and inside", emu_tid, d - s0, emu_blk->smem_bytes, src);
    EmuCopy c;
    c.dst = d;
    c.group = -1;
    memcpy(c.data, src, 16);
    if (emu_cp_async_at_issue()) memcpy(d, c.data, 16);
    else emu_blk->cp_pending[emu_tid].push_back(c);
}
static inline void emu_cp_async_commit() {
    long g = ++emu_blk->cp_groups[emu_tid];
    for (EmuCopy &c : emu_blk->cp_pending[emu_tid])
        if (c.group < 0) c.group = g;
}
/* lands every copy of the groups before the n most recent (open copies stay) */
static inline void emu_cp_async_wait_group(int n) {
    std::vector<EmuCopy> &q = emu_blk->cp_pending[emu_tid], keep;
    const long last = emu_blk->cp_groups[emu_tid] - n;
    for (const EmuCopy &c : q)
        if (c.group >= 0 && c.group <= last) memcpy(c.dst, c.data, 16);
        else keep.push_back(c);
    q.swap(keep);
}
static inline void emu_cp_async_wait_all() {
    emu_cp_async_commit();
    emu_cp_async_wait_group(0);
}

/* ---- launch ---- */
void emu_run_blocks(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* checks the configuration (sets the last error as CUDA would), then queues the launch on s */
int emu_launch_check(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem);
long emu_enqueue(cudaStream_t s, const char *what, std::function<void()> op);
void emu_check_kernel_ptr(const char *kernel, int index, const void *p);
/* pointer arguments are checked; structs of pointers (llmi_cuda_attn, ...) are not: their
 * padding holds stale bytes that can read as a host address */
template <class T> static inline void emu_check_arg(const char *kernel, int index, const T &v) {
    if constexpr (std::is_pointer_v<T>) emu_check_kernel_ptr(kernel, index, (const void *)v);
}
template <class... P, class... A>
void emu_launch_named(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args) {
    if (emu_launch_check((const void *)kernel, name, grid, block, smem)) return;
    /* arguments converted to the parameter types now and copied, as the launch does */
    std::tuple<std::decay_t<P>...> t{std::forward<A>(args)...};
    std::apply([&](const auto &...v) {
        int i = 0;
        (emu_check_arg(name, i++, v), ...);
    }, t);
    emu_enqueue(s, name, [=]() {
        emu_run_blocks(name, grid, block, smem, [&]() { std::apply(kernel, t); });
    });
}
#define emu_launch(k, ...) emu_launch_named(#k, k, __VA_ARGS__)
