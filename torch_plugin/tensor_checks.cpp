#include "torch_plugin/tensor_checks.hpp"

#include <string>

#include "torch_plugin/errors.hpp"
#include "torch_plugin/torch_compat.hpp"

namespace smddp::torch_plugin {

namespace {

const char* reduce_op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNKNOWN";
  }
}

}  // namespace

std::string describe(const at::Tensor& t) {
  if (!t.defined()) {
    return "an undefined tensor";
  }
  // Plain strings, no iostreams: formatting an integer through std::ostream inside this
  // extension crashed under torch 2.11 (a SIGSEGV in std::ostream::_M_insert<long>).
  std::string s = c10::toString(t.scalar_type());
  s += '[';
  for (std::size_t i = 0; i < t.sizes().size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.sizes()[i]);
  }
  s += "] on " + t.device().str();
  return s;
}

client::DType smddp_dtype(const char* op, const at::Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
    case at::kFloat: return client::DType::Float32;
    case at::kDouble: return client::DType::Float64;
    case at::kHalf: return client::DType::Float16;
    case at::kBFloat16: return client::DType::BFloat16;
    case at::kChar: return client::DType::Int8;
    case at::kByte: return client::DType::UInt8;
    case at::kInt: return client::DType::Int32;
    case at::kLong: return client::DType::Int64;
    case at::kBool: return client::DType::Bool;
    default:
      throw_unsupported(op, name + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                                ", which smddp does not support (supported: float32, float64, float16, "
                                "bfloat16, int8, uint8, int32, int64, bool)");
  }
}

void check_tensor(const char* op, const at::Tensor& t, const std::string& name) {
  if (!t.defined()) {
    throw_invalid(op, name + " is undefined");
  }
  if (t.layout() != at::kStrided) {
    throw_unsupported(op, name + " is a sparse or otherwise non-strided tensor (" + describe(t) +
                              "); smddp needs dense tensors");
  }
  smddp_dtype(op, t, name);
  if (!t.is_contiguous()) {
    throw_invalid(op, name + " (" + describe(t) + ") is not contiguous; call .contiguous() first");
  }
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    throw_unsupported(op, name + " is on device " + t.device().str() + "; smddp handles cpu and cuda tensors");
  }
}

DevicePath common_device_path(const char* op, const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) {
    return DevicePath::Host;
  }
  const auto device = tensors.front().device();
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].device() != device) {
      throw_invalid(op, "tensors are on different devices (" + device.str() + " and " +
                            tensors[i].device().str() + "); all tensors of one call must share a device");
    }
  }
  return device.is_cuda() ? DevicePath::Cuda : DevicePath::Host;
}

void check_same_dtype(const char* op, const std::vector<at::Tensor>& tensors, const std::string& what) {
  for (std::size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].scalar_type() != tensors.front().scalar_type()) {
      throw_invalid(op, what + " mix dtypes (" + std::string(c10::toString(tensors.front().scalar_type())) +
                            " and " + std::string(c10::toString(tensors[i].scalar_type())) + ")");
    }
  }
}

void check_single(const char* op, const std::vector<at::Tensor>& tensors, const std::string& name) {
  if (tensors.size() != 1) {
    throw_invalid(op, "expects exactly one " + name + " tensor per call, got " + std::to_string(tensors.size()));
  }
}

void check_rank(const char* op, int64_t rank, int size, const std::string& what) {
  if (rank < 0 || rank >= size) {
    throw_invalid(op, what + " " + std::to_string(rank) + " is out of range for a group of size " +
                          std::to_string(size));
  }
}

ReduceSpec reduce_spec(const char* op_name, const c10d::ReduceOp& op, client::DType dtype) {
  ReduceSpec spec{};
  switch (op.op_) {
    case c10d::ReduceOp::SUM: spec.op = client::ReduceOp::Sum; break;
    case c10d::ReduceOp::AVG: spec.op = client::ReduceOp::Avg; break;
    case c10d::ReduceOp::PRODUCT: spec.op = client::ReduceOp::Product; break;
    case c10d::ReduceOp::MIN: spec.op = client::ReduceOp::Min; break;
    case c10d::ReduceOp::MAX: spec.op = client::ReduceOp::Max; break;
    case c10d::ReduceOp::BAND: spec.op = client::ReduceOp::BAnd; break;
    case c10d::ReduceOp::BOR: spec.op = client::ReduceOp::BOr; break;
    case c10d::ReduceOp::BXOR: spec.op = client::ReduceOp::BXor; break;
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto factor = premul_factor(op);
      if (!factor) {
        throw_invalid(op_name, "PREMUL_SUM without a factor; build it with "
                               "torch.distributed._make_nccl_premul_sum(factor)");
      }
      spec.op = client::ReduceOp::PremulSum;
      spec.scale = *factor;
      break;
    }
    default:
      throw_unsupported(op_name, std::string("reduce op ") + reduce_op_name(op.op_) + " is not supported");
  }
  if (!ipc::reduce_op_supported(spec.op, dtype)) {
    throw_unsupported(op_name, std::string("reduce op ") + reduce_op_name(op.op_) + " is not defined for " +
                                   std::string(ipc::to_string(dtype)) +
                                   " tensors (AVG and PREMUL_SUM need floating types; BAND, BOR and BXOR "
                                   "need integer or bool types)");
  }
  return spec;
}

}  // namespace smddp::torch_plugin
