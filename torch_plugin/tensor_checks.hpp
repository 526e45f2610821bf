// Validation of what PyTorch hands the backend, done before anything is submitted so that a
// bad call raises at once and leaves the group usable. Every failure names the collective,
// the offending argument and why.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "client/client.hpp"

namespace smddp::torch_plugin {

// Where a collective's tensors live, which decides the data path that runs it.
enum class DevicePath { Host, Cuda };

// smddp's dtype for a torch dtype; throws SMDDPUnsupportedError for others (complex, int16...).
client::DType smddp_dtype(const char* op, const at::Tensor& t, const std::string& name);

// A dense, contiguous tensor of a supported dtype on the CPU or a CUDA device.
void check_tensor(const char* op, const at::Tensor& t, const std::string& name);

// All tensors on one device; returns the path for it. An empty list is the host path.
DevicePath common_device_path(const char* op, const std::vector<at::Tensor>& tensors);

// All tensors of one dtype.
void check_same_dtype(const char* op, const std::vector<at::Tensor>& tensors, const std::string& what);

// Exactly one tensor (multi-device-per-process lists are gone from PyTorch).
void check_single(const char* op, const std::vector<at::Tensor>& tensors, const std::string& name);

// 0 <= rank < size.
void check_rank(const char* op, int64_t rank, int size, const std::string& what);

struct ReduceSpec {
  client::ReduceOp op;
  double scale = 1.0;  // PREMUL_SUM factor
};
// The smddp reduce op for `op` on `dtype`; throws when smddp cannot apply it to that dtype.
ReduceSpec reduce_spec(const char* op_name, const c10d::ReduceOp& op, client::DType dtype);

std::string describe(const at::Tensor& t);  // "float32[4, 3] on cpu"

}  // namespace smddp::torch_plugin
