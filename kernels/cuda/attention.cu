// CUDA block-sparse DFlash attention on bf16 tensor cores (WMMA 16×16×16, fp32 accumulation), forward and
// backward, plus the public launchers that pick this path or the fp32 one (attention_f32.cu).
//
// Schedule (kernels/attn_tiles.h): a thread block owns one query tile of up to 64 rows, the G·bs rows of one
// DFlash block that share a kv head, and walks only the key tiles that hold a visible key (its context prefix
// [lo, anchor) from lo, then its own block). Scores go through shared memory in fp32; the mask predicate and the
// online softmax (fp32 running max and sum per row) run on them there; P·V accumulates into an fp32 shared
// output that is rescaled per row. The backward recomputes P from the saved log-sum-exp: a dQ pass per query
// tile (its accumulators in registers) and a dK/dV pass per key tile that visits its query tiles in block order,
// so every gradient element is owned by one thread block and summed in a fixed order: deterministic, no atomics.
// Simple first: shared-memory round trips instead of register-level softmax, scalar global loads.
#include <mma.h>

#include "kernels/attn_tiles.h"
#include "kernels/cuda/attention_f32.cuh"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

using namespace nvcuda;

namespace {

constexpr int QT = DF_ATTN_QT, KT = DF_ATTN_KT;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int LDS = KT + 4; // fp32 score rows
constexpr int LDP = KT + 8; // bf16 probability rows

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_acc;

struct geom {
  int64_t B, N, bs, S, nH, nKV, hd, W, G, M, Q, KV, nchunk;
  int hdp, ldh, ldo; // head dim padded to 16; bf16 and fp32 row strides in shared memory
  float scale;
};

geom make_geom(const df_cu_attn_args *a) {
  geom g;
  g.B = a->B, g.N = a->N, g.bs = a->bs, g.S = a->S, g.nH = a->nH, g.nKV = a->nKV, g.hd = a->hd, g.W = a->window;
  g.G = g.nH / g.nKV, g.M = g.G * g.bs, g.Q = g.N * g.bs, g.KV = g.S + g.Q;
  g.nchunk = df_attn_row_chunks(g.G, g.bs);
  g.hdp = (int)((g.hd + 15) / 16 * 16), g.ldh = g.hdp + 8, g.ldo = g.hdp + 4;
  g.scale = a->scale;
  return g;
}

// A query tile: sample b, block n, kv head kh, rows [r0, r0 + nr) of the block's G·bs rows.
struct qtile {
  int64_t b, n, kh, r0, nr, a;
  bool keep;
};

__device__ qtile decode_qtile(const geom &g, int64_t item, const int32_t *anchors, const uint8_t *keep) {
  qtile t;
  const int64_t c = item % g.nchunk;
  int64_t rest = item / g.nchunk;
  t.kh = rest % g.nKV, rest /= g.nKV;
  t.n = rest % g.N, t.b = rest / g.N;
  t.r0 = c * QT;
  t.nr = g.M - t.r0 < QT ? g.M - t.r0 : QT;
  t.keep = keep[t.b * g.N + t.n] != 0;
  t.a = anchors[t.b * g.N + t.n];
  return t;
}

// Element offset of tile row r (0 <= r < M) in a [B, N·bs, nH, hd] tensor, and in the [B, nH, N·bs] lse.
__device__ __forceinline__ int64_t q_off(const geom &g, const qtile &t, int64_t r) {
  const int64_t tok = t.b * g.Q + t.n * g.bs + r % g.bs, h = t.kh * g.G + r / g.bs;
  return (tok * g.nH + h) * g.hd;
}
__device__ __forceinline__ int64_t lse_off(const geom &g, const qtile &t, int64_t r) {
  const int64_t h = t.kh * g.G + r / g.bs;
  return (t.b * g.nH + h) * g.Q + t.n * g.bs + r % g.bs;
}
// Key row j (context index, or S + block token) of kv head kh of sample b in a [B, S + N·bs, nKV, hd] tensor.
__device__ __forceinline__ int64_t k_off(const geom &g, int64_t b, int64_t j, int64_t kh) {
  return ((b * g.KV + j) * g.nKV + kh) * g.hd;
}

// Tile rows of a q-like tensor into bf16 shared rows [QT][ldh], zero beyond nr rows and hd columns.
template <typename T> __device__ void load_q_rows(const geom &g, const qtile &t, const T *src, bf16 *dst) {
  for (int i = threadIdx.x; i < QT * g.hdp; i += kThreads) {
    const int r = i / g.hdp, d = i % g.hdp;
    float v = 0.0f;
    if (r < t.nr && d < g.hd) v = df_ld(src + q_off(g, t, t.r0 + r) + d);
    dst[r * g.ldh + d] = __float2bfloat16_rn(v);
  }
}

// Key rows of one tile (key_base: the index of its first key row in the KV dimension) into bf16 shared rows.
template <typename T>
__device__ void load_k_rows(const geom &g, int64_t b, int64_t kh, int64_t key_base, int64_t n, const T *src,
                            bf16 *dst) {
  for (int i = threadIdx.x; i < KT * g.hdp; i += kThreads) {
    const int r = i / g.hdp, d = i % g.hdp;
    float v = 0.0f;
    if (r < n && d < g.hd) v = df_ld(src + k_off(g, b, key_base + r, kh) + d);
    dst[r * g.ldh + d] = __float2bfloat16_rn(v);
  }
}

// C[QT or KT rows][KT] (fp32, ld LDS) = A[rows][hdp] · B[KT][hdp]ᵀ, both bf16 with row stride ldh: 16 output
// tiles, two per warp.
__device__ void mma_abt(const geom &g, const bf16 *A, const bf16 *Bm, float *C) {
  const int warp = threadIdx.x >> 5;
  for (int id = warp; id < 16; id += kWarps) {
    const int ti = id / 4, tj = id % 4;
    frag_acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < g.hdp; kk += 16) {
      frag_a_row fa;
      frag_b_col fb;
      wmma::load_matrix_sync(fa, A + ti * 16 * g.ldh + kk, g.ldh);
      wmma::load_matrix_sync(fb, Bm + tj * 16 * g.ldh + kk, g.ldh);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(C + ti * 16 * LDS + tj * 16, acc, LDS, wmma::mem_row_major);
  }
}

__host__ __device__ inline size_t align128(size_t b) { return (b + 127) / 128 * 128; }

// ---- forward -------------------------------------------------------------------------------------------------

struct fwd_smem {
  bf16 *q, *k, *v, *p;
  float *s, *o, *m, *l, *alpha;
};

size_t fwd_smem_bytes(const geom &g) {
  return 3 * align128(sizeof(bf16) * QT * g.ldh) + align128(sizeof(float) * QT * LDS) +
         align128(sizeof(bf16) * QT * LDP) + align128(sizeof(float) * QT * g.ldo) + 3 * align128(sizeof(float) * QT);
}

__device__ fwd_smem carve_fwd(const geom &g, unsigned char *base) {
  fwd_smem s;
  size_t o = 0;
  s.q = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * g.ldh);
  s.k = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * g.ldh);
  s.v = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * g.ldh);
  s.s = (float *)(base + o), o += align128(sizeof(float) * QT * LDS);
  s.p = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * LDP);
  s.o = (float *)(base + o), o += align128(sizeof(float) * QT * g.ldo);
  s.m = (float *)(base + o), o += align128(sizeof(float) * QT);
  s.l = (float *)(base + o), o += align128(sizeof(float) * QT);
  s.alpha = (float *)(base + o);
  return s;
}

