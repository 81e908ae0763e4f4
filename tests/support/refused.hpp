// fn() is refused with a tilelink::Error whose message holds `needle`: a CUDA failure, another
// refusal or no refusal at all fails the test. Shared by the CPU and GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tilelink/core/error.hpp"

namespace tilelink::test {

template <class Fn>
void expect_refused(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one saying '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace tilelink::test
