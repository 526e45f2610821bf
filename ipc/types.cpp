#include "ipc/types.hpp"

#include <array>
#include <string>

namespace smddp::ipc {
namespace {
constexpr std::array<std::string_view, kDTypeCount> kDTypeNames = {
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"};
constexpr std::array<std::string_view, kReduceOpCount> kReduceNames = {
    "sum", "avg", "prod", "min", "max", "band", "bor", "bxor", "premul_sum"};
constexpr std::array<std::string_view, kOpTypeCount> kOpNames = {
    "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall",
    "barrier", "send", "recv", "gather", "scatter", "comm_create"};

template <class E, std::size_t N>
std::string_view name_of(E e, const std::array<std::string_view, N>& names) noexcept {
  auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : std::string_view{"invalid"};
}
template <class E, std::size_t N>
std::optional<E> parse(std::string_view s, const std::array<std::string_view, N>& names) noexcept {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}
}  // namespace

std::string_view to_string(DType t) noexcept { return name_of(t, kDTypeNames); }
std::string_view to_string(ReduceOp op) noexcept { return name_of(op, kReduceNames); }
std::string_view to_string(OpType op) noexcept { return name_of(op, kOpNames); }
std::string_view to_string(Status s) noexcept {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::InvalidRequest: return "invalid request";
    case Status::Mismatch: return "collective mismatch";
    case Status::PeerFailed: return "peer failed";
    case Status::Timeout: return "timeout";
    case Status::Unsupported: return "unsupported";
    case Status::Internal: return "internal error";
    case Status::Shutdown: return "shutdown";
  }
  return "invalid";
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  if (name == "float" || name == "fp32") return DType::Float32;
  if (name == "double" || name == "fp64") return DType::Float64;
  if (name == "half" || name == "fp16") return DType::Float16;
  if (name == "bf16") return DType::BFloat16;
  if (name == "int") return DType::Int32;
  return parse<DType>(name, kDTypeNames);
}
std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept {
  if (name == "product") return ReduceOp::Product;
  if (name == "average") return ReduceOp::Avg;
  return parse<ReduceOp>(name, kReduceNames);
}
std::optional<OpType> parse_op_type(std::string_view name) noexcept {
  return parse<OpType>(name, kOpNames);
}

bool reduce_op_supported(ReduceOp op, DType t) noexcept {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Product:
    case ReduceOp::Min:
    case ReduceOp::Max:
      return true;
    case ReduceOp::Avg:
    case ReduceOp::PremulSum:
      return is_floating(t);
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return !is_floating(t);
  }
  return false;
}

}  // namespace smddp::ipc
