// cu_rewrite must refuse: a launch without its argument list.
__global__ void k(float *x) {}
void launch(float *x) { k<<<1, 32>>>; }
