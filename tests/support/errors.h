// error_of<E>(fn): the message of the error of type E (default: any dscpp::Error) that fn
// throws, so a test can assert on what a message says. Throwing nothing, or another type, is a
// test failure (and returns "").
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "dscpp/error.h"

namespace dscpp::testing {

template <typename E = dscpp::Error, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

}  // namespace dscpp::testing
