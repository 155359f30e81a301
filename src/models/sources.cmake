# Sources of src/models: the built-in GPT.
target_sources(dscpp PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gpt.cpp)
