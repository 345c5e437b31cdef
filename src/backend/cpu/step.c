/* cpu/step.c — owns the fused small-batch forward (decode steps): the whole forward of a
 * batch of at most CPU_STEP_MAX_TOKENS tokens in ONE parallel region, where each thread
 * owns fixed row slices of every projection and the threads meet only where the data
 * really crosses between them.
 *
 * Per layer there are five barriers, one per all-to-all dependency:
 *   1. q/k/v rows -> attention (a head's q, and its kv head's K/V, come from other threads' rows);
 *   2. attention heads -> o_proj (o_proj reads every head);
 *   3. o_proj rows -> ffn norm (the norm reads the whole residual row);
 *   4. silu(gate)*up rows -> down_proj (down reads every ffn element);
 *   5. down_proj rows -> the next layer's attn norm.
 * Everything between them is fused per thread without waiting: the residual add, RMSNorm
 * and activation quantization are done redundantly by every thread on its own copy (a few
 * thousand floats, cheaper than a barrier); the thread that owns a kv head's K and V rows
 * also ropes them and writes them to the cache; the thread that owns an attention head
 * ropes its q; the thread that owns gate/up rows applies SwiGLU to them.  After the last
 * layer each thread norms the logit rows itself and computes its slice of the lm_head.
 * So a token costs 5 * n_layers barriers and one fork/join, where the op-by-op forward
 * (run_layers) forks and joins the team for every matmul (4 * n_layers + 1 times) and
 * leaves the norms, RoPE, short attention and SwiGLU to one thread while the others wait.
 *
 * A mixture-of-experts layer keeps the same five barriers: every thread computes the router
 * logits of all tokens and routes them itself (the same numbers in each: a few thousand
 * multiply-adds), then, expert by expert in ascending order, gathers the rows of the tokens
 * routed to it and computes its slice of that expert's gate/up rows (4) and down rows (5);
 * the down slice is the thread's own columns of the output, so it also sums each token's
 * weighted expert outputs there without waiting.
 *
 * The numbers are exactly run_layers': every row, token and head is computed by the same
 * function in the same order; only which thread computes it changes.  The barrier spins
 * briefly, then sleeps on a futex, and does not spin at all while the machine is
 * oversubscribed (step_pick_spin). */
#include <limits.h>
#include <math.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/ops.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define STEP_PAUSE() _mm_pause()
#else
#define STEP_PAUSE() ((void)0)
#endif

/* How long a waiting thread spins before it sleeps on the futex while the machine has
 * CPUs to spare: longer than a phase's usual imbalance between two running threads (a
 * futex sleep and wake-up would cost more, 150 times a token), far shorter than a time
 * slice. */
#define STEP_SPIN_NS 50000
/* How often the load average is read again. */
#define STEP_LOAD_CHECK_NS 500000000

typedef struct step_barrier {
    _Atomic unsigned arrived;
    _Atomic unsigned gen;       /* futex word: bumped when the last thread arrives */
    _Atomic int sleepers;       /* threads asleep (or about to be) on gen */
} step_barrier;

typedef struct step_thread {
    float *x;                   /* (max_tokens, dim) residual stream: the same in every thread */
    float *xn;                  /* (max_tokens, dim) normed rows that feed the next matmuls */
    void *qs;                   /* cpu_matmul_scratch_bytes(max_tokens, widest input): quantized activations */
    cpu_qact qa;
    int layout;                 /* cpu_qact_layout qa holds, or -2 when qa is stale */
    /* mixture of experts (NULL for a dense model), k = n_experts_used: this thread's copy of
     * the routing, the same in every thread */
    float *moe_logits;          /* (max_tokens, n_experts) */
    int32_t *moe_sel;           /* (max_tokens, k) each token's experts, ascending */
    float *moe_wt;              /* (max_tokens, k) their weights */
    int32_t *moe_start;         /* (n_experts + 1) expert e's (token, expert) pairs [start[e], start[e + 1]) */
    int32_t *moe_tok;           /* (max_tokens * k) the token of each pair, grouped by expert */
    int32_t *moe_row;           /* (max_tokens * k) the grouped row of each (token, j) */
    float *moe_x;               /* (max_tokens, dim) one expert's tokens' normed rows, gathered */
} step_thread;

