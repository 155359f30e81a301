# Sources of src/comm: the rendezvous store's server, wire format and the job secret (dscpp_base,
# no libtorch); the communicator over c10d (Gloo, NCCL), shared memory between ranks on one host,
# rings, the sync monitor, the comms logger, the store's c10d client and the rendezvous (dscpp).
target_sources(dscpp_base PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/job_secret.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_server.cpp
  ${CMAKE_CURRENT_LIST_DIR}/store_wire.cpp)
target_sources(dscpp PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/store_client.cpp
  ${CMAKE_CURRENT_LIST_DIR}/communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c10d_communicator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hierarchy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quantized_reduce.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sync_monitor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/comms_logger.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rendezvous.cpp)
