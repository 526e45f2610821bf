#include "client/bench/bench_runner.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <vector>

#include "client/bench/check_values.hpp"

namespace smddp::bench {
namespace {

// Page-aligned host memory, as a DMA-friendly allocator would give.
class HostBuffer {
 public:
  explicit HostBuffer(std::uint64_t bytes) {
    constexpr std::size_t kAlign = 4096;
    const std::size_t rounded = (std::max<std::uint64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, rounded);  // touch every page before anything is timed
  }
  std::byte* get() const noexcept { return data_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
};

struct Row {
  Layout layout;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  std::uint64_t wrong = 0;
};

std::string format(const char* fmt, auto... args) {
  char line[256];
  std::snprintf(line, sizeof line, fmt, args...);
  return line;
}

void print_header(const Options& o, const Backend& b, std::ostream& out) {
  std::string desc = b.describe();
  for (std::size_t start = 0; start < desc.size();) {
    const auto end = std::min(desc.find('\n', start), desc.size());
    out << "# " << desc.substr(start, end - start) << "\n";
    start = end + 1;
  }
  out << format("# op %s  minBytes %llu maxBytes %llu step: ", std::string(to_string(o.op)).c_str(),
                static_cast<unsigned long long>(o.min_bytes), static_cast<unsigned long long>(o.max_bytes));
  if (o.step_factor > 1.0)
    out << format("%g(factor)", o.step_factor);
  else
    out << format("%llu(bytes)", static_cast<unsigned long long>(o.step_bytes));
  out << format(" warmup iters: %d iters: %d validation: %d\n", o.warmup, o.iters, o.check ? 1 : 0);
  out << "# Out-of-place only; each call is waited for before the next is issued. time: rank 0's\n"
         "# average over the iterations, all ranks barriered before each timed batch. #wrong: summed\n"
         "# over ranks, from one more run on fresh inputs after the timed ones.\n"
         "#\n";
  out << "#                                                              out-of-place\n"
         "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
         "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       \n";
}

void print_row(const Options& o, const Row& r, std::ostream& out) {
  const auto elem = ipc::dtype_size(o.dtype);
  const std::string type(ipc::to_string(o.dtype));
  const std::string redop = is_reduction(o.op) ? std::string(ipc::to_string(o.redop)) : "none";
  const int root = has_root(o.op) ? o.root : -1;
  out << format("%12llu  %12llu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f", static_cast<unsigned long long>(r.layout.bytes),
                static_cast<unsigned long long>(r.layout.bytes / elem), type.c_str(), redop.c_str(), root, r.time_us,
                r.algbw, r.busbw);
  if (o.check)
    out << format("  %5llu\n", static_cast<unsigned long long>(r.wrong));
  else
    out << "    N/A\n";
  out.flush();
}

// Sizes of the sweep after rounding, without the duplicates rounding makes at the small end.
std::vector<Layout> sweep_layouts(const Options& o, int nranks) {
  std::vector<Layout> layouts;
  for (const auto bytes : sweep_sizes(o)) {
    const auto l = layout_for(o.op, bytes, ipc::dtype_size(o.dtype), nranks);
    if (layouts.empty() || layouts.back().bytes != l.bytes) layouts.push_back(l);
  }
  return layouts;
}

class Sweep {
 public:
  Sweep(const Options& o, Backend& b, const std::vector<Layout>& layouts, std::ostream& err)
      : o_(o),
        b_(b),
        err_(err),
        in_(largest(layouts, &Layout::in_elems) * elem()),
        out_(largest(layouts, &Layout::out_elems) * elem()) {
    // The input pattern does not depend on the size, so one fill serves the whole sweep.
    fill_input(o_.op, o_.dtype, o_.redop, b_.rank(), in_.get(), largest(layouts, &Layout::in_elems));
  }

