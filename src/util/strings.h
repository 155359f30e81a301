// Small string helpers shared across dscpp: case folding, trimming, splitting, joining, and the
// edit distance behind every "did you mean ...?" in an error message. Pure functions, no state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dscpp {

// ASCII lower case ("AdamW" -> "adamw"). Non-ASCII bytes are left as they are.
std::string to_lower(std::string_view s);

// True when a and b are equal ignoring ASCII case.
bool iequals(std::string_view a, std::string_view b);

// s without leading and trailing whitespace (space, tab, CR, LF, FF, VT).
std::string trim(std::string_view s);

// Splits on every `sep`; keeps empty pieces ("a,,b" -> {"a", "", "b"}; "" -> {""}).
std::vector<std::string> split(std::string_view s, char sep);

// parts joined with sep between them.
std::string join(const std::vector<std::string>& parts, std::string_view sep);

// Lower-case hexadecimal, two digits per byte.
std::string to_hex(const void* data, std::size_t n);

// Optimal-string-alignment Damerau-Levenshtein distance: insertions, deletions,
// substitutions and transpositions of adjacent characters each cost 1
// ("pin_memroy" -> "pin_memory" is 1). Case-sensitive; O(|a| * |b|).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `word` for a "did you mean" suggestion, compared ignoring case, or
// "" when none is close: the best distance must be at most max(1, |word| / 3). Ties go to the
// candidate listed first.
std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace dscpp
