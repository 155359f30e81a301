# Test sources of tests/models for engine_tests: the GPT, data, safetensors and the golden
# comparison with PyTorch (tests/golden/gpt_reference.py).
list(APPEND DSCPP_ENGINE_TEST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/gpt_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_ops_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/golden_test.cpp
)
