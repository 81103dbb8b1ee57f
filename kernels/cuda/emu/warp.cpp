// Warp collectives and WMMA in the CUDA emulator: shuffles, votes, __syncwarp and wmma::mma_sync are meeting points
// of the lanes a mask names. Each lane arrives and waits; the last to arrive checks that all are at the same
// operation, computes every lane's result (a WMMA product once for the warp) and goes on.
#include <cuda_bf16.h>
#include <string.h>

#include "kernels/cuda/emu/exec.h"

namespace df_emu {

const char *kind_name(int k) {
  switch (k) {
  case SHFL_IDX: return "__shfl_sync";
  case SHFL_UP: return "__shfl_up_sync";
  case SHFL_DOWN: return "__shfl_down_sync";
  case SHFL_XOR: return "__shfl_xor_sync";
  case VOTE_BALLOT: return "__ballot_sync";
  case VOTE_ANY: return "__any_sync";
  case VOTE_ALL: return "__all_sync";
  case K_SYNCWARP: return "__syncwarp";
  case K_MMA: return "wmma::mma_sync";
  default: return "warp operation";
  }
}

namespace {

bool pow2_width(int w) { return w >= 1 && w <= 32 && (w & (w - 1)) == 0; }

// Shuffle source lane of `lane`, or lane itself where CUDA returns the caller's own value.
int shfl_src(int kind, int lane, int arg, int width) {
  const int seg = lane & ~(width - 1);
  switch (kind) {
  case SHFL_IDX: return seg + (arg & (width - 1));
  case SHFL_UP: return (lane - seg) >= arg ? lane - arg : lane;
  case SHFL_DOWN: return (lane - seg) + arg < width ? lane + arg : lane;
  default: { // xor: later segments are out of reach
    const int s = lane ^ arg;
    return (s & ~(width - 1)) > seg ? lane : s;
  }
  }
}

float bf16f(const __nv_bfloat16 &h) {
  uint32_t u = (uint32_t)h.__x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

__attribute__((noinline)) void mma_product(ewarp *w) {
  float A[16][16], B[16][16], C[16][16];
  for (int l = 0; l < 32; l++)
    for (int e = 0; e < 8; e++) {
      const int i = l * 8 + e, r = i / 16, c = i % 16;
      A[r][c] = bf16f(((const __nv_bfloat16 *)w->mma[l][1])[e]);
      B[r][c] = bf16f(((const __nv_bfloat16 *)w->mma[l][2])[e]);
      C[r][c] = ((const float *)w->mma[l][3])[e];
    }
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      float s = C[m][n];
      for (int k = 0; k < 16; k++) s += A[m][k] * B[k][n];
      C[m][n] = s;
    }
  for (int l = 0; l < 32; l++)
    for (int e = 0; e < 8; e++) ((float *)w->mma[l][0])[e] = C[(l * 8 + e) / 16][(l * 8 + e) % 16];
}

// Every lane of the mask has arrived: compute each lane's result, then make the others runnable.
__attribute__((noinline)) void complete_general(block_exec *b, ewarp *w, int warp, int self);

void complete(block_exec *b, ewarp *w, int warp, int self) {
  const int base = warp * 32;
  if (w->uniform && w->mask == kFull && w->kind == SHFL_XOR && w->width0 == 32) {
    // The common case (a butterfly step of a warp reduction): lane l reads lane l ^ arg.
    const int arg = w->arg0;
    for (int l = 0; l < 32; l++) b->th[base + l].wres = w->val[l ^ arg];
    for (int l = 0; l < 32; l++)
      if (l != self) b->th[base + l].state = T_RUNNABLE, rq_push(b, base + l);
    w->arrived = 0;
    return;
  }
  complete_general(b, w, warp, self);
}

void complete_general(block_exec *b, ewarp *w, int warp, int self) {
  const int base = warp * 32;
  if (w->kind == K_MMA) mma_product(w);
  unsigned ballot = 0;
  if (w->kind == VOTE_BALLOT || w->kind == VOTE_ANY || w->kind == VOTE_ALL)
    for (int l = 0; l < 32; l++)
      if ((w->mask >> l & 1) && w->val[l]) ballot |= 1u << l;
  for (int l = 0; l < 32; l++) {
    if (!(w->mask >> l & 1)) continue;
    ethread *t = &b->th[base + l];
    if (w->kind <= SHFL_XOR) {
      if (!pow2_width(w->width[l])) {
        b->running = base + l;
        kfatal(b, "width must be a power of 2 from 1 to 32", "%s at %s:%d with width %d", kind_name(w->kind), w->file,
               w->line, w->width[l]);
      }
      const int s = shfl_src(w->kind, l, w->arg[l], w->width[l]);
      if (!(w->mask >> s & 1)) {
        b->running = base + l;
        kfatal(b, "a shuffle may only read lanes its mask names (and that have not exited)",
               "%s at %s:%d reads lane %d, which is outside the mask 0x%08x", kind_name(w->kind), w->file, w->line, s,
               w->mask);
      }
      t->wres = w->val[s];
    } else if (w->kind == VOTE_BALLOT) {
      t->wres = ballot;
    } else if (w->kind == VOTE_ANY) {
      t->wres = ballot != 0;
    } else if (w->kind == VOTE_ALL) {
      t->wres = ballot == w->mask;
    }
    if (l != self) t->state = T_RUNNABLE, rq_push(b, base + l);
  }
  w->arrived = 0;
}

// A warp operation called against its rules: say which rule (never returns).
[[noreturn]] __attribute__((noinline, cold)) void collective_misuse(block_exec *b, int kind, unsigned mask,
                                                                    const char *file, int line) {
  const int i = b->running, lane = i & 31;
  const ewarp *w = &b->warps[i >> 5];
  const ethread *t = &b->th[i];
  const char *hint = "every lane a warp operation's mask names must reach that same operation";
  if (!(mask >> lane & 1))
    kfatal(b, "a lane must name itself in the mask of the warp operations it calls",
           "%s at %s:%d with mask 0x%08x, which leaves out the calling lane %d", kind_name(kind), file, line, mask,
           lane);
  if (mask & ~w->valid)
    kfatal(b, "name only lanes that exist: the block's size is not a multiple of 32 here",
           "%s at %s:%d with mask 0x%08x names lanes 0x%08x, absent from this warp of the %d-thread block",
           kind_name(kind), file, line, mask, mask & ~w->valid, b->n);
  if (mask & w->exited)
    kfatal(b, hint, "%s at %s:%d with mask 0x%08x names lanes 0x%08x that have exited", kind_name(kind), file, line,
           mask, mask & w->exited);
  if (w->kind != kind || w->mask != mask || !same_site(w->file, w->line, file, line))
    kfatal(b, hint,
           "lanes of one warp reach different warp operations: this lane %s at %s:%d (mask 0x%08x), lanes "
           "0x%08x %s at %s:%d (mask 0x%08x)",
           kind_name(kind), file, line, mask, w->arrived, kind_name(w->kind), w->file, w->line, w->mask);
  kfatal(b, "all 32 lanes of a warp must make the same WMMA calls",
         "at %s at %s:%d this lane has made %u WMMA steps, the lanes before it %u", kind_name(kind), file, line,
         t->wmma_ops, w->wmma_ref);
}

// The lane arrives; the last lane of the mask to arrive computes every lane's result and goes on, the others wait.
uint64_t warp_collective(int kind, unsigned mask, const char *file, int line, uint64_t val, int arg, int width) {
  block_exec *b = g_cur;
  if (__builtin_expect(!b, 0)) cur(kind_name(kind));
  const int i = b->running, lane = i & 31, warp = i >> 5;
  ewarp *w = &b->warps[warp];
  ethread *t = &b->th[i];
  if (__builtin_expect(!(mask >> lane & 1) || (mask & ~w->valid) || (mask & w->exited), 0))
    collective_misuse(b, kind, mask, file, line);
  if (!w->arrived) {
    w->kind = kind, w->mask = mask, w->file = file, w->line = line, w->wmma_ref = t->wmma_ops, w->uniform = true;
    w->arg0 = arg, w->width0 = width;
  } else {
    if (__builtin_expect(w->kind != kind || w->mask != mask || w->line != line || t->wmma_ops != w->wmma_ref, 0))
      collective_misuse(b, kind, mask, file, line);
    if (__builtin_expect(w->file != file, 0) && strcmp(w->file, file)) collective_misuse(b, kind, mask, file, line);
    if (arg != w->arg0 || width != w->width0) w->uniform = false;
  }
  w->val[lane] = val, w->arg[lane] = arg, w->width[lane] = width;
  w->arrived |= 1u << lane;
  if (w->arrived == mask) {
    complete(b, w, warp, lane);
    return t->wres;
  }
  t->wait = W_WARP, t->wkind = kind, t->wfile = file, t->wline = line;
  block_wait(b, t);
  return t->wres;
}

} // namespace

// ---- the device-side entry points (kernels/cuda/emu/device.h, mma.h) -----------------------------------------------

void syncwarp(const char *file, int line, unsigned mask) { warp_collective(K_SYNCWARP, mask, file, line, 0, 0, 32); }

uint64_t shfl(const char *file, int line, int kind, unsigned mask, uint64_t v, int arg, int width) {
  return warp_collective(kind, mask, file, line, v, arg, width);
}

unsigned vote(const char *file, int line, int kind, unsigned mask, int pred) {
  return (unsigned)warp_collective(kind, mask, file, line, pred != 0, 0, 32);
}

int wmma_step(const char *what, const char *file, int line, const void *ptr, unsigned ldm, size_t elem_bytes) {
  block_exec *b = cur(what);
  const int i = b->running;
  const ewarp *w = &b->warps[i >> 5];
  ethread *t = &b->th[i];
  // (Lanes run one after another between collectives, so a lane may well have exited before another makes its last
  // store: the lanes' counts of steps are compared at the next collective and when the block ends.)
  if (w->valid != kFull)
    kfatal(b, "WMMA needs whole warps: make the block a multiple of 32 threads", "%s at %s:%d in a warp of %d lanes",
           what, file, line, __builtin_popcount(w->valid));
  if (ptr && (uintptr_t)ptr % 32)
    kfatal(b, "WMMA loads and stores need 256-bit (32-byte) aligned pointers", "%s at %s:%d: pointer %p", what, file,
           line, ptr);
  if (ptr && ((size_t)ldm * elem_bytes) % 16)
    kfatal(b, "ldm must be a multiple of 16 bytes (8 bf16 or 4 float elements)", "%s at %s:%d: ldm %u", what, file,
           line, ldm);
  t->wmma_ops++, t->wmma_file = file, t->wmma_line = line;
  return i & 31;
}

void wmma_mma_bf16(const char *file, int line, float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *bm,
                   const float *c) {
  block_exec *b = cur("wmma::mma_sync");
  const int i = b->running;
  wmma_step("wmma::mma_sync", file, line, NULL, 0, 0);
  ewarp *w = &b->warps[i >> 5];
  void **slot = w->mma[i & 31];
  slot[0] = d, slot[1] = (void *)a, slot[2] = (void *)bm, slot[3] = (void *)c;
  warp_collective(K_MMA, kFull, file, line, 0, 0, 32);
}

} // namespace df_emu
