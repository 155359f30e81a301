// The torch-free part of safetensors: the length prefix and the JSON header (see the .h).
#include "io/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "dscpp/error.h"

namespace dscpp::safetensors {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
// Names the format defines that dscpp does not read (libtorch 1.13, its first target, had no
// type for them).
constexpr const char* kUnsupportedDtypes[] = {"U16", "U32", "U64", "F8_E5M2", "F8_E4M3"};

size_t parse_dtype(const std::string& name, const std::string& source, const std::string& tensor) {
  for (size_t i = 0; i < kNumDtypes; ++i) {
    if (name == kDtypeNames[i]) return i;
  }
  for (const char* u : kUnsupportedDtypes) {
    DSCPP_CHECK(name != u, IoError, "'", source, "': tensor '", tensor, "' has dtype ", name,
                ", which libtorch cannot hold. HINT: convert it (e.g. to I32/F32) when writing.");
  }
  DSCPP_FAIL(IoError, "'", source, "': tensor '", tensor, "' has unknown dtype \"", name, "\"");
}

}  // namespace

uint64_t header_length(const void* prefix8, uint64_t file_size, const std::string& source) {
  DSCPP_CHECK(file_size >= 8, IoError, "'", source, "' has ", file_size,
              " bytes, fewer than the 8-byte header length of a safetensors file. HINT: the "
              "file is truncated (torn write?) or not a safetensors file.");
  uint64_t n = 0;
  std::memcpy(&n, prefix8, 8);
  DSCPP_CHECK(n <= kMaxHeaderBytes && n <= file_size - 8, IoError, "'", source, "': header length ",
              n, " does not fit in the ", file_size,
              "-byte file. HINT: the file is truncated (torn write?) or not a safetensors file.");
  return n;
}

Header parse_header(const std::string& text, uint64_t data_len, const std::string& source) {
  // Duplicate top-level names would silently shadow each other: reject them.
  std::set<std::string> seen;
  std::string duplicate;
  ordered_json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event,
                                           ordered_json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      auto key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    DSCPP_FAIL(IoError, "'", source, "': the safetensors header is not valid JSON (", e.what(),
               "). HINT: the file is corrupt or not a safetensors file.");
  }
  DSCPP_CHECK(duplicate.empty(), IoError, "'", source, "': tensor '", duplicate,
              "' appears twice in the header");
  DSCPP_CHECK(j.is_object(), IoError, "'", source, "': the safetensors header is not an object");

  Header h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == kMetadataKey) {
      DSCPP_CHECK(v.is_object() || v.is_null(), IoError, "'", source,
                  "': __metadata__ must be an object of strings");
      if (v.is_null()) continue;
      for (auto m = v.begin(); m != v.end(); ++m) {
        DSCPP_CHECK(m.value().is_string(), IoError, "'", source, "': __metadata__ value of '",
                    m.key(), "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    DSCPP_CHECK(!name.empty(), IoError, "'", source, "': a tensor has an empty name");
    DSCPP_CHECK(v.is_object(), IoError, "'", source, "': the entry of tensor '", name,
                "' is not an object");
    for (auto f = v.begin(); f != v.end(); ++f) {
      DSCPP_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", IoError,
                  "'", source, "': tensor '", name, "' has an unknown field \"", f.key(), "\"");
    }
    DSCPP_CHECK(v.contains("dtype") && v["dtype"].is_string(), IoError, "'", source, "': tensor '",
                name, "' has no string \"dtype\"");
    DSCPP_CHECK(v.contains("shape") && v["shape"].is_array(), IoError, "'", source, "': tensor '",
                name, "' has no \"shape\" array");
    DSCPP_CHECK(
        v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
        IoError, "'", source, "': tensor '", name,
        "' has no \"data_offsets\" array of two numbers");
    HeaderEntry e;
    e.name = name;
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), source, name);
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      DSCPP_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                  IoError, "'", source, "': tensor '", name, "' has a shape entry ", d.dump(),
                  " that is not a non-negative integer");
      auto n = d.get<uint64_t>();
      DSCPP_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), IoError, "'",
                  source, "': tensor '", name, "' has an absurd dimension ", n);
      if (n != 0 && numel > std::numeric_limits<uint64_t>::max() / n) overflow = true;
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    for (const auto& o : v["data_offsets"]) {
      DSCPP_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0),
                  IoError, "'", source, "': tensor '", name, "' has a data offset ", o.dump(),
                  " that is not a non-negative integer");
    }
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    DSCPP_CHECK(e.begin <= e.end, IoError, "'", source, "': tensor '", name, "' has data_offsets [",
                e.begin, ", ", e.end, "] that end before they begin");
    DSCPP_CHECK(e.end <= data_len, IoError, "'", source, "': tensor '", name,
                "' has data_offsets [", e.begin, ", ", e.end, "] beyond the ", data_len,
                " bytes of data in the file. HINT: the file is truncated (torn write?).");
    const uint64_t item = kDtypeBytes[e.dtype];
    DSCPP_CHECK(!overflow && numel <= std::numeric_limits<uint64_t>::max() / item &&
                    numel * item == e.end - e.begin,
                IoError, "'", source, "': tensor '", name, "' has dtype ", kDtypeNames[e.dtype],
                " and shape ", v["shape"].dump(), " (", numel, " elements, ",
                overflow ? 0 : numel * item, " bytes) but data_offsets [", e.begin, ", ", e.end,
                "] span ", e.end - e.begin, " bytes");
    h.entries.push_back(std::move(e));
  }

  // The data section must be covered exactly: sorted by offset, each tensor starts where the
  // previous one ended, the last ends at the end of the file.
  std::vector<const HeaderEntry*> by_offset;
  for (const auto& e : h.entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const HeaderEntry* a, const HeaderEntry* b) {
                     return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
                   });
  uint64_t pos = 0;
  const HeaderEntry* prev = nullptr;
  for (const HeaderEntry* e : by_offset) {
    if (e->begin < pos) {
      DSCPP_FAIL(IoError, "'", source, "': tensor '", e->name, "' (bytes [", e->begin, ", ", e->end,
                 ")) overlaps tensor '", prev->name, "' (bytes [", prev->begin, ", ", prev->end,
                 "))");
    }
    DSCPP_CHECK(e->begin == pos, IoError, "'", source, "': bytes [", pos, ", ", e->begin,
                ") of the data section belong to no tensor (a hole before tensor '", e->name, "')");
    pos = e->end;
    prev = e;
  }
  DSCPP_CHECK(pos == data_len, IoError, "'", source, "': the tensors cover ", pos,
              " bytes but the ", "data section has ", data_len,
              " bytes (trailing bytes that belong to no tensor). HINT: the file is corrupt.");
  return h;
}

}  // namespace dscpp::safetensors