// Online softmax over one key tile: warp w owns rows w·8 .. w·8+7, lanes own columns lane and lane + 32.
__device__ void online_softmax(const geom &g, const qtile &t, const df_attn_tile &kt, fwd_smem &sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = warp * (QT / kWarps); i < (warp + 1) * (QT / kWarps); i++) {
    const int64_t R = t.r0 + i, o = R % g.bs;
    float sv[2];
    float mx = -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int c = lane + 32 * h;
      const bool vis = i < t.nr && c < kt.n && df_attn_visible(t.a, g.W, g.bs, o, kt.block, kt.j0 + c);
      sv[h] = vis ? sm.s[i * LDS + c] * g.scale : -INFINITY;
      mx = fmaxf(mx, sv[h]);
    }
    mx = df_warp_max(mx);
    const float m_old = sm.m[i], m_new = fmaxf(m_old, mx);
    float alpha = 1.0f, sum = 0.0f;
    float p[2] = {0.0f, 0.0f};
    if (m_new != -INFINITY) {
      alpha = expf(m_old - m_new); // 0 when nothing was seen before
#pragma unroll
      for (int h = 0; h < 2; h++) p[h] = sv[h] == -INFINITY ? 0.0f : expf(sv[h] - m_new);
      sum = df_warp_sum(p[0] + p[1]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) sm.p[i * LDP + lane + 32 * h] = __float2bfloat16_rn(p[h]);
    if (lane == 0) {
      sm.alpha[i] = alpha;
      if (m_new != -INFINITY) sm.m[i] = m_new, sm.l[i] = sm.l[i] * alpha + sum;
    }
  }
}

