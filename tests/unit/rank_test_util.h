// Helpers of the tests whose ranks run as threads (test_communicator.cpp, test_tcp_group.cpp).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"

namespace nf4flash {

// Each rank's failure, in rank order, is "" (none).
inline void expect_no_errors(const std::vector<std::string>& errs) {
  for (size_t r = 0; r < errs.size(); ++r) EXPECT_EQ(errs[r], "") << "rank " << r;
}

// v as an F32 activation [rows, cols] (host memory).
inline Act f32_act(std::vector<float>& v, int64_t rows, int64_t cols) { return Act{v.data(), DType::F32, rows, cols}; }

}  // namespace nf4flash
