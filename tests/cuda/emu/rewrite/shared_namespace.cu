// cu_rewrite must refuse: __shared__ outside a function.
namespace {
__shared__ float table[64];
}
