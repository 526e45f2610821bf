#include "ipc/names.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace smddp::ipc {

void check_job_id(std::string_view job_id) {
  if (job_id.empty() || job_id.size() > 48)
    throw std::invalid_argument("SMDDP_JOB_ID must be 1 to 48 characters, got '" + std::string(job_id) + "'");
  for (char c : job_id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok)
      throw std::invalid_argument("SMDDP_JOB_ID may hold only letters, digits, '_', '-' and '.', got '" +
                                  std::string(job_id) + "'");
  }
}

std::string segment_name(std::string_view job_id, int node_id) {
  check_job_id(job_id);
  return std::string(kSegmentPrefix) + std::string(job_id) + ".n" + std::to_string(node_id);
}

std::filesystem::path socket_dir() {
  if (const char* d = std::getenv("SMDDP_SOCKET_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::filesystem::path(x) / "smddp";
  return std::filesystem::path("/tmp") / ("smddp-" + std::to_string(::getuid()));
}

std::filesystem::path ensure_socket_dir() {
  auto dir = socket_dir();
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::system_error(errno, std::generic_category(), "cannot create socket directory " + dir.string());
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw std::system_error(errno, std::generic_category(), "cannot stat " + dir.string());
  if (!S_ISDIR(st.st_mode)) throw std::runtime_error(dir.string() + " is not a directory");
  if (st.st_uid != ::getuid())
    throw std::runtime_error("socket directory " + dir.string() + " belongs to uid " + std::to_string(st.st_uid) +
                             ", not to us (uid " + std::to_string(::getuid()) + ")");
  if ((st.st_mode & 0077) != 0 && ::chmod(dir.c_str(), 0700) != 0)
    throw std::system_error(errno, std::generic_category(), "cannot make " + dir.string() + " mode 0700");
  return dir;
}

std::filesystem::path socket_path(std::string_view job_id, int node_id) {
  check_job_id(job_id);
  return socket_dir() / (std::string(job_id) + ".n" + std::to_string(node_id) + ".sock");
}

}  // namespace smddp::ipc
