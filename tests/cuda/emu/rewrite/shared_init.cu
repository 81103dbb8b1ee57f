// cu_rewrite must refuse: a __shared__ variable with an initializer.
__global__ void k(float *x) {
  __shared__ float a = 1.0f;
  x[0] = a;
}
