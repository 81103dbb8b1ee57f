// cu_rewrite must refuse: inline PTX.
__global__ void k(unsigned *x) {
  unsigned lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  x[0] = lane;
}
