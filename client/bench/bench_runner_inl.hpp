// bench_main: a template so each program builds its Backend its own way (and after MPI_Init).
#pragma once

#include <exception>
#include <iostream>

namespace smddp::bench {

template <class MakeBackend>
int bench_main(std::string_view program, int argc, char** argv, MakeBackend make_backend) {
  Options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << program << ": " << e.what() << "\n" << usage(program);
    return 2;
  }
  if (opts.help) {
    std::cout << usage(program);
    return 0;
  }
  try {
    auto backend = make_backend();
    return run_benchmark(opts, *backend, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace smddp::bench
