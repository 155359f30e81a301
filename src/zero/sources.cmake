# Sources of src/zero (the ZeRO stages: the flat partition, the gradient paths, one strategy per
# stage family), appended to the dscpp library.
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/strategy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reducer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_shard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/all_reduce.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reduce_scatter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shard_all_gather.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage0.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage1_2.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage3_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage3_schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage3_scopes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fetcher.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_call.cpp
  ${CMAKE_CURRENT_LIST_DIR}/released_reads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unit_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/init.cpp
  ${CMAKE_CURRENT_LIST_DIR}/muon_matrices.cpp)