template <typename TI, typename TO>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_tc(geom g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep, TO *out,
                float *lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  fwd_smem sm = carve_fwd(g, smem);
  const int64_t items = (int64_t)gridDim.x;
  const qtile t = decode_qtile(g, items - 1 - (int64_t)blockIdx.x, anchors, keep); // latest blocks first
  if (!t.keep) { // dropped block: zero rows, lse −inf
    for (int i = threadIdx.x; i < t.nr * g.hd; i += kThreads)
      df_st(out + q_off(g, t, t.r0 + i / g.hd) + i % g.hd, 0.0f);
    for (int i = threadIdx.x; i < t.nr; i += kThreads) lse[lse_off(g, t, t.r0 + i)] = -INFINITY;
    return;
  }
  load_q_rows(g, t, q, sm.q);
  for (int i = threadIdx.x; i < QT * g.ldo; i += kThreads) sm.o[i] = 0.0f;
  for (int i = threadIdx.x; i < QT; i += kThreads) sm.m[i] = -INFINITY, sm.l[i] = 0.0f;
  const int64_t ntiles = df_attn_fwd_ntiles(t.a, g.W, g.bs);
  const int warp = threadIdx.x >> 5, hd16 = g.hdp / 16;
  for (int64_t ti = 0; ti < ntiles; ti++) {
    const df_attn_tile kt = df_attn_fwd_tile(ti, t.a, g.W, g.bs);
    const int64_t key_base = kt.block ? g.S + t.n * g.bs + kt.j0 : kt.j0;
    __syncthreads(); // the previous tile is done with k, v, p and o
    load_k_rows(g, t.b, t.kh, key_base, kt.n, k, sm.k);
    load_k_rows(g, t.b, t.kh, key_base, kt.n, v, sm.v);
    __syncthreads();
    mma_abt(g, sm.q, sm.k, sm.s);
    __syncthreads();
    online_softmax(g, t, kt, sm);
    __syncthreads();
    for (int i = threadIdx.x; i < QT * g.hdp; i += kThreads) {
      const int r = i / g.hdp, d = i % g.hdp;
      sm.o[r * g.ldo + d] *= sm.alpha[r];
    }
    __syncthreads();
    // o (QT × hdp) += P (QT × KT) · V (KT × hdp)
    for (int id = warp; id < 4 * hd16; id += kWarps) {
      const int ti2 = id / hd16, tj = id % hd16;
      frag_acc acc;
      wmma::load_matrix_sync(acc, sm.o + ti2 * 16 * g.ldo + tj * 16, g.ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < KT; kk += 16) {
        frag_a_row fa;
        frag_b_row fb;
        wmma::load_matrix_sync(fa, sm.p + ti2 * 16 * LDP + kk, LDP);
        wmma::load_matrix_sync(fb, sm.v + kk * g.ldh + tj * 16, g.ldh);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sm.o + ti2 * 16 * g.ldo + tj * 16, acc, g.ldo, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < t.nr * g.hd; i += kThreads) {
    const int r = i / (int)g.hd, d = i % (int)g.hd;
    const float l = sm.l[r];
    df_st(out + q_off(g, t, t.r0 + r) + d, l > 0.0f ? sm.o[r * g.ldo + d] / l : 0.0f);
  }
  for (int r = threadIdx.x; r < t.nr; r += kThreads) {
    const float l = sm.l[r];
    lse[lse_off(g, t, t.r0 + r)] = l > 0.0f ? sm.m[r] + logf(l) : -INFINITY;
  }
}

// ---- backward: shared pieces ---------------------------------------------------------------------------------

// D[b, h, row] = Σ_d dout·out (double), one warp per query row; the lse layout.
template <typename TO, typename TG> __global__ void attn_rowdot(geom g, const TO *out, const TG *dout, float *D) {
  const int64_t row = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5); // (b, token, h) in q order
  const int lane = threadIdx.x & 31;
  if (row >= g.B * g.Q * g.nH) return;
  const int64_t h = row % g.nH, tok = row / g.nH, b = tok / g.Q, qi = tok % g.Q;
  double s = 0.0;
  for (int64_t d = lane; d < g.hd; d += 32)
    s += (double)df_ld(out + row * g.hd + d) * (double)df_ld(dout + row * g.hd + d);
  s = df_warp_sum(s);
  if (lane == 0) D[(b * g.nH + h) * g.Q + qi] = (float)s;
}

// P and dS of one (query tile, key tile) pair from S = q·kᵀ and dP = dout·vᵀ in shared memory:
// p = exp(scale·s − lse) where visible, ds = p·(dp − D); both stored bf16.
__device__ void probs_and_ds(const geom &g, const qtile &t, const df_attn_tile &kt, const float *S, const float *dP,
                             const float *lse_r, const float *D_r, bf16 *P, bf16 *dS) {
  for (int i = threadIdx.x; i < QT * KT; i += kThreads) {
    const int r = i / KT, c = i % KT;
    float p = 0.0f, ds = 0.0f;
    if (r < t.nr && c < kt.n && df_attn_visible(t.a, g.W, g.bs, (t.r0 + r) % g.bs, kt.block, kt.j0 + c) &&
        lse_r[r] != -INFINITY) {
      p = expf(S[r * LDS + c] * g.scale - lse_r[r]);
      ds = p * (dP[r * LDS + c] - D_r[r]);
    }
    if (P) P[r * LDP + c] = __float2bfloat16_rn(p);
    dS[r * LDP + c] = __float2bfloat16_rn(ds);
  }
}

__device__ void load_row_stats(const geom &g, const qtile &t, const float *lse, const float *D, float *lse_r,
                               float *D_r) {
  for (int r = threadIdx.x; r < QT; r += kThreads) {
    lse_r[r] = r < t.nr ? lse[lse_off(g, t, t.r0 + r)] : -INFINITY;
    D_r[r] = r < t.nr ? D[lse_off(g, t, t.r0 + r)] : 0.0f;
  }
}

// ---- backward: dQ per query tile -----------------------------------------------------------------------------

struct dq_smem {
  bf16 *q, *dout, *k, *v, *ds;
  float *s, *dp, *lse, *D, *stage; // stage aliases k and v after the loop
};

size_t dq_smem_bytes(const geom &g) {
  return 4 * align128(sizeof(bf16) * QT * g.ldh) + 2 * align128(sizeof(float) * QT * LDS) +
         align128(sizeof(bf16) * QT * LDP) + 2 * align128(sizeof(float) * QT);
}

__device__ dq_smem carve_dq(const geom &g, unsigned char *base) {
  dq_smem s;
  size_t o = 0, hb = align128(sizeof(bf16) * QT * g.ldh);
  s.q = (bf16 *)(base + o), o += hb;
  s.dout = (bf16 *)(base + o), o += hb;
  s.k = (bf16 *)(base + o), s.stage = (float *)(base + o), o += hb; // QT·ldo floats fit in k + v
  s.v = (bf16 *)(base + o), o += hb;
  s.s = (float *)(base + o), o += align128(sizeof(float) * QT * LDS);
  s.dp = (float *)(base + o), o += align128(sizeof(float) * QT * LDS);
  s.ds = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * LDP);
  s.lse = (float *)(base + o), o += align128(sizeof(float) * QT);
  s.D = (float *)(base + o);
  return s;
}

