/* embed.cu — owns the token-embedding gather (twin: cpu_embed, then cpu_scale where the model scales). */
#include "common.cuh"

/* grid (n), block 256: one token row per block, coalesced over dim; the fp32 value times
 * scale, as the twin scales its fp32 row (cpu_scale). */
__global__ void llmi_embed_kernel(const void *table, llmi_dtype tdt, int64_t n_vocab, int dim,
                                  const int32_t *tokens, float scale, float *out) {
    int i = blockIdx.x;
    int32_t tok = tokens[i];
    float *o = out + (int64_t)i * dim;
    bool ok = tok >= 0 && tok < n_vocab;
    int64_t base = (int64_t)tok * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = ok ? llmi_load(table, tdt, base + j) * scale : 0.0f;
}

extern "C" cudaError_t llmi_cuda_embed(const void *table, llmi_dtype tdt, int64_t n_vocab, int dim,
                                       const int32_t *tokens, int n, float scale, float *out, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    llmi_embed_kernel<<<n, 256, 0, s>>>(table, tdt, n_vocab, dim, tokens, scale, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_probe(void) {
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, llmi_embed_kernel);
}
