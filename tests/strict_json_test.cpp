// The JSON reader for others' files (io/strict_json.h): its limits at their boundaries, its
// refusals with their messages, and a large header of ordinary entries.
#include <string>

#include <fmt/format.h>

#include "io/strict_json.h"
#include "io_test_util.h"
#include "qkv/io.h"
#include "test_util.h"

namespace qkv {
namespace {

using detail::kStrictJsonMaxDepth;
using detail::kStrictJsonMaxValues;
using detail::parse_strict_json;
using test::expect_error;

nlohmann::json parse(const std::string& text) { return parse_strict_json(text, "t.json", "the text"); }

TEST(StrictJson, NestsUpToTheLimit) {
  const std::size_t n = kStrictJsonMaxDepth;
  EXPECT_EQ(parse(std::string(n, '[') + std::string(n, ']')).size(), n > 1 ? 1u : 0u);
  std::string objects;
  for (std::size_t i = 0; i + 1 < n; ++i) objects += R"({"a":)";
  objects += "{}" + std::string(n - 1, '}');
  EXPECT_TRUE(parse(objects).is_object());
  expect_error([&] { parse(std::string(n + 1, '[') + std::string(n + 1, ']')); },
               {"t.json: the text nests deeper than 16 levels"});
  expect_error([&] { parse("{\"a\":" + objects + "}"); }, {"t.json: the text nests deeper than 16 levels"});
}

// An array of `values` - 1 zeros: `values` values.
std::string zeros(std::size_t values) {
  std::string s = "[0";
  s.reserve(2 * values);
  for (std::size_t i = 2; i < values; ++i) s += ",0";
  return s + "]";
}

TEST(StrictJson, HoldsUpToTheValueLimit) {
  EXPECT_EQ(parse(zeros(kStrictJsonMaxValues)).size(), kStrictJsonMaxValues - 1);
  expect_error([&] { parse(zeros(kStrictJsonMaxValues + 1)); }, {"t.json: the text holds more than 2097152 values"});
  // Empty containers count: the tree of "[[],[],...]" costs tens of bytes for each 3 of text.
  std::string empties = "[[]";
  for (std::size_t i = 2; i <= kStrictJsonMaxValues; ++i) empties += ",[]";
  expect_error([&] { parse(empties + "]"); }, {"holds more than 2097152 values"});
}

TEST(StrictJson, RefusesWithTheReason) {
  expect_error([&] { parse(R"({"k": 1, "k": 2})"); }, {"t.json: the text has the key \"k\" twice in one object"});
  expect_error([&] { parse(R"([{"k": 1}, {"k": 2, "j": {"k": 3, "k": 4}}])"); }, {"the key \"k\" twice"});
  expect_error([&] { parse(R"({"k": 1)"); }, {"t.json: the text is not valid JSON", "parse error"});
  expect_error([&] { parse(R"({"k": 1} x)"); }, {"the text is not valid JSON"});
  expect_error([&] { parse(std::string("{}\0x", 4)); }, {"the text holds a NUL byte at offset 2"});
  // Keys repeat freely across objects.
  EXPECT_EQ(parse(R"([{"k": 1}, {"k": 2}])").size(), 2u);
}

// A safetensors header of many ordinary tensors loads whole (the reader's checks stay linear in
// the header's size).
TEST(StrictJson, ManyTensorsLoad) {
  test::TempDir dir;
  constexpr int kTensors = 200000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i)
    header += fmt::format(R"({}"t{}": {{"dtype": "F32", "shape": [1], "data_offsets": [{}, {}]}})", i ? "," : "", i,
                          4 * i, 4 * i + 4);
  header += "}";
  const uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += header + std::string(4 * kTensors, '\0');
  const std::string path = dir.file("many.safetensors");
  test::write_raw(path, bytes);
  const TensorMap m = load_safetensors(path);
  ASSERT_EQ(m.size(), static_cast<std::size_t>(kTensors));
  EXPECT_EQ(m.at("t199999").numel(), 1);
}

}  // namespace
}  // namespace qkv
