# The daemon's core library (everything but main) so tests can link it without MPI.
add_library(smddp_daemon_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cli.cpp
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/matcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fast_ledger.cpp
  ${CMAKE_CURRENT_LIST_DIR}/wait_for.cpp
  ${CMAKE_CURRENT_LIST_DIR}/worker_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_executor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arena_sources.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rank_reads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/supervisor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/job_cleanup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reserved_port.cpp
  ${CMAKE_CURRENT_LIST_DIR}/daemon.cpp
  ${CMAKE_CURRENT_LIST_DIR}/daemon_status.cpp
  ${CMAKE_CURRENT_LIST_DIR}/daemon_waits.cpp
  ${CMAKE_CURRENT_LIST_DIR}/daemon_host_fast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu_stats.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transport/fault_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transport/fault_injection.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/interface_choice.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/lifeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/node_card.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/rail_map.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/staging_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/allreduce_rs_ag.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/eager.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/reduce_scatter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/copies.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/alltoall.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/tuner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/segments.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/ring.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/halving_doubling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/allreduce_by_segments.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/reduce_scatter_by_segments.cpp
  ${CMAKE_CURRENT_LIST_DIR}/internode/allgather_by_segments.cpp)
target_link_libraries(smddp_daemon_core PUBLIC smddp_ipc smddp_host_reduce smddp_control
  Boost::headers spdlog::spdlog nlohmann_json::nlohmann_json Threads::Threads)

if(NOT SMDDP_ONLY_CORE)
  add_executable(smddp-daemon ${CMAKE_CURRENT_LIST_DIR}/main.cpp)
  target_link_libraries(smddp-daemon PRIVATE smddp_daemon_core MPI::MPI_C)
  if(TARGET smddp_transport)
    target_link_libraries(smddp-daemon PRIVATE smddp_transport)
    target_compile_definitions(smddp-daemon PRIVATE SMDDP_HAVE_FABRIC=1)
  endif()
  # mpi.h pulls in the C++ bindings unless told not to; we use the C API only.
  target_compile_definitions(smddp-daemon PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
endif()
target_link_libraries(smddp_daemon_core PUBLIC smddp_gpu)  # GPU path (issue 5)