struct cpu_step {
    int n_threads, max_tokens;
    int64_t spin_ns;            /* the barrier's spin before sleeping: STEP_SPIN_NS or 0 (busy machine) */
    int64_t load_checked_ns;    /* when the load average was last read */
    step_barrier bar;
    step_thread *th;            /* (n_threads) */
    float *moe_gate, *moe_up;   /* (max_tokens * k, ffn_dim) each pair's gate and up rows; gate then
                                   holds the activation (MoE only) */
    float *moe_y;               /* (max_tokens * k, dim) each pair's expert output (MoE only) */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spinning pays while every thread has a CPU of its own (a partner arrives within
 * microseconds) and hurts on an oversubscribed machine: there a partner has often been
 * preempted, the spinner burns CPU time that counts against this process's fair share,
 * and each token then costs more CPU.  So the team spins only while the 1-minute load
 * average (this process's own running threads included) stays below the CPUs it may use
 * plus one half; otherwise a waiting thread sleeps at once (OpenMP's passive policy). */
static void step_pick_spin(cpu_step *s) {
    int64_t now = now_ns();
    if (s->load_checked_ns && now - s->load_checked_ns < STEP_LOAD_CHECK_NS) return;
    s->load_checked_ns = now;
    double load[1];
    bool busy = getloadavg(load, 1) == 1 && load[0] > omp_get_num_procs() + 0.5;
    s->spin_ns = busy ? 0 : STEP_SPIN_NS;
}

/* Waits until all T threads have arrived.  Writes before the call are visible to every
 * thread after it (acq_rel arrival, release of the generation). */
static void bar_wait(step_barrier *b, int T, int64_t spin_ns) {
    if (T == 1) return;
    unsigned g = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == (unsigned)T - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->gen, g + 1, memory_order_seq_cst);
        if (atomic_load_explicit(&b->sleepers, memory_order_seq_cst) > 0)
            syscall(SYS_futex, (void *)&b->gen, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    if (spin_ns > 0) {
        int64_t until = now_ns() + spin_ns;
        do {
            for (int i = 0; i < 16; i++) {
                if (atomic_load_explicit(&b->gen, memory_order_acquire) != g) return;
                STEP_PAUSE();
            }
        } while (now_ns() < until);
    }
    atomic_fetch_add_explicit(&b->sleepers, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&b->gen, memory_order_seq_cst) == g)
        syscall(SYS_futex, (void *)&b->gen, FUTEX_WAIT_PRIVATE, g, NULL, NULL, 0);
    atomic_fetch_sub_explicit(&b->sleepers, 1, memory_order_relaxed);
}

static int64_t widest_input(const llmi_config *c) {
    int64_t w = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    return (int64_t)c->n_heads * c->head_dim > w ? (int64_t)c->n_heads * c->head_dim : w;
}

void cpu_step_destroy(cpu_step *s) {
    if (!s) return;
    for (int i = 0; s->th && i < s->n_threads; i++) {
        step_thread *t = &s->th[i];
        free(t->x); free(t->xn); free(t->qs);
        free(t->moe_logits); free(t->moe_sel); free(t->moe_wt); free(t->moe_start); free(t->moe_tok); free(t->moe_row);
        free(t->moe_x);
    }
    free(s->th);
    free(s->moe_gate); free(s->moe_up); free(s->moe_y);
    free(s);
}

static void *alloc64(size_t bytes, size_t *total) {
    bytes = (bytes + 63) / 64 * 64;
    *total += bytes;
    return aligned_alloc(64, bytes);
}

cpu_step *cpu_step_create(const llmi_config *c, int n_threads, int max_tokens, size_t *bytes) {
    cpu_step *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_threads = n_threads;
    s->max_tokens = max_tokens;
    s->th = calloc((size_t)n_threads, sizeof *s->th);
    if (!s->th) { free(s); return NULL; }
    size_t rows = (size_t)max_tokens * c->dim * sizeof(float), q = cpu_matmul_scratch_bytes(max_tokens, widest_input(c));
    for (int i = 0; i < n_threads; i++) {
        step_thread *t = &s->th[i];
        t->x = alloc64(rows, bytes);
        t->xn = alloc64(rows, bytes);
        t->qs = alloc64(q, bytes);
        if (!t->x || !t->xn || !t->qs) { cpu_step_destroy(s); return NULL; }
        if (c->n_experts > 0) {
            const size_t tk = (size_t)max_tokens * c->n_experts_used;
            t->moe_logits = alloc64((size_t)max_tokens * c->n_experts * sizeof(float), bytes);
            t->moe_sel = alloc64(tk * sizeof(int32_t), bytes);
            t->moe_wt = alloc64(tk * sizeof(float), bytes);
            t->moe_start = alloc64(((size_t)c->n_experts + 1) * sizeof(int32_t), bytes);
            t->moe_tok = alloc64(tk * sizeof(int32_t), bytes);
            t->moe_row = alloc64(tk * sizeof(int32_t), bytes);
            t->moe_x = alloc64(rows, bytes);
            if (!t->moe_logits || !t->moe_sel || !t->moe_wt || !t->moe_start || !t->moe_tok || !t->moe_row || !t->moe_x) {
                cpu_step_destroy(s);
                return NULL;
            }
        }
    }
    if (c->n_experts > 0) {
        const size_t tk = (size_t)max_tokens * c->n_experts_used;
        s->moe_gate = alloc64(tk * c->ffn_dim * sizeof(float), bytes);
        s->moe_up = alloc64(tk * c->ffn_dim * sizeof(float), bytes);
        s->moe_y = alloc64(tk * c->dim * sizeof(float), bytes);
        if (!s->moe_gate || !s->moe_up || !s->moe_y) { cpu_step_destroy(s); return NULL; }
    }
    return s;
}

bool cpu_step_supports(const llmi_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        const llmi_tensor *w[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->w_router};
        for (int i = 0; i < 8; i++)
            if ((i < 7 || m->cfg.n_experts > 0) && !cpu_matmul_rows_ok(w[i]->dtype)) return false;
    }
    return cpu_matmul_rows_ok(m->lm_head.dtype);
}

/* [lo, hi) of total split over T threads in units of align (64-byte lines of fp32 rows,
 * so two threads never write one cache line). */
static void split(int64_t total, int id, int T, int64_t align, int64_t *lo, int64_t *hi) {
    int64_t units = (total + align - 1) / align, a = units * id / T * align, e = units * (id + 1) / T * align;
    *lo = a < total ? a : total;
    *hi = e < total ? e : total;
}

/* Rows [r0, r1) of y = x (n, w->cols) @ W^T (+ bias), quantizing x into the thread's
 * scratch unless it already holds x in w's layout (th->layout = -2 after x changes). */
static void mm(step_thread *th, const llmi_tensor *w, const float *x, int n, int64_t r0, int64_t r1,
               const float *bias, float *y) {
    int lay = cpu_qact_layout(w->dtype);
    if (lay >= 0 && th->layout != lay) {
        cpu_qact_init(&th->qa, th->qs, n, w->cols);
        cpu_qact_quantize(&th->qa, x, w->cols, 0, n);
        th->layout = lay;
    }
    if (r0 < r1) cpu_matmul_rows(w, x, &th->qa, n, r0, r1, bias, y);
}

typedef struct step_ctx {
    llmi_backend *b;
    const llmi_batch *bt;
    float *logits;              /* (n_logits, n_vocab) */
    int id, T;
} step_ctx;

/* Thread id's share of Q rows [*q0, *q1) when it also owns kv heads [kh0, kh1) (their K
 * and V rows): Q rows fill up each thread's total to an even share of all q/k/v rows. */
static void qkv_split(const llmi_config *c, int id, int T, int64_t *q0, int64_t *q1) {
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, all = qd + 2 * (int64_t)c->n_kv_heads * c->head_dim;
    int64_t start[2];
    for (int k = 0; k < 2; k++) {
        int64_t s = 0;
        for (int j = 0; j <= id + k && j < T; j++) {   /* monotone: the max over earlier threads */
            int64_t kh0, kh1, lo, hi;
            split(c->n_kv_heads, j, T, 1, &kh0, &kh1);
            split(all, j, T, 16, &lo, &hi);
            int64_t v = lo - kh0 * 2 * c->head_dim;
            v = v < 0 ? 0 : (v > qd ? qd : v);
            s = v > s ? v : s;
        }
        start[k] = id + k >= T ? qd : s;
    }
    *q0 = start[0];
    *q1 = start[1];
}

/* What one row of a sub-block's output adds to the residual: post_norm(delta) (Gemma 3's
 * sandwich norm, post_w; else delta as it is) times rs (Granite's residual scale) +
 * control (the layer's control vector, when the sub-block ends a layer that has one), in
 * run_layers' order (which norms, scales and adds to delta in place). */
static void sub_block_out_row(const float *delta, const float *post_w, float rs, const float *control, int dim,
                              float eps, float *out) {
    if (post_w) cpu_rmsnorm_row(delta, post_w, dim, eps, out);
    else memcpy(out, delta, (size_t)dim * sizeof *out);
    if (rs != 1.0f) cpu_scale(out, (size_t)dim, rs);
    if (control) cpu_add_bias(out, 1, dim, control);
}

/* The previous sub-block's output into the residual, x += sub_block_out_row(...), then
 * xn = norm(x) * w: one row. */
static void add_norm_row(float *x, const float *delta, const float *post_w, float rs, const float *control,
                         const float *w, int dim, float eps, float *xn) {
    if (!post_w && !control && rs == 1.0f) {
        cpu_add_rmsnorm_row(x, delta, w, dim, eps, xn);
        return;
    }
    sub_block_out_row(delta, post_w, rs, control, dim, eps, xn);
    cpu_add_rmsnorm_row(x, xn, w, dim, eps, xn);
}

/* Phases 4 and 5 of a MoE layer l (the norm done: th->xn), as run_layers' moe_mlp computes
 * them: this thread's gate/up rows [f0, f1) and down rows [o0, o1) of each chosen expert
 * on the gathered rows of its tokens, then each token's weighted sum over its experts in
 * ascending order in columns [o0, o1) of im->delta.  t0: the profile's clock (thread 0
 * when profiling), else NULL. */
static void step_moe(const step_ctx *cx, int l, int64_t f0, int64_t f1, int64_t o0, int64_t o1, double *t0) {
    llmi_backend *b = cx->b;
    cpu_impl *im = b->impl;
    cpu_step *s = im->step;
    const llmi_config *c = &b->model->cfg;
    step_thread *th = &s->th[cx->id];
    const int n = cx->bt->n_tokens, dim = c->dim, ffn = c->ffn_dim, E = c->n_experts, k = c->n_experts_used, T = cx->T;
    const llmi_tensor *router = im->lw[(size_t)l * CPU_W_PER_LAYER + CPU_W_ROUTER];
    const llmi_tensor *const *X = im->experts + (size_t)l * E * CPU_E_PER_EXPERT;
    th->layout = -2;
    mm(th, router, th->xn, n, 0, E, NULL, th->moe_logits);
    cpu_moe_route(th->moe_logits, n, E, k, c->moe_norm_topk, th->moe_sel, th->moe_wt);
    /* cpu_moe_route's choices are k distinct experts in range: the grouping cannot fail */
    llmi_status ignored = {0};
    (void)backend_moe_group(th->moe_sel, n, k, E, th->moe_start, th->moe_tok, th->moe_row, &ignored);
    const int32_t *start = th->moe_start;
    llmi_op_cost up_cost = mm_cost(router, n), down_cost = {0, 0};
    for (int e = 0; e < E; e++) {
        const int p0 = start[e], cnt = start[e + 1] - p0;
        if (cnt == 0) continue;
        const llmi_tensor *const *W = X + (size_t)e * CPU_E_PER_EXPERT;
        cpu_gather_rows(th->xn, dim, th->moe_tok + p0, cnt, th->moe_x);
        th->layout = -2;
        mm(th, W[CPU_E_GATE], th->moe_x, cnt, f0, f1, NULL, s->moe_gate + (size_t)p0 * ffn);
        mm(th, W[CPU_E_UP], th->moe_x, cnt, f0, f1, NULL, s->moe_up + (size_t)p0 * ffn);
        for (int i = p0; i < p0 + cnt; i++)
            cpu_glu_range(c->act, s->moe_gate + (size_t)i * ffn, s->moe_up + (size_t)i * ffn, (size_t)f0, (size_t)f1,
                          s->moe_gate + (size_t)i * ffn);
        up_cost = cost_sum(up_cost, cost_sum(mm_cost(W[CPU_E_GATE], cnt), mm_cost(W[CPU_E_UP], cnt)));
        down_cost = cost_sum(down_cost, mm_cost(W[CPU_E_DOWN], cnt));
    }
    bar_wait(&s->bar, T, s->spin_ns);
    if (t0) prof(b, LLMI_OP_MLP_UP, t0, up_cost);
    for (int e = 0; e < E; e++) {
        const int p0 = start[e], cnt = start[e + 1] - p0;
        if (cnt == 0) continue;
        th->layout = -2;
        mm(th, X[(size_t)e * CPU_E_PER_EXPERT + CPU_E_DOWN], s->moe_gate + (size_t)p0 * ffn, cnt, o0, o1, NULL,
           s->moe_y + (size_t)p0 * dim);
    }
    cpu_moe_combine(s->moe_y, th->moe_row, th->moe_wt, n, k, dim, o0, o1, im->delta);
    bar_wait(&s->bar, T, s->spin_ns);
    if (t0) prof(b, LLMI_OP_MLP_DOWN, t0, down_cost);
}

static void step_run(const step_ctx *cx) {
    llmi_backend *b = cx->b;
    cpu_impl *im = b->impl;
    cpu_step *s = im->step;
    const llmi_batch *bt = cx->bt;
    const llmi_model *m = b->model;
    const llmi_config *c = &m->cfg;
    const int id = cx->id, T = cx->T, n = bt->n_tokens;
    const int dim = c->dim, hd = c->head_dim, half = hd / 2, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim;
    const int qd = nh * hd, kvd = nkv * hd;
    const float eps = c->norm_eps, rs = config_residual_scale(c);
    const size_t layer_kv = (size_t)b->num_blocks * b->opts.block_size * kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)kvd);
    const double esz = (double)kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)kvd) / kvd;
    step_thread *th = &s->th[id];
    double t0 = omp_get_wtime();
    const double ctx_sum = batch_attended_keys(bt, 0), ctx_sum_win = batch_attended_keys(bt, c->sliding_window);
    /* profiling (thread 0): a phase's time runs up to its barrier (so waiting for the
     * slowest thread counts in the phase's matmul class); the norm that opens a phase and
     * the RoPE/KV write or SwiGLU inside it are thread 0's own time for them */
    const bool pr = id == 0 && b->profiling;
    double sub0 = 0, sub_s = 0;   /* start and seconds of the sub-op inside the current phase */
