#include "ipc/cross_memory.hpp"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace smddp::ipc {

namespace {

// Yama's ptrace_scope, or -1 where Yama is not in the kernel.
int yama_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (!(f >> scope)) return -1;
  return scope;
}

}  // namespace

std::optional<std::string> peer_reads_unavailable() {
  // A read of this process's own memory fails the same way as a peer's where the system call
  // itself is refused (ENOSYS, or EPERM from a seccomp profile).
  const std::uint64_t probe = 0x5eed;
  std::uint64_t copy = 0;
  iovec local{&copy, sizeof copy};
  iovec remote{const_cast<std::uint64_t*>(&probe), sizeof probe};
  if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof probe) || copy != probe)
    return std::string("process_vm_readv is refused here (") + std::strerror(errno) + ")";
  if (const int scope = yama_scope(); scope >= 2)
    return "Yama's ptrace_scope is " + std::to_string(scope) +
           " (/proc/sys/kernel/yama/ptrace_scope): processes may not read their siblings' memory";
  return std::nullopt;
}

void allow_peer_reads() {
  if (yama_scope() == 1) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

void read_peer(int pid, std::uint64_t address, std::byte* out, std::size_t bytes) {
  std::size_t done = 0;
  while (done < bytes) {
    iovec local{out + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)), bytes - done};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw std::runtime_error("reading " + std::to_string(bytes) + " bytes of process " + std::to_string(pid) +
                               "'s memory with process_vm_readv failed at byte " + std::to_string(done) + ": " +
                               (got < 0 ? std::strerror(errno) : "nothing read"));
    done += static_cast<std::size_t>(got);  // a partial read stops at a page the kernel could not copy
  }
}

}  // namespace smddp::ipc
