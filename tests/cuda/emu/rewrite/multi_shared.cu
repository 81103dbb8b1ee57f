// cu_rewrite must refuse: two __shared__ variables in one declaration.
__global__ void k(float *x) {
  __shared__ float a[32], b[32];
  x[0] = a[0] + b[0];
}