  Row measure(const Layout& l) {
    const Call call{in_.get(), out_.get(), l.count, o_.dtype, o_.redop, o_.root};
    for (int i = 0; i < o_.warmup; ++i) b_.run(o_.op, call);
    b_.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o_.iters; ++i) b_.run(o_.op, call);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;

    Row r;
    r.layout = l;
    const double seconds = elapsed.count() / o_.iters;
    r.time_us = seconds * 1e6;
    r.algbw = seconds > 0 ? static_cast<double>(l.bytes) / seconds / 1e9 : 0.0;
    r.busbw = r.algbw * bus_factor(o_.op, b_.size());
    if (o_.check) r.wrong = b_.sum_over_ranks(checked_run(call, l));
    return r;
  }

  std::uint64_t local_wrong() const noexcept { return local_wrong_; }

 private:
  static std::uint64_t largest(const std::vector<Layout>& layouts, std::uint64_t Layout::*elems) {
    std::uint64_t most = 0;
    for (const auto& l : layouts) most = std::max(most, l.*elems);
    return most;
  }
  std::size_t elem() const noexcept { return ipc::dtype_size(o_.dtype); }

  // One more run on a poisoned output, then this rank's count of wrong elements.
  std::uint64_t checked_run(const Call& call, const Layout& l) {
    poison(out_.get(), l.out_elems * elem());
    if (is_in_place(o_.op) && b_.rank() == o_.root) std::memcpy(out_.get(), in_.get(), l.in_elems * elem());
    b_.run(o_.op, call);
    const auto check = check_output(o_.op, o_.dtype, o_.redop, l, b_.rank(), b_.size(), o_.root, out_.get());
    if (check.wrong)
      err_ << "rank " << b_.rank() << ": " << to_string(o_.op) << " of " << l.bytes << " bytes: " << check.wrong
           << " wrong: " << check.first_wrong << "\n";
    local_wrong_ += check.wrong;
    return check.wrong;
  }

  const Options& o_;
  Backend& b_;
  std::ostream& err_;
  HostBuffer in_;
  HostBuffer out_;
  std::uint64_t local_wrong_ = 0;
};

}  // namespace

int run_benchmark(const Options& o, Backend& b, std::ostream& out, std::ostream& err) {
  const bool reporter = b.rank() == 0;
  const auto fail = [&](const std::string& why) {
    err << "rank " << b.rank() << ": " << why << "\n";
    err.flush();
    return 1;
  };
  if (has_root(o.op) && o.root >= b.size())
    return fail("root " + std::to_string(o.root) + " is not a rank (" + std::to_string(b.size()) + " ranks)");
  if (const auto why = b.unsupported(o.op, o); !why.empty()) return fail(why);

  const auto layouts = sweep_layouts(o, b.size());
  Sweep sweep(o, b, layouts, err);
  if (reporter) print_header(o, b, out);
  double busbw_sum = 0;
  std::uint64_t wrong_total = 0;
  int rows = 0;
  for (const auto& layout : layouts) {
    Row r;
    try {
      r = sweep.measure(layout);
    } catch (const std::exception& e) {
      return fail(std::string(to_string(o.op)) + " of " + std::to_string(layout.bytes) + " bytes failed: " + e.what());
    }
    if (reporter) print_row(o, r, out);
    busbw_sum += r.busbw;
    wrong_total += r.wrong;
    ++rows;
  }
  if (reporter) {
    out << format("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong_total),
                  wrong_total ? "FAILED" : "OK");
    out << format("# Avg bus bandwidth    : %g \n#\n", rows ? busbw_sum / rows : 0.0);
    out.flush();
  }
  // A rank that saw wrong data fails on its own too, whatever the summed count said.
  if (wrong_total || sweep.local_wrong()) {
    if (sweep.local_wrong()) err << "rank " << b.rank() << ": " << sweep.local_wrong() << " wrong elements\n";
    return 1;
  }
  return 0;
}

}  // namespace smddp::bench