#define PROF(cls, cost) do { if (pr) prof(b, (cls), &t0, (cost)); } while (0)
#define SUB_BEGIN() do { if (pr) sub0 = omp_get_wtime(); } while (0)
#define SUB_END() do { if (pr) sub_s = omp_get_wtime() - sub0; } while (0)
#define PROF_SUB(cls, cost) do { if (pr) { op_stats_add(&b->stats, (cls), sub_s, (cost)); t0 += sub_s; } } while (0)

    for (int t = 0; t < n; t++) {
        tensor_dequant_row(&m->tok_embd, bt->tokens[t], th->x + (size_t)t * dim);
        if (config_embed_scale(c) != 1.0f) cpu_scale(th->x + (size_t)t * dim, (size_t)dim, config_embed_scale(c));
    }
    PROF(LLMI_OP_EMBED, cost_embed(n, dim, (double)m->tok_embd.row_bytes, sizeof(float)));

    int64_t q0, q1, kh0, kh1, u0, u1, o0, o1, f0, f1;
    qkv_split(c, id, T, &q0, &q1);
    split(nkv, id, T, 1, &kh0, &kh1);
    split((int64_t)n * nh, id, T, 1, &u0, &u1);
    split(dim, id, T, 16, &o0, &o1);
    split(ffn, id, T, 16, &f0, &f1);
    for (int l = 0; l < c->n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        const llmi_tensor *const *W = im->lw + (size_t)l * CPU_W_PER_LAYER;   /* packed where they pack */
        char *kc = (char *)im->kv + (size_t)l * 2 * layer_kv, *vc = kc + layer_kv;
        const float *ks = im->kv_scale + (size_t)l * 2 * nkv, *vs = ks + nkv;
        const bool local = config_layer_rope_local(c, l);
        const float *rcs = local ? im->rope_cs_local : im->rope_cs, *rsn = local ? im->rope_sn_local : im->rope_sn;

        /* 1: (residual add +) attn norm, q rows, this thread's kv heads roped into the cache */
        for (int t = 0; t < n; t++) {
            float *x = th->x + (size_t)t * dim, *xn = th->xn + (size_t)t * dim;
            if (l > 0)
                add_norm_row(x, im->delta + (size_t)t * dim, m->layers[l - 1].post_ffn_norm, rs,
                             m->layers[l - 1].control, L->attn_norm, dim, eps, xn);
            else cpu_rmsnorm_row(x, L->attn_norm, dim, eps, xn);
        }
        PROF(LLMI_OP_NORM, cost_rmsnorm(n, dim, l > 0, sizeof(float)));
        th->layout = -2;
        mm(th, W[CPU_W_Q], th->xn, n, q0, q1, L->bq, im->q);
        mm(th, W[CPU_W_K], th->xn, n, kh0 * hd, kh1 * hd, L->bk, im->k);
        mm(th, W[CPU_W_V], th->xn, n, kh0 * hd, kh1 * hd, L->bv, im->v);
        SUB_BEGIN();
        for (int t = 0; t < n && kh0 < kh1 && L->k_norm; t++)   /* Qwen3: k heads normalised before RoPE */
            cpu_head_rmsnorm(im->k + (size_t)t * kvd, kvd, 1, (int)kh0, (int)kh1, hd, L->k_norm, eps);
        for (int t = 0; t < n && kh0 < kh1; t++)
            cpu_rope_kv_write_heads(im->k + (size_t)t * kvd, im->v + (size_t)t * kvd, rcs + (size_t)t * half,
                                    rsn + (size_t)t * half, bt->slot_mapping[t], (int)kh0, (int)kh1, nkv, hd,
                                    config_layer_rope_dim(c, l), kc, vc, b->opts.kv_dtype, ks, vs);
        SUB_END();
        bar_wait(&s->bar, T, s->spin_ns);
        PROF_SUB(LLMI_OP_ROPE_KV, cost_rope_kv(n, qd, kvd, esz));
        PROF(LLMI_OP_QKV, cost_sum(cost_sum(mm_cost(W[CPU_W_Q], n), mm_cost(W[CPU_W_K], n)), mm_cost(W[CPU_W_V], n)));

        /* 2: this thread's (token, head) units: rope q, attend */
        for (int64_t u = u0; u < u1;) {
            int t = (int)(u / nh), h0 = (int)(u % nh), h1 = (int)(h0 + (u1 - u) < nh ? h0 + (u1 - u) : nh);
            if (L->q_norm) cpu_head_rmsnorm(im->q + (size_t)t * qd, qd, 1, h0, h1, hd, L->q_norm, eps);
            cpu_rope_heads(im->q + (size_t)t * qd, rcs + (size_t)t * half, rsn + (size_t)t * half, h0, h1, hd,
                           config_layer_rope_dim(c, l));
            u += h1 - h0;
        }
        cpu_paged_attention_part(im->q, kc, vc, b->opts.kv_dtype, ks, vs, bt, nh, nkv, hd, b->opts.block_size,
                                 cpu_layer_scores(c, l), (int)u0, (int)u1, im->att);
        bar_wait(&s->bar, T, s->spin_ns);
        PROF(LLMI_OP_ATTN, cost_attention(config_layer_window(c, l) ? ctx_sum_win : ctx_sum, n, qd, kvd, esz,
                                          sizeof(float)));

        /* 3: o_proj rows */
        th->layout = -2;
        mm(th, W[CPU_W_O], im->att, n, o0, o1, L->bo, im->delta);
        bar_wait(&s->bar, T, s->spin_ns);
        PROF(LLMI_OP_O_PROJ, mm_cost(W[CPU_W_O], n));

        /* 4: residual add + ffn norm, gate/up rows, SwiGLU on them (in place in gate) */
        for (int t = 0; t < n; t++)
            add_norm_row(th->x + (size_t)t * dim, im->delta + (size_t)t * dim, L->post_attn_norm, rs, NULL, L->ffn_norm,
                         dim, eps, th->xn + (size_t)t * dim);
        PROF(LLMI_OP_NORM, cost_rmsnorm(n, dim, true, sizeof(float)));
        if (c->n_experts > 0) {   /* 4 and 5 for a mixture of experts */
            step_moe(cx, l, f0, f1, o0, o1, pr ? &t0 : NULL);
            continue;
        }
        th->layout = -2;
        mm(th, W[CPU_W_GATE], th->xn, n, f0, f1, NULL, im->gate);
        mm(th, W[CPU_W_UP], th->xn, n, f0, f1, NULL, im->up);
        SUB_BEGIN();
        for (int t = 0; t < n; t++)
            cpu_glu_range(c->act, im->gate + (size_t)t * ffn, im->up + (size_t)t * ffn, (size_t)f0, (size_t)f1,
                          im->gate + (size_t)t * ffn);
        SUB_END();
        bar_wait(&s->bar, T, s->spin_ns);
        PROF_SUB(LLMI_OP_ACT, cost_swiglu(n, ffn, sizeof(float)));
        PROF(LLMI_OP_MLP_UP, cost_sum(mm_cost(W[CPU_W_GATE], n), mm_cost(W[CPU_W_UP], n)));

        /* 5: down_proj rows */
        th->layout = -2;
        mm(th, W[CPU_W_DOWN], im->gate, n, o0, o1, NULL, im->delta);
        bar_wait(&s->bar, T, s->spin_ns);
        PROF(LLMI_OP_MLP_DOWN, mm_cost(W[CPU_W_DOWN], n));
    }

    /* the rows that need logits: final residual add and norm (each thread), lm_head slice */
    const int nl = bt->n_logits;
    if (nl <= 0) return;
    const llmi_layer *last = &m->layers[c->n_layers - 1];
    for (int i = 0; i < nl; i++) {
        size_t r = (size_t)bt->logit_rows[i] * dim;
        float *lg = th->xn + (size_t)i * dim;
        sub_block_out_row(im->delta + r, last->post_ffn_norm, rs, last->control, dim, eps, lg);
        for (int j = 0; j < dim; j++) lg[j] = th->x[r + j] + lg[j];
        cpu_rmsnorm_row(lg, m->out_norm, dim, eps, lg);
    }
    PROF(LLMI_OP_NORM, cost_rmsnorm(nl, dim, true, sizeof(float)));
    int64_t v0, v1;
    split(im->lm_head->rows, id, T, 16, &v0, &v1);
    th->layout = -2;
    mm(th, im->lm_head, th->xn, nl, v0, v1, NULL, cx->logits);
    cpu_logits_finish(cx->logits, nl, c->n_vocab, (int)v0, (int)v1, config_logit_scale(c), c->final_softcap);
    if (b->profiling) bar_wait(&s->bar, T, s->spin_ns);   /* the profile's lm_head time is the slowest thread's */
    PROF(LLMI_OP_LM_HEAD, mm_cost(im->lm_head, nl));
#undef PROF
#undef SUB_BEGIN
#undef SUB_END
#undef PROF_SUB
}

void cpu_step_forward(llmi_backend *b, const llmi_batch *bt, float *logits) {
    cpu_impl *im = b->impl;
    cpu_step *s = im->step;
    step_pick_spin(s);
    const llmi_config *c = &b->model->cfg;
    cpu_rope_table(bt->positions, bt->n_tokens, c->head_dim, c->rope_dim, im->inv_freq, config_rope_mscale(c, false),
                   im->rope_cs, im->rope_sn);
    if (c->rope_theta_local > 0)
        cpu_rope_table(bt->positions, bt->n_tokens, c->head_dim, c->rope_dim, im->inv_freq_local,
                       config_rope_mscale(c, true), im->rope_cs_local, im->rope_sn_local);
#pragma omp parallel num_threads(s->n_threads)
    {
        /* a smaller team than asked for (a thread limit) runs on thread 0 alone */
        int T = omp_get_num_threads(), id = omp_get_thread_num();
        step_ctx cx = {b, bt, logits, T == s->n_threads ? id : 0, T == s->n_threads ? T : 1};
        if (T == s->n_threads || id == 0) step_run(&cx);
    }
}
