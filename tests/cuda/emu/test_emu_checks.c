// The CUDA emulator's own checks (DF_CUDA=EMU builds only).
#include <criterion/criterion.h>
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

Test(emu, fresh_device_memory_is_nan) {
  float *d = NULL, h[64];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 64; i++) cr_expect(isnan(h[i]), "element %d is %g", i, h[i]);
  cudaFree(d);
}
