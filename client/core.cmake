add_library(smddp_client
  ${CMAKE_CURRENT_LIST_DIR}/client.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arena_allocator.cpp)
target_link_libraries(smddp_client PUBLIC smddp_ipc Threads::Threads)