// MAXF: accumulator fragments per warp (4·hdp/16 output tiles over 8 warps).
template <typename TI, typename TG, int MAXF>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_tc(geom g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep,
                   const float *lse, const float *D, const TG *dout, TG *dq) {
  extern __shared__ __align__(128) unsigned char smem[];
  dq_smem sm = carve_dq(g, smem);
  const qtile t = decode_qtile(g, (int64_t)gridDim.x - 1 - (int64_t)blockIdx.x, anchors, keep);
  if (!t.keep) {
    for (int i = threadIdx.x; i < t.nr * g.hd; i += kThreads) df_st(dq + q_off(g, t, t.r0 + i / g.hd) + i % g.hd, 0.0f);
    return;
  }
  load_q_rows(g, t, q, sm.q);
  load_q_rows(g, t, dout, sm.dout);
  load_row_stats(g, t, lse, D, sm.lse, sm.D);
  const int warp = threadIdx.x >> 5, hd16 = g.hdp / 16, ntile_out = 4 * hd16;
  frag_acc acc[MAXF];
#pragma unroll
  for (int f = 0; f < MAXF; f++) wmma::fill_fragment(acc[f], 0.0f);
  const int64_t ntiles = df_attn_fwd_ntiles(t.a, g.W, g.bs);
  for (int64_t ti = 0; ti < ntiles; ti++) {
    const df_attn_tile kt = df_attn_fwd_tile(ti, t.a, g.W, g.bs);
    const int64_t key_base = kt.block ? g.S + t.n * g.bs + kt.j0 : kt.j0;
    __syncthreads();
    load_k_rows(g, t.b, t.kh, key_base, kt.n, k, sm.k);
    load_k_rows(g, t.b, t.kh, key_base, kt.n, v, sm.v);
    __syncthreads();
    mma_abt(g, sm.q, sm.k, sm.s);     // S = q·kᵀ
    mma_abt(g, sm.dout, sm.v, sm.dp); // dP = dout·vᵀ
    __syncthreads();
    probs_and_ds(g, t, kt, sm.s, sm.dp, sm.lse, sm.D, NULL, sm.ds);
    __syncthreads();
    // dq (QT × hdp) += dS (QT × KT) · K (KT × hdp)
#pragma unroll
    for (int f = 0; f < MAXF; f++) {
      const int id = warp + f * kWarps;
      if (id >= ntile_out) break;
      const int ti2 = id / hd16, tj = id % hd16;
#pragma unroll
      for (int kk = 0; kk < KT; kk += 16) {
        frag_a_row fa;
        frag_b_row fb;
        wmma::load_matrix_sync(fa, sm.ds + ti2 * 16 * LDP + kk, LDP);
        wmma::load_matrix_sync(fb, sm.k + kk * g.ldh + tj * 16, g.ldh);
        wmma::mma_sync(acc[f], fa, fb, acc[f]);
      }
    }
  }
  __syncthreads(); // k and v are free: stage the accumulators there
#pragma unroll
  for (int f = 0; f < MAXF; f++) {
    const int id = warp + f * kWarps;
    if (id >= ntile_out) break;
    const int ti2 = id / hd16, tj = id % hd16;
    wmma::store_matrix_sync(sm.stage + ti2 * 16 * g.ldo + tj * 16, acc[f], g.ldo, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < t.nr * g.hd; i += kThreads) {
    const int r = i / (int)g.hd, d = i % (int)g.hd;
    df_st(dq + q_off(g, t, t.r0 + r) + d, g.scale * sm.stage[r * g.ldo + d]);
  }
}

// ---- backward: dK/dV per key tile ----------------------------------------------------------------------------

struct dkv_smem {
  bf16 *k, *v, *q, *dout, *p, *ds;
  float *s, *dp, *lse, *D, *stage; // stage aliases q .. ds after the loop
};

size_t dkv_smem_bytes(const geom &g) {
  return 4 * align128(sizeof(bf16) * QT * g.ldh) + 2 * align128(sizeof(float) * QT * LDS) +
         2 * align128(sizeof(bf16) * QT * LDP) + 2 * align128(sizeof(float) * QT);
}

__device__ dkv_smem carve_dkv(const geom &g, unsigned char *base) {
  dkv_smem s;
  size_t o = 0, hb = align128(sizeof(bf16) * QT * g.ldh);
  s.k = (bf16 *)(base + o), o += hb;
  s.v = (bf16 *)(base + o), o += hb;
  s.q = (bf16 *)(base + o), s.stage = (float *)(base + o), o += hb; // KT·ldo floats fit in q .. ds
  s.dout = (bf16 *)(base + o), o += hb;
  s.s = (float *)(base + o), o += align128(sizeof(float) * QT * LDS);
  s.dp = (float *)(base + o), o += align128(sizeof(float) * QT * LDS);
  s.p = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * LDP);
  s.ds = (bf16 *)(base + o), o += align128(sizeof(bf16) * QT * LDP);
  s.lse = (float *)(base + o), o += align128(sizeof(float) * QT);
  s.D = (float *)(base + o);
  return s;
}

