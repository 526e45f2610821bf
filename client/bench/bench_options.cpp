#include "client/bench/bench_options.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>

namespace smddp::bench {
namespace {

std::string str(std::string_view s) { return std::string(s); }

template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end != text.data() + text.size())
    throw UsageError(str(flag) + ": '" + str(text) + "' is not a number");
  return v;
}

double parse_double(std::string_view flag, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size()) throw UsageError(str(flag) + ": '" + s + "' is not a number");
  return v;
}

}  // namespace

std::uint64_t parse_size(std::string_view text) {
  if (text.empty()) throw UsageError("empty size");
  std::uint64_t shift = 0;
  switch (text.back()) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    default: break;
  }
  if (shift) text.remove_suffix(1);
  const auto v = parse_number<std::uint64_t>("size", text);
  if (v > (std::numeric_limits<std::uint64_t>::max() >> shift)) throw UsageError("size '" + str(text) + "' is too large");
  return v << shift;
}

std::string usage(std::string_view program) {
  return "usage: " + str(program) +
         " [-o " + str(collective_names()) + "] [-b MINBYTES] [-e MAXBYTES]\n"
         "       [-f FACTOR | -i STEPBYTES] [-d DTYPE] [-r REDOP] [-R ROOT] [-c 0|1] [-n ITERS] [-w WARMUP]\n"
         "  sizes take K/M/G suffixes (powers of 1024); DTYPE: float32 float64 float16 bfloat16 int8 uint8\n"
         "  int32 int64 bool (or float, half, bf16, double, int); REDOP: sum prod min max avg band bor bxor\n"
         "  premul_sum (scale 0.5). -c 1 (default) checks every result and exits 1 on a wrong element.\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool have_factor = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      continue;
    }
    if (flag == "-z") continue;  // nccl-tests' blocking flag: every call here blocks anyway
    if (flag.size() != 2 || flag[0] != '-') throw UsageError("unknown argument '" + str(flag) + "'");
    if (i + 1 >= argc) throw UsageError(str(flag) + " needs a value");
    const std::string_view value = argv[++i];
    switch (flag[1]) {
      case 'o': {
        const auto c = parse_collective(value);
        if (!c) throw UsageError("-o: unknown operation '" + str(value) + "' (one of " + str(collective_names()) + ")");
        o.op = *c;
        break;
      }
      case 'b': o.min_bytes = parse_size(value); break;
      case 'e': o.max_bytes = parse_size(value); break;
      case 'f':
        o.step_factor = parse_double("-f", value);
        have_factor = true;
        break;
      case 'i': o.step_bytes = parse_size(value); break;
      case 'd': {
        const auto t = ipc::parse_dtype(value);
        if (!t) throw UsageError("-d: unknown dtype '" + str(value) + "'");
        o.dtype = *t;
        break;
      }
      case 'r': {
        const auto r = ipc::parse_reduce_op(value);
        if (!r) throw UsageError("-r: unknown reduce op '" + str(value) + "'");
        o.redop = *r;
        break;
      }
      case 'R': o.root = parse_number<int>("-R", value); break;
      case 'c': o.check = parse_number<int>("-c", value) != 0; break;
      case 'n': o.iters = parse_number<int>("-n", value); break;
      case 'w': o.warmup = parse_number<int>("-w", value); break;
      default: throw UsageError("unknown flag '" + str(flag) + "'");
    }
  }
  if (o.max_bytes < o.min_bytes) throw UsageError("-e must not be below -b");
  if (have_factor && o.step_factor < 1.0) throw UsageError("-f must be at least 1");
  if (o.step_factor <= 1.0 && o.step_bytes == 0 && o.max_bytes > o.min_bytes)
    throw UsageError("-i 0 with -f 1 would never reach -e");
  if (o.iters < 1) throw UsageError("-n must be at least 1");
  if (o.warmup < 0) throw UsageError("-w must not be negative");
  if (o.root < 0) throw UsageError("-R must not be negative");
  if (is_reduction(o.op) && !ipc::reduce_op_supported(o.redop, o.dtype))
    throw UsageError("reduce op " + str(ipc::to_string(o.redop)) + " is not defined for " +
                     str(ipc::to_string(o.dtype)));
  return o;
}

std::vector<std::uint64_t> sweep_sizes(const Options& o) {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    std::uint64_t next = 0;
    if (o.step_factor > 1.0)
      next = std::max(s + 1, static_cast<std::uint64_t>(static_cast<double>(s) * o.step_factor));
    else
      next = s + o.step_bytes;
    if (next <= s) break;  // a factor too small to move, or overflow
    s = next;
  }
  return sizes;
}

}  // namespace smddp::bench
