// Shared by the validator's tests: whether `d` is refused, checking the reason names `needle`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ipc/validate.hpp"

namespace smddp::ipc::testing {

inline bool fails(const RequestDesc& d, const ValidationContext& c, const char* needle) {
  auto err = validate_request(d, c);
  if (!err) return false;
  EXPECT_NE(err->find(needle), std::string::npos) << *err;
  return true;
}

}  // namespace smddp::ipc::testing
