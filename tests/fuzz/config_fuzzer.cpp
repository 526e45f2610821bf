// libFuzzer target: the daemon's configuration, as an INI file (first byte even) or as
// `--set SECTION.KEY=VALUE` overrides, one a line (first byte odd). Whatever the bytes, the
// daemon either takes the configuration or refuses it with std::invalid_argument and a message;
// anything else (another exception, a crash) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string path;
  std::vector<std::string> overrides;
  if (data[0] % 2 == 0) {
    path = "/tmp/smddp-fuzz-config-" + std::to_string(::getpid()) + ".ini";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  } else {
    std::size_t from = 0;
    while (from <= text.size()) {
      const std::size_t nl = text.find('\n', from);
      overrides.push_back(text.substr(from, nl == std::string::npos ? std::string::npos : nl - from));
      if (nl == std::string::npos) break;
      from = nl + 1;
    }
  }
  try {
    const auto c = smddp::daemon::DaemonConfig::load(path, overrides);
    // What the daemon sizes from it must be usable.
    if (c.arena_bytes == 0 || c.chunk_bytes == 0 || c.fabric_endpoints < 1) {
      std::fprintf(stderr, "accepted a configuration the daemon cannot run with\n");
      std::abort();
    }
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).empty()) {
      std::fprintf(stderr, "refused without a reason\n");
      std::abort();
    }
  }
  if (!path.empty()) ::unlink(path.c_str());
  return 0;
}
