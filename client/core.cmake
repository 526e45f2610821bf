add_library(smddp_client
  ${CMAKE_CURRENT_LIST_DIR}/client.cpp
  ${CMAKE_CURRENT_LIST_DIR}/communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/staging.cpp
  ${CMAKE_CURRENT_LIST_DIR}/completions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/op_order.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arena_reads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arena_shares.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_fast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/copy_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_fast_path.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arena_allocator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/orphan_watch.cpp)
target_link_libraries(smddp_client PUBLIC smddp_ipc smddp_host_reduce Threads::Threads)

# How GPU collectives decompose into steps (client/gpu/schedule.hpp): plain C++, so it is part
# of the core and of the sanitizer builds; the CUDA executor that runs it is in client/gpu.
add_library(smddp_gpu_schedule STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu/schedule.cpp ${CMAKE_CURRENT_LIST_DIR}/gpu/hier_schedule.cpp)
target_link_libraries(smddp_gpu_schedule PUBLIC smddp_ipc)
