// json_int (core/json_int.h): a JSON value is an integer only when it is a JSON integer inside the bounds.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/json_int.h"

namespace lily {
namespace {

using nlohmann::json;

TEST(JsonInt, IntegersInsideTheBoundsOnly) {
  EXPECT_EQ(json_int(json(0), 0, 10), 0);
  EXPECT_EQ(json_int(json(10), 0, 10), 10);
  EXPECT_EQ(json_int(json(-3), -3, 3), -3);
  EXPECT_EQ(json_int(json(uint64_t(7)), 0, 7), 7);
  EXPECT_EQ(json_int(json(INT64_MAX), 0, INT64_MAX), INT64_MAX);
  EXPECT_EQ(json_int(json(INT64_MIN), INT64_MIN, 0), INT64_MIN);
  EXPECT_FALSE(json_int(json(11), 0, 10));
  EXPECT_FALSE(json_int(json(-1), 0, 10));
  EXPECT_FALSE(json_int(json(uint64_t(1) << 63), 0, INT64_MAX));  // unsigned past INT64_MAX
  EXPECT_FALSE(json_int(json(uint64_t(5)), -10, -1));              // an upper bound below zero
}

// Floats (1e300, and a 43-digit number, which nlohmann parses as one), strings, null, arrays: never integers.
TEST(JsonInt, NothingElseIsAnInteger) {
  for (const char* text : {"1e300", "-1e300", "2.0", "1.5", "2811111111111111111111111111111111111111115", "\"7\"", "null",
                           "true", "[1]", "{}"}) {
    EXPECT_FALSE(json_int(json::parse(text), INT64_MIN, INT64_MAX)) << text;
    EXPECT_FALSE(json_int(nlohmann::ordered_json::parse(text), INT64_MIN, INT64_MAX)) << text;
  }
}

}  // namespace
}  // namespace lily
