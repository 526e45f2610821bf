/* LD_PRELOAD helper for crash diagnosis: on SIGSEGV/SIGBUS/SIGABRT prints the native stack
 * (glibc backtrace) to stderr, then re-raises. Build: cc -shared -fPIC -o segv_bt.so segv_backtrace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_crash(int sig) {
  void* frames[128];
  int n = backtrace(frames, 128);
  static const char msg[] = "\n*** smddp diag: native backtrace ***\n";
  (void)!write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_crash;
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
