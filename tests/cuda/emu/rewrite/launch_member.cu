// cu_rewrite must refuse: a launch through an object.
struct holder {
  void (*k)(float *);
};
void launch(holder h, float *x) { h.k<<<1, 32>>>(x); }
