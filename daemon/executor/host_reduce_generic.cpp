// Portable kernel set (baseline x86-64 / any target).
#define SMDDP_KERNEL_SET generic
#include "daemon/executor/host_reduce_kernels.inc"