// One query tile's contribution to a key tile: dV += Pᵀ·dout, dK += dSᵀ·q (scale applied at the end).
template <int MAXF>
__device__ void dkv_accumulate(const geom &g, const dkv_smem &sm, frag_acc *acc_k, frag_acc *acc_v) {
  const int warp = threadIdx.x >> 5, hd16 = g.hdp / 16, ntile_out = 4 * hd16;
#pragma unroll
  for (int f = 0; f < MAXF; f++) {
    const int id = warp + f * kWarps;
    if (id >= ntile_out) break;
    const int ki = id / hd16, tj = id % hd16;
#pragma unroll
    for (int kk = 0; kk < QT; kk += 16) {
      frag_a_col fp, fs; // Pᵀ and dSᵀ: the row-major [QT][LDP] tiles read column-major
      frag_b_row fo, fq;
      wmma::load_matrix_sync(fp, sm.p + kk * LDP + ki * 16, LDP);
      wmma::load_matrix_sync(fo, sm.dout + kk * g.ldh + tj * 16, g.ldh);
      wmma::mma_sync(acc_v[f], fp, fo, acc_v[f]);
      wmma::load_matrix_sync(fs, sm.ds + kk * LDP + ki * 16, LDP);
      wmma::load_matrix_sync(fq, sm.q + kk * g.ldh + tj * 16, g.ldh);
      wmma::mma_sync(acc_k[f], fs, fq, acc_k[f]);
    }
  }
}

