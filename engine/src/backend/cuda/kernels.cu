// Kernels of the cuda backend's Llama forward pass, compiled at run time by NVRTC.
//
// Layouts (row-major, one row per token of the step):
//   residual stream x: float [n][hidden]; everything else (activations, weights, KV): fp16.
//   KV cache: [block][layer][k|v][slot][kv_dim], the cpu backend's layout, in fp16.
// fp16 is carried as unsigned short and converted with the PTX cvt instructions, so no CUDA
// header is needed. Every reduction accumulates in fp32.

typedef unsigned short half_t;

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

// x[t] = table[tokens[t]] for each row t (one block per row).
extern "C" __global__ void embed_rows(const half_t* table, const unsigned int* tokens, float* x,
                                      int hidden) {
    size_t t = blockIdx.x;
    const half_t* row = table + (size_t)tokens[t] * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) x[t * hidden + i] = h2f(row[i]);
}

// out[r] = x[rows[r]] / rms(x[rows[r]]) * weight, one block per output row. For the layers
// rows is the identity; for the LM head it picks the rows whose logits are wanted.
extern "C" __global__ void rms_norm_rows(const float* x, const int* rows, const float* weight,
                                         half_t* out, int hidden, float eps) {
    size_t r = blockIdx.x;
    const float* src = x + (size_t)rows[r] * hidden;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += src[i] * src[i];
    float inv = rsqrtf(block_sum(ss) / (float)hidden + eps);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        out[r * hidden + i] = f2h(weight[i] * (src[i] * inv));
}

// y[t][j] += bias[j] over `total` = n * width elements.
extern "C" __global__ void add_bias(half_t* y, const float* bias, int width, int total) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] = f2h(h2f(y[i]) + bias[i % width]);
}

// Rotate-half RoPE in place on the query and key heads of row t at position pos[t] (a padding
// row has pos -1 and is left alone); inv_freq has head_dim / 2 entries.
extern "C" __global__ void rope(half_t* q, half_t* k, const int* pos, const float* inv_freq,
                                int num_heads, int num_kv_heads, int head_dim) {
    size_t t = blockIdx.x;
    int p = pos[t];
    if (p < 0) return;
    int half = head_dim / 2;
    int pairs = (num_heads + num_kv_heads) * half;
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int head = i / half, j = i % half;
        half_t* base = head < num_heads
                           ? q + (t * num_heads + head) * head_dim
                           : k + (t * num_kv_heads + (head - num_heads)) * head_dim;
        float s, c;
        sincosf((float)p * inv_freq[j], &s, &c);
        float u = h2f(base[j]), v = h2f(base[j + half]);
        base[j] = f2h(u * c - v * s);
        base[j + half] = f2h(v * c + u * s);
    }
}

// Stores row t's key and value into the cache slot slots[t] = block * block_size + offset of
// `layer` (slot -1: a padding row, stored nowhere).
extern "C" __global__ void kv_write(const half_t* k, const half_t* v, half_t* cache,
                                    const long long* slots, int layer, int num_layers,
                                    int block_size, int kv_dim) {
    size_t t = blockIdx.x;
    long long slot = slots[t];
    if (slot < 0) return;
    long long block = slot / block_size, off = slot % block_size;
    size_t kbase = ((((size_t)block * num_layers + layer) * 2 + 0) * block_size + off) * kv_dim;
    size_t vbase = ((((size_t)block * num_layers + layer) * 2 + 1) * block_size + off) * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        cache[kbase + i] = k[t * kv_dim + i];
        cache[vbase + i] = v[t * kv_dim + i];
    }
}

#define ATTN_WARPS 4
#define MAX_HEAD_DIM 256
#define NEG_INF __int_as_float(0xff800000)

// Causal attention of query row t (head blockIdx.y) over positions 0..=pos[t] of its sequence,
// read through that sequence's block table (row seq_of[t] of block_tables, max_blocks wide):
// decode tokens and chunked-prefill tokens alike, GQA by head groups. Each of ATTN_WARPS warps
// keeps an online softmax over every ATTN_WARPS-th position, lanes splitting the head's dims;
// the warps merge at the end. head_dim is a multiple of 32, at most MAX_HEAD_DIM. A padding row
// (pos -1) gets zeros.
extern "C" __global__ void paged_attention(const half_t* q, const half_t* cache,
                                           const int* block_tables, int max_blocks,
                                           const int* seq_of, const int* pos, half_t* out,
                                           int layer, int num_layers, int block_size,
                                           int num_heads, int num_kv_heads, int head_dim,
                                           float scale) {
    __shared__ float s_max[ATTN_WARPS];
    __shared__ float s_sum[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][MAX_HEAD_DIM];
    size_t t = blockIdx.x;
    int h = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int per_lane = head_dim / 32;
    int p = pos[t];
    int kvh = h / (num_heads / num_kv_heads);
    int kv_dim = num_kv_heads * head_dim;
    const half_t* qh = q + (t * num_heads + h) * head_dim;
    float qv[MAX_HEAD_DIM / 32];
    float acc[MAX_HEAD_DIM / 32];
    for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
        qv[i] = i < per_lane ? h2f(qh[lane + 32 * i]) * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    const int* table = block_tables + (size_t)(p >= 0 ? seq_of[t] : 0) * max_blocks;
    for (int j = warp; j <= p; j += ATTN_WARPS) {
        size_t block = (size_t)table[j / block_size];
        size_t off = j % block_size;
        size_t kbase = (((block * num_layers + layer) * 2 + 0) * block_size + off) * kv_dim +
                       (size_t)kvh * head_dim;
        size_t vbase = (((block * num_layers + layer) * 2 + 1) * block_size + off) * kv_dim +
                       (size_t)kvh * head_dim;
        float d = 0.0f;
        for (int i = 0; i < per_lane; i++) d += qv[i] * h2f(cache[kbase + lane + 32 * i]);
        float s = warp_sum(d);
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);
        float w = expf(s - m_new);
        l = l * corr + w;
        for (int i = 0; i < per_lane; i++)
            acc[i] = acc[i] * corr + w * h2f(cache[vbase + lane + 32 * i]);
        m = m_new;
    }
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
    for (int i = 0; i < per_lane; i++) s_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float big = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; w++) big = fmaxf(big, s_max[w]);
    half_t* oh = out + (t * num_heads + h) * head_dim;
    if (big == NEG_INF) {
        for (int i = 0; i < per_lane; i++) oh[lane + 32 * i] = f2h(0.0f);
        return;
    }
    float total = 0.0f;
    float factor[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        factor[w] = s_sum[w] > 0.0f ? expf(s_max[w] - big) : 0.0f;
        total += s_sum[w] * factor[w];
    }
    for (int i = 0; i < per_lane; i++) {
        int dim = lane + 32 * i;
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) o += s_acc[w][dim] * factor[w];
        oh[dim] = f2h(o / total);
    }
}

// x += y (fp32 residual stream plus an fp16 projection) over `total` elements.
extern "C" __global__ void add_residual(float* x, const half_t* y, int total) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += h2f(y[i]);
}

// gate = silu(gate) * up over `total` elements (the SwiGLU activation).
extern "C" __global__ void silu_mul(half_t* gate, const half_t* up, int total) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        float g = h2f(gate[i]);
        gate[i] = f2h(g / (1.0f + expf(-g)) * h2f(up[i]));
    }
}
