// libFuzzer target: smddp-daemon's command line, the input split into words at NUL bytes. The
// parser either returns arguments or refuses with std::invalid_argument and a message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/cli.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args;
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(word);
      word.clear();
    } else {
      word.push_back(static_cast<char>(data[i]));
    }
  }
  if (!word.empty()) args.push_back(word);
  try {
    const auto a = smddp::daemon::parse_daemon_args(args);
    if (a.nproc_per_node < 1 || a.num_nodes < 1 || a.node_id < 0 || a.node_id >= a.num_nodes) {
      std::fprintf(stderr, "accepted a layout the daemon cannot run: %d ranks a node, node %d of %d\n",
                   a.nproc_per_node, a.node_id, a.num_nodes);
      std::abort();
    }
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).empty()) {
      std::fprintf(stderr, "refused without a reason\n");
      std::abort();
    }
  }
  return 0;
}