template <typename TG, int MAXF>
__device__ void dkv_store(const geom &g, const dkv_smem &sm, frag_acc *acc, int64_t b, int64_t kh, int64_t key_base,
                          int64_t n, float mult, TG *dst) {
  const int warp = threadIdx.x >> 5, hd16 = g.hdp / 16, ntile_out = 4 * hd16;
  __syncthreads();
#pragma unroll
  for (int f = 0; f < MAXF; f++) {
    const int id = warp + f * kWarps;
    if (id >= ntile_out) break;
    wmma::store_matrix_sync(sm.stage + (id / hd16) * 16 * g.ldo + (id % hd16) * 16, acc[f], g.ldo, wmma::mem_row_major);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n * g.hd; i += kThreads) {
    const int r = i / (int)g.hd, d = i % (int)g.hd;
    df_st(dst + k_off(g, b, key_base + r, kh) + d, mult * sm.stage[r * g.ldo + d]);
  }
}

template <typename TI, typename TG, int MAXF>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkv_tc(geom g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep,
                    const float *lse, const float *D, const TG *dout, TG *dk, TG *dv) {
  extern __shared__ __align__(128) unsigned char smem[];
  dkv_smem sm = carve_dkv(g, smem);
  const int64_t per = df_attn_key_tiles(g.S, g.N, g.bs);
  const int64_t item = blockIdx.x, ti = item % per, kh = item / per % g.nKV, b = item / per / g.nKV;
  int64_t owner = -1;
  const df_attn_tile kt = df_attn_key_tile(ti, g.S, g.bs, &owner);
  const int64_t key_base = kt.block ? g.S + owner * g.bs + kt.j0 : kt.j0;
  load_k_rows(g, b, kh, key_base, kt.n, k, sm.k);
  load_k_rows(g, b, kh, key_base, kt.n, v, sm.v);
  frag_acc acc_k[MAXF], acc_v[MAXF];
#pragma unroll
  for (int f = 0; f < MAXF; f++) wmma::fill_fragment(acc_k[f], 0.0f), wmma::fill_fragment(acc_v[f], 0.0f);
  const int64_t n0 = kt.block ? owner : 0, n1 = kt.block ? owner + 1 : g.N;
  for (int64_t n = n0; n < n1; n++) {
    const bool kp = keep[b * g.N + n] != 0;
    const int64_t a = anchors[b * g.N + n];
    if (!df_attn_key_tile_visits(&kt, owner, n, kp, a, g.W)) continue;
    for (int64_t c = 0; c < g.nchunk; c++) {
      qtile t;
      t.b = b, t.n = n, t.kh = kh, t.r0 = c * QT, t.nr = g.M - t.r0 < QT ? g.M - t.r0 : QT, t.a = a, t.keep = true;
      __syncthreads(); // the previous query tile is done with q, dout, p, ds
      load_q_rows(g, t, q, sm.q);
      load_q_rows(g, t, dout, sm.dout);
      load_row_stats(g, t, lse, D, sm.lse, sm.D);
      __syncthreads();
      mma_abt(g, sm.q, sm.k, sm.s);
      mma_abt(g, sm.dout, sm.v, sm.dp);
      __syncthreads();
      probs_and_ds(g, t, kt, sm.s, sm.dp, sm.lse, sm.D, sm.p, sm.ds);
      __syncthreads();
      dkv_accumulate<MAXF>(g, sm, acc_k, acc_v);
    }
  }
  dkv_store<TG, MAXF>(g, sm, acc_k, b, kh, key_base, kt.n, g.scale, dk);
  dkv_store<TG, MAXF>(g, sm, acc_v, b, kh, key_base, kt.n, 1.0f, dv);
}

