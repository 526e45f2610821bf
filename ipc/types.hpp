// Enumerations shared by ranks and the daemon. Their numeric values are part of the
// shared-memory contract (kLayoutVersion): append, never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace smddp::ipc {

enum class DType : std::uint8_t {
  Float32 = 0,
  Float64 = 1,
  Float16 = 2,
  BFloat16 = 3,
  Int8 = 4,
  UInt8 = 5,
  Int32 = 6,
  Int64 = 7,
  Bool = 8,
};
inline constexpr int kDTypeCount = 9;

enum class ReduceOp : std::uint8_t {
  Sum = 0,
  Avg = 1,
  Product = 2,
  Min = 3,
  Max = 4,
  BAnd = 5,
  BOr = 6,
  BXor = 7,
  PremulSum = 8,  // multiply each input by RequestDesc::scale, then sum
};
inline constexpr int kReduceOpCount = 9;

enum class OpType : std::uint8_t {
  AllReduce = 0,
  Broadcast = 1,
  Reduce = 2,
  AllGather = 3,      // count = elements per rank (input); output holds size * count
  ReduceScatter = 4,  // count = elements per rank (output); input holds size * count
  AllToAll = 5,       // count = elements per peer block (even split) or see kFlagSplits
  Barrier = 6,
  Send = 7,
  Recv = 8,
  Gather = 9,   // count = elements per rank
  Scatter = 10, // count = elements per rank
  CommCreate = 11, // registers a communicator; aux holds the member global ranks (int32)
};
inline constexpr int kOpTypeCount = 12;

enum class Status : std::uint8_t {
  Ok = 0,
  InvalidRequest = 1,  // this rank's descriptor failed validation
  Mismatch = 2,        // ranks disagree on the collective's signature
  PeerFailed = 3,      // a rank or daemon of the job died
  Timeout = 4,         // not all ranks posted within the timeout
  Unsupported = 5,
  Internal = 6,
  Shutdown = 7,
};

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) noexcept {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

std::string_view to_string(DType t) noexcept;
std::string_view to_string(ReduceOp op) noexcept;
std::string_view to_string(OpType op) noexcept;
std::string_view to_string(Status s) noexcept;
std::optional<DType> parse_dtype(std::string_view name) noexcept;
std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept;
std::optional<OpType> parse_op_type(std::string_view name) noexcept;

// Collectives that take a reduce op, and collectives with a root.
constexpr bool reduces(OpType op) noexcept {
  return op == OpType::AllReduce || op == OpType::Reduce || op == OpType::ReduceScatter;
}
constexpr bool rooted(OpType op) noexcept {
  return op == OpType::Broadcast || op == OpType::Reduce || op == OpType::Gather || op == OpType::Scatter;
}

// Collectives that only move bytes: on the host path within a node their ranks may copy
// their outputs straight from the members' arenas (kFlagReadSources).
constexpr bool reads_sources(OpType op) noexcept {
  return op == OpType::AllGather || op == OpType::Broadcast || op == OpType::Gather || op == OpType::Scatter ||
         op == OpType::AllToAll;
}
// Host collectives whose ranks may read the members' arenas themselves within a node
// (kFlagReadSources): those that only move bytes copy their outputs from them, the reducing
// ones each reduce a share of the chunk there and copy the others' shares.
constexpr bool reads_arenas(OpType op) noexcept { return reads_sources(op) || reduces(op); }

// Whether `op` is defined for `t` (bitwise ops only for integers and bool; PREMUL_SUM and AVG
// only for floating types, as NCCL).
bool reduce_op_supported(ReduceOp op, DType t) noexcept;

}  // namespace smddp::ipc
