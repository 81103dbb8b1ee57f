// WMMA (nvcuda::wmma) of the CUDA emulator: 16×16×16 fragments of bf16 operands and fp32 accumulators. Each lane
// holds 8 elements of the tile (lane l: elements 8l .. 8l+7 in row-major tile order; a kernel may touch them through
// x[] as on a GPU, never assuming a layout). load / store / fill act per lane and count as warp operations (all 32
// lanes must make the same ones); mma_sync is a warp collective whose product is computed once per warp, with fp32
// sums in k order. Pointers must be 256-bit aligned and ldm a multiple of 16 bytes, as CUDA requires.
#ifndef DF_EMU_MMA_H
#define DF_EMU_MMA_H

#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

#include "kernels/cuda/emu/device.h"

namespace df_emu {
// Per-lane bookkeeping of a non-collective WMMA step (load, store, fill), with the checks of its pointer and ldm.
int wmma_step(const char *what, const char *file, int line, const void *ptr, unsigned ldm, size_t elem_bytes);
// D = A·B + C for the warp (each lane passes its own fragments' x arrays).
void wmma_mma_bf16(const char *file, int line, float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                   const float *c);
} // namespace df_emu

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulated WMMA has 16x16x16 fragments only");
  static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value
                                                      : std::is_same<T, __nv_bfloat16>::value,
                "the emulated WMMA multiplies bf16 operands into fp32 accumulators");
  enum { num_elements = 8 };
  typedef T element_type;
  T x[8];
};

template <typename Use, typename T, typename L, typename V>
inline void fill_fragment_at(const char *file, int line, fragment<Use, 16, 16, 16, T, L> &f, V v) {
  df_emu::wmma_step("fill_fragment", file, line, nullptr, 0, 0);
  for (int e = 0; e < 8; e++) f.x[e] = (T)v;
}

// Operand tiles: matrix_a is A[m][k], matrix_b is B[k][n]; row_major reads p[r·ldm + c], col_major p[c·ldm + r].
template <typename Use, typename L>
inline void load_matrix_sync_at(const char *file, int line, fragment<Use, 16, 16, 16, __nv_bfloat16, L> &f,
                                const __nv_bfloat16 *p, unsigned ldm) {
  static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value, "operand layout");
  const int lane = df_emu::wmma_step("load_matrix_sync", file, line, p, ldm, sizeof(__nv_bfloat16));
  for (int e = 0; e < 8; e++) {
    const int i = lane * 8 + e, r = i / 16, c = i % 16;
    f.x[e] = std::is_same<L, row_major>::value ? p[r * ldm + c] : p[c * ldm + r];
  }
}

inline void load_matrix_sync_at(const char *file, int line, fragment<accumulator, 16, 16, 16, float, void> &f,
                                const float *p, unsigned ldm, layout_t layout) {
  const int lane = df_emu::wmma_step("load_matrix_sync", file, line, p, ldm, sizeof(float));
  for (int e = 0; e < 8; e++) {
    const int i = lane * 8 + e, r = i / 16, c = i % 16;
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}

inline void store_matrix_sync_at(const char *file, int line, float *p,
                                 const fragment<accumulator, 16, 16, 16, float, void> &f, unsigned ldm,
                                 layout_t layout) {
  const int lane = df_emu::wmma_step("store_matrix_sync", file, line, p, ldm, sizeof(float));
  for (int e = 0; e < 8; e++) {
    const int i = lane * 8 + e, r = i / 16, c = i % 16;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

template <typename LA, typename LB>
inline void mma_sync_at(const char *file, int line, fragment<accumulator, 16, 16, 16, float, void> &d,
                        const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                        const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                        const fragment<accumulator, 16, 16, 16, float, void> &c) {
  df_emu::wmma_mma_bf16(file, line, d.x, a.x, b.x, c.x);
}

} // namespace wmma
} // namespace nvcuda

// The call sites ride along (wmma::load_matrix_sync(...) becomes wmma::load_matrix_sync_at(__FILE__, __LINE__, ...)).
#define fill_fragment(...)     fill_fragment_at(__FILE__, __LINE__, __VA_ARGS__)
#define load_matrix_sync(...)  load_matrix_sync_at(__FILE__, __LINE__, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync_at(__FILE__, __LINE__, __VA_ARGS__)
#define mma_sync(...)          mma_sync_at(__FILE__, __LINE__, __VA_ARGS__)

#endif