// ---- launchers -----------------------------------------------------------------------------------------------

df_status check_tc(const df_cu_attn_args *a, df_error *err) {
  if (a->hd > 256)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "block_attn", "use the fp32 path for head_dim > 256",
                   "the tensor-core attention supports head_dim <= 256, got %lld", (long long)a->hd);
  return DF_OK;
}

template <typename K> df_status set_smem(K kernel, size_t bytes, df_error *err) {
  DF_CU_TRY(err, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
            "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  return DF_OK;
}

template <typename TI, typename TO>
df_status fwd_tc(cudaStream_t s, const geom &g, const df_cu_attn_args *a, df_error *err) {
  const int64_t items = g.B * g.N * g.nKV * g.nchunk;
  const size_t bytes = fwd_smem_bytes(g);
  DF_TRY(set_smem(attn_fwd_tc<TI, TO>, bytes, err));
  attn_fwd_tc<TI, TO><<<(unsigned)items, kThreads, bytes, s>>>(g, (const TI *)a->q, (const TI *)a->k, (const TI *)a->v,
                                                               a->anchors, a->keep, (TO *)a->out, a->lse);
  DF_CU_CHECK_LAUNCH(err, "block_attn_fwd (tensor cores)");
  return DF_OK;
}

template <typename TI, typename TG, int MAXF>
df_status bwd_tc_f(cudaStream_t s, const geom &g, const df_cu_attn_args *a, const float *D, df_error *err) {
  const int64_t qitems = g.B * g.N * g.nKV * g.nchunk, kitems = g.B * g.nKV * df_attn_key_tiles(g.S, g.N, g.bs);
  const size_t qb = dq_smem_bytes(g), kb = dkv_smem_bytes(g);
  DF_TRY(set_smem(attn_bwd_dq_tc<TI, TG, MAXF>, qb, err));
  DF_TRY(set_smem(attn_bwd_dkv_tc<TI, TG, MAXF>, kb, err));
  attn_bwd_dq_tc<TI, TG, MAXF><<<(unsigned)qitems, kThreads, qb, s>>>(g, (const TI *)a->q, (const TI *)a->k,
                                                                      (const TI *)a->v, a->anchors, a->keep, a->lse, D,
                                                                      (const TG *)a->dout, (TG *)a->dq);
  DF_CU_CHECK_LAUNCH(err, "block_attn_bwd_dq (tensor cores)");
  if (kitems > 0) {
    attn_bwd_dkv_tc<TI, TG, MAXF>
        <<<(unsigned)kitems, kThreads, kb, s>>>(g, (const TI *)a->q, (const TI *)a->k, (const TI *)a->v, a->anchors,
                                                a->keep, a->lse, D, (const TG *)a->dout, (TG *)a->dk, (TG *)a->dv);
    DF_CU_CHECK_LAUNCH(err, "block_attn_bwd_dkv (tensor cores)");
  }
  return DF_OK;
}

template <typename TI, typename TG>
df_status bwd_tc(cudaStream_t s, const geom &g, const df_cu_attn_args *a, const float *D, df_error *err) {
  // Output tiles per warp: 4·hdp/16 over 8 warps → 2 (hd ≤ 64), 4 (≤ 128), 8 (≤ 256).
  if (g.hdp <= 64) return bwd_tc_f<TI, TG, 2>(s, g, a, D, err);
  if (g.hdp <= 128) return bwd_tc_f<TI, TG, 4>(s, g, a, D, err);
  return bwd_tc_f<TI, TG, 8>(s, g, a, D, err);
}

bool use_tc(const df_cu_attn_args *a) {
  return a->path == DF_CU_ATTN_TENSOR_CORE || (a->path == DF_CU_ATTN_AUTO && a->in_dt == DF_BF16);
}

} // namespace

extern "C" df_status df_cu_block_attn_fwd(df_cu_stream s, const df_cu_attn_args *a, df_error *err) {
  if (a->B <= 0 || a->N <= 0) return DF_OK; // no queries: nothing to write
  if (!use_tc(a)) return df_cu_attn_f32_fwd((cudaStream_t)s, a, err);
  DF_TRY(check_tc(a, err));
  const geom g = make_geom(a);
  DF_CU_SWITCH_DT(
      a->in_dt, TI, err, "block_attn.q",
      DF_CU_SWITCH_DT(a->out_dt, TO, err, "block_attn.out", return fwd_tc<TI, TO>((cudaStream_t)s, g, a, err)));
}

