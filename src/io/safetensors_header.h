// The safetensors header (format in include/dscpp/safetensors.h): its length prefix and its JSON,
// validated against the file before any tensor byte is read. Kept free of libtorch so that the
// parser builds into dscpp_base and runs under the sanitizers and libFuzzer with the config and
// manifest parsers (tests/faults/parsers_fuzz.cpp); safetensors.cpp maps the dtypes to libtorch's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dscpp::safetensors {

// The header key of the file's string metadata (not a tensor).
inline constexpr const char* kMetadataKey = "__metadata__";

// The dtypes the format defines that dscpp reads and writes, by the format's names (the ones
// libtorch 1.13, its first target, could hold); safetensors.cpp lists libtorch's types in the same order.
constexpr const char* kDtypeNames[] = {"BOOL", "U8",  "I8",   "I16", "I32",
                                       "I64",  "F16", "BF16", "F32", "F64"};
constexpr size_t kDtypeBytes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
constexpr size_t kNumDtypes = sizeof(kDtypeBytes) / sizeof(kDtypeBytes[0]);
static_assert(sizeof(kDtypeNames) / sizeof(kDtypeNames[0]) == kNumDtypes);

// One tensor's header entry after validation.
struct HeaderEntry {
  std::string name;
  size_t dtype = 0;  // index into kDtypeNames
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // bytes, relative to the start of the data section
  uint64_t end = 0;
};

struct Header {
  std::vector<HeaderEntry> entries;  // file (header) order
  std::map<std::string, std::string> metadata;
};

// The header length the first 8 bytes of a `file_size`-byte file declare (little-endian), checked
// to fit in the file and under the format's 100 MB limit. Throws IoError naming `source`.
uint64_t header_length(const void* prefix8, uint64_t file_size, const std::string& source);

// Parses and validates the JSON header `text` against a data section of `data_len` bytes: known
// dtypes, shapes matching the byte spans, spans covering the data exactly (no overlap, hole or
// trailing byte), no duplicate names. Throws IoError naming `source` and what is wrong.
Header parse_header(const std::string& text, uint64_t data_len, const std::string& source);

}  // namespace dscpp::safetensors
