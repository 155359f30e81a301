// SplitMix64: the small, portable random number generator behind the built-in task and the
// shuffled sample order. It is specified bit for bit (Steele, Lea, Flood 2014; the reference
// constants) so that tests/golden/gpt_reference.py can reproduce every draw in Python, and so
// that the data order never depends on the libtorch version.
#pragma once

#include <cstdint>

namespace dscpp::data {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// The SplitMix64 finaliser: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A stream keyed by (seed, a, b): state = mix64(mix64(seed ^ kGoldenGamma) ^ a) ^ b, and each
// next() adds kGoldenGamma to the state and returns mix64(state).
class SplitMix64 {
 public:
  SplitMix64(uint64_t seed, uint64_t a, uint64_t b)
      : state_(mix64(mix64(seed ^ kGoldenGamma) ^ a) ^ b) {}
  uint64_t next() {
    state_ += kGoldenGamma;
    return mix64(state_);
  }
  // A draw in [0, n) (modulo; the bias, below n / 2^64, does not matter here).
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// Stream tags, so the task and the sampler never share a stream for the same seed.
constexpr uint64_t kTaskStream = 0x7461736Bull;     // "task"
constexpr uint64_t kShuffleStream = 0x73687566ull;  // "shuf"

}  // namespace dscpp::data