extern "C" size_t df_cu_block_attn_bwd_workspace(const df_cu_attn_args *a) {
  return sizeof(float) * (size_t)(a->B * a->nH * a->N * a->bs > 0 ? a->B * a->nH * a->N * a->bs : 1);
}

// D = rowsum(dout ∘ out), shared by both backward paths.
df_status df_cu_attn_rowdot(cudaStream_t s, const df_cu_attn_args *a, float *D, df_error *err) {
  const geom g = make_geom(a);
  const int64_t rows = g.B * g.Q * g.nH;
  DF_CU_SWITCH_DT(a->out_dt, TO, err, "block_attn.out",
                  DF_CU_SWITCH_DT(a->grad_dt, TG, err, "block_attn.dout",
                                  attn_rowdot<TO, TG><<<df_cu_blocks(rows, kWarps), kThreads, 0, s>>>(
                                      g, (const TO *)a->out, (const TG *)a->dout, D)));
  DF_CU_CHECK_LAUNCH(err, "block_attn_rowdot");
  return DF_OK;
}

extern "C" df_status df_cu_block_attn_bwd(df_cu_stream s, const df_cu_attn_args *a, void *workspace, df_error *err) {
  const int64_t nk = a->B * (a->S + a->N * a->bs) * a->nKV * a->hd;
  if (a->B <= 0) return DF_OK;
  if (a->N <= 0) { // no queries: every key gradient is 0
    DF_TRY(df_cu_fill(s, a->dk, a->grad_dt, nk, 0.0f, err));
    return df_cu_fill(s, a->dv, a->grad_dt, nk, 0.0f, err);
  }
  float *D = (float *)workspace;
  DF_TRY(df_cu_attn_rowdot((cudaStream_t)s, a, D, err));
  if (!use_tc(a)) return df_cu_attn_f32_bwd((cudaStream_t)s, a, D, err);
  DF_TRY(check_tc(a, err));
  const geom g = make_geom(a);
  DF_CU_SWITCH_DT(
      a->in_dt, TI, err, "block_attn.q",
      DF_CU_SWITCH_DT(a->grad_dt, TG, err, "block_attn.dq", return bwd_tc<TI, TG>((cudaStream_t)s, g, a, D, err)));
}

// ---- the backend table's slots: fp32 storage runs the fp32 kernels, bf16 the tensor cores ---------------------

static df_cu_attn_args args_of(const df_block_attn_desc *d, const df_tensor *q, const df_tensor *k, const df_tensor *v,
                               const df_tensor *anchors, const df_tensor *keep) {
  df_cu_attn_args a = {};
  a.B = q->shape[0], a.N = anchors->shape[1], a.bs = d->block_size, a.S = d->context_len, a.nH = q->shape[2];
  a.nKV = k->shape[2], a.hd = q->shape[3], a.window = d->window, a.scale = d->scale;
  a.q = q->data, a.k = k->data, a.v = v->data, a.in_dt = q->dtype;
  a.anchors = (const int32_t *)anchors->data, a.keep = (const uint8_t *)keep->data, a.path = DF_CU_ATTN_AUTO;
  return a;
}

static df_status cuda_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                         const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                         const df_tensor *keep, df_tensor *out, df_tensor *lse, df_error *err) {
  df_cu_attn_args a = args_of(desc, q, k, v, anchors, keep);
  a.out = out->data, a.out_dt = out->dtype, a.lse = (float *)lse->data;
  return df_cu_block_attn_fwd(df_cuda_cu_stream(ctx), &a, err);
}

static df_status cuda_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                          const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                          const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                          const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                          df_error *err) {
  df_cu_attn_args a = args_of(desc, q, k, v, anchors, keep);
  a.out = out->data, a.out_dt = out->dtype, a.lse = (float *)lse->data;
  a.dout = dout->data, a.dq = dq->data, a.dk = dk->data, a.dv = dv->data, a.grad_dt = dq->dtype;
  void *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, df_cu_block_attn_bwd_workspace(&a), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_block_attn_bwd(df_cuda_cu_stream(ctx), &a, ws, err);
}

extern "C" void df_cuda_register_attention(df_backend *be) {
  be->block_attn_forward = cuda_block_attn_forward;
  be->block_attn_backward = cuda_block_attn_backward;
  be->measures[DF_OP_BLOCK_ATTN_BACKWARD] = true;
}
