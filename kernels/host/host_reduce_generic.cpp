// Portable kernel set (baseline x86-64 / any target).
#define SMDDP_KERNEL_SET generic
#include "kernels/host/host_reduce_kernels.inc"
