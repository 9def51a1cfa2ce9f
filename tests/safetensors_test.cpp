// .safetensors: round trips with metadata, files from an independent Python writer (struct +
// json, F32/F64/F16/BF16), and every malformed file the reader refuses.
#include <unistd.h>

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "io_test_util.h"
#include "qkv/io.h"
#include "qkv/out_of_memory.h"
#include "test_util.h"

namespace qkv {
namespace {

using test::expect_error;
using test::read_raw;
using test::TempDir;
using test::write_raw;

// A file with a hand-written JSON header and `buffer_bytes` bytes of buffer.
std::string make_st(const std::string& header, std::size_t buffer_bytes) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += header;
  for (std::size_t i = 0; i < buffer_bytes; ++i) out += static_cast<char>(i * 37);
  return out;
}

TEST(Safetensors, RoundTripWithMetadataStridesAndEdgeShapes) {
  test::Rng rng("Safetensors.RoundTrip");
  TempDir dir;
  Tensor<float> w = rng.normal32({3, 59});
  Tensor<float> b = rng.normal32({1});
  Tensor<float> q = rng.normal32({2, 1, 3, 5});
  Tensor<float> s = rng.normal32(std::vector<int64_t>{});
  Tensor<float> empty({0, 4});
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(dir.file("m.safetensors"),
                   {{"w_t", w.cview().transposed(0, 1)},
                    {"b", b.cview()},
                    {"q", q.cview()},
                    {"scalar", s.cview()},
                    {"empty", empty.cview()}},
                   meta);
  std::map<std::string, std::string> meta2;
  TensorMap m = load_safetensors(dir.file("m.safetensors"), &meta2);
  EXPECT_EQ(meta2, meta);
  ASSERT_EQ(m.size(), 5u);
  const Tensor<float>& wt = m.at("w_t");
  ASSERT_EQ(wt.rank(), 2);
  ASSERT_EQ(wt.dim(0), 59);
  for (int i = 0; i < 59; ++i)
    for (int j = 0; j < 3; ++j) ASSERT_EQ(wt[i * 3 + j], w[j * 59 + i]);
  EXPECT_EQ(std::memcmp(m.at("q").data(), q.data(), sizeof(float) * q.numel()), 0);
  EXPECT_EQ(m.at("q").rank(), 4);
  EXPECT_EQ(m.at("b")[0], b[0]);
  EXPECT_EQ(m.at("scalar").rank(), 0);
  EXPECT_EQ(m.at("scalar")[0], s[0]);
  EXPECT_EQ(m.at("empty").numel(), 0);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});
}

// The reference format as written by hand in Python: F32, F64, F16 and BF16 tensors, plus the
// float32 each value must load as.
TEST(Safetensors, ReadsAnIndependentPythonWriter) {
  test::Rng rng("Safetensors.Python");
  TempDir dir;
  std::string script = fmt::format(R"(
import sys, json, struct, numpy as np
d = sys.argv[1]; rng = np.random.default_rng({})
f32 = rng.standard_normal((3, 5)).astype('<f4')
f64 = rng.standard_normal((2, 3)) * 1e3
f16 = rng.standard_normal((7,)).astype('<f2')
src = rng.standard_normal((2, 2, 3)).astype('<f4')
bf16 = (src.view('<u4') >> 16).astype('<u2')          # truncated bfloat16 bits
i64 = rng.integers(-1000, 1000, (4,)).astype('<i8')
tensors = [('f32', 'F32', f32), ('f64', 'F64', f64.astype('<f8')), ('half', 'F16', f16), ('bf', 'BF16', bf16),
           ('ints', 'I64', i64)]
header, buf = {{}}, b''
for name, dt, a in tensors:
  raw = a.tobytes()
  header[name] = {{'dtype': dt, 'shape': list(a.shape), 'data_offsets': [len(buf), len(buf) + len(raw)]}}
  buf += raw
header['__metadata__'] = {{'source': 'python'}}
h = json.dumps(header).encode()
with open(f'{{d}}/py.safetensors', 'wb') as f:
  f.write(struct.pack('<Q', len(h)) + h + buf)
expected = [f32, f64.astype('<f4'), f16.astype('<f4'), (bf16.astype('<u4') << 16).view('<f4'), i64.astype('<f4')]
for (name, _, _), e in zip(tensors, expected):
  np.ascontiguousarray(e, dtype='<f4').tofile(f'{{d}}/{{name}}.f32')
)",
                                   rng.uniform_int(0, 1 << 30));
  ASSERT_EQ(test::run_python(script, dir.path()), 0);
  std::map<std::string, std::string> meta;
  TensorMap m = load_safetensors(dir.file("py.safetensors"), &meta);
  EXPECT_EQ(meta.at("source"), "python");
  ASSERT_EQ(m.size(), 5u);
  for (std::string name : {"f32", "f64", "half", "bf", "ints"}) {
    SCOPED_TRACE(name);
    std::string raw = read_raw(dir.file(name + ".f32"));
    const Tensor<float>& t = m.at(name);
    ASSERT_EQ(static_cast<std::size_t>(t.numel()) * 4, raw.size());
    EXPECT_EQ(std::memcmp(t.data(), raw.data(), raw.size()), 0);
  }
  EXPECT_EQ(m.at("bf").rank(), 3);
  EXPECT_EQ(m.at("bf").dim(2), 3);
}

// What we write parses with a hand-written Python reader: 8-byte aligned header, sorted
// names, contiguous F32 data.
TEST(Safetensors, PythonReadsWhatWeWrite) {
  test::Rng rng("Safetensors.PythonReads");
  TempDir dir;
  Tensor<float> a = rng.normal32({3, 3});
  Tensor<float> z = rng.normal32({5});
  save_safetensors(dir.file("o.safetensors"), {{"z", z.cview()}, {"a", a.cview()}}, {{"k", "v"}});
  ASSERT_EQ(test::run_python(R"(
import sys, json, struct, numpy as np
d = sys.argv[1]
b = open(f'{d}/o.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
assert n % 8 == 0, n
h = json.loads(b[8:8 + n])
assert h.pop('__metadata__') == {'k': 'v'}
names = sorted(h, key=lambda k: h[k]['data_offsets'][0])
assert names == ['a', 'z'], names
buf = b[8 + n:]
assert h['z']['data_offsets'][1] == len(buf)
for k in names:
  assert h[k]['dtype'] == 'F32'
  s, e = h[k]['data_offsets']
  np.frombuffer(buf[s:e], '<f4').reshape(h[k]['shape']).tofile(f'{d}/{k}.raw')
)",
                             dir.path()),
            0);
  EXPECT_EQ(read_raw(dir.file("a.raw")), std::string(reinterpret_cast<const char*>(a.data()), 36));
  EXPECT_EQ(read_raw(dir.file("z.raw")), std::string(reinterpret_cast<const char*>(z.data()), 20));
}

TEST(Safetensors, MalformedFilesAreRefusedWithAReason) {
  TempDir dir;
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
    return fmt::format(R"("{}": {{"dtype": "{}", "shape": {}, "data_offsets": [{}, {}]}})", name, dtype, shape, b, e);
  };
  const std::string good = make_st("{" + entry("a", "F32", "[2, 2]", 0, 16) + "}", 16);
  std::string huge_len = good;
  uint64_t big = 1000;
  std::memcpy(huge_len.data(), &big, 8);
  struct Case {
    std::string name, bytes;
    std::vector<std::string> message;
  };
  std::vector<Case> cases = {
      {"short", "\x05\x00\x00", {"too short for the 8-byte header length"}},
      {"truncated",
       good.substr(0, good.size() - 3),
       {"data_offsets [0, 16] run past the end of the 13-byte data buffer"}},
      {"header_len", huge_len, {"header length is 1000 bytes but the file holds"}},
      {"garbled",
       make_st(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16])", 16),
       {"not valid JSON"}},
      {"not_object", make_st("[1, 2]", 0), {"not a JSON object"}},
      {"deep", make_st(std::string(100, '[') + std::string(100, ']'), 0), {"nests deeper than 16"}},
      {"overlap",
       make_st("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12),
       {"tensors \"a\" and \"b\" overlap"}},
      {"gap",
       make_st("{" + entry("a", "F32", "[1]", 4, 8) + "}", 8),
       {"bytes 0 to 4 of the data buffer belong to no tensor"}},
      {"trailing", make_st("{" + entry("a", "F32", "[1]", 0, 4) + "}", 8), {"holds 8 bytes but the tensors cover 4"}},
      {"past_end",
       make_st("{" + entry("a", "F32", "[4]", 0, 16) + "}", 8),
       {"run past the end of the 8-byte data buffer"}},
      {"mismatch",
       make_st("{" + entry("a", "F32", "[3]", 0, 16) + "}", 16),
       {"shape [3] of F32 needs 12 bytes but data_offsets [0, 16] hold 16"}},
      {"unknown", make_st("{" + entry("a", "F128", "[1]", 0, 16) + "}", 16), {"tensor \"a\": unknown dtype \"F128\""}},
      {"f8", make_st("{" + entry("a", "F8_E4M3", "[2]", 0, 2) + "}", 2), {"F8_E4M3 is not supported"}},
      {"negative",
       make_st(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       {"shape entries must be non-negative integers, got -1"}},
      {"negative_zero",
       make_st(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-0, 8]}})", 8),
       {"data_offsets must be non-negative integers, got -0"}},
      {"reversed", make_st("{" + entry("a", "F32", "[0]", 8, 4) + "}", 8), {"end before they begin"}},
      {"bad_offsets",
       make_st(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
       {"data_offsets must be [begin, end]"}},
      {"missing_key", make_st(R"({"a": {"dtype": "F32", "shape": [1]}})", 4), {"\"data_offsets\" is missing"}},
      {"rank5", make_st("{" + entry("a", "F32", "[1, 1, 1, 1, 1]", 0, 4) + "}", 4), {"rank 5"}},
      {"overflow",
       make_st("{" + entry("a", "F64", "[4611686018427387904, 4]", 0, 8) + "}", 8),
       {"too large to address"}},
      {"meta", make_st(R"({"__metadata__": {"k": 1}})", 0), {"__metadata__ value of \"k\" is not a string"}},
      // Duplicate keys: a reader keeping the first copy and one keeping the last disagree.
      {"dup_tensor",
       make_st("{" + entry("a", "F32", "[1]", 0, 4) + "," + entry("a", "F32", "[1]", 0, 4) + "}", 4),
       {"key \"a\" twice"}},
      {"dup_field",
       make_st(R"({"a": {"dtype": "F32", "shape": [1], "dtype": "F16", "data_offsets": [0, 4]}})", 4),
       {"key \"dtype\" twice"}},
      {"dup_meta", make_st(R"({"__metadata__": {"k": "1", "k": "2"}})", 0), {"key \"k\" twice"}},
      // nlohmann's lexer stopped at a NUL, so JSON followed by "\0garbage" loaded (safetensors' tests).
      {"nul_after_json",
       make_st("{" + entry("a", "F32", "[1]", 0, 4) + "}" + std::string("\0x", 2), 4),
       {"the safetensors header holds a NUL byte at offset"}},
      // nlohmann skips a UTF-8 byte-order mark; the reference (serde_json) refuses it, and the
      // format has the header start with '{'.
      {"bom",
       make_st("\xEF\xBB\xBF{" + entry("a", "F32", "[1]", 0, 4) + "}", 4),
       {"the safetensors header starts with a UTF-8 byte-order mark (EF BB BF)"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(c.name + ".safetensors");
    write_raw(path, c.bytes);
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    expect_error([&] { load_safetensors(path); }, parts);
  }
  expect_error([&] { load_safetensors(dir.file("none")); }, {"cannot open", "No such file"});
  expect_error([&] { load_safetensors(dir.path()); }, {"is a directory"});
  // JSON whitespace before the '{' and after the '}' is what the reference reads (serde_json skips
  // it), so it still loads; the mark is refused only at the start, the bytes inside a name load.
  const std::string path = dir.file("spaces.safetensors");
  write_raw(path, make_st(" \n{" + entry("a\xEF\xBB\xBF", "F32", "[1]", 0, 4) + "} \t", 4));
  EXPECT_EQ(load_safetensors(path).count("a\xEF\xBB\xBF"), 1u);
}

// A header length above 100 MB is refused before the header is read (a sparse file keeps this cheap).
TEST(Safetensors, HeaderAbove100MBIsRefused) {
  TempDir dir;
  std::string path = dir.file("big.safetensors");
  uint64_t n = (100u << 20) + 8;
  write_raw(path, std::string(reinterpret_cast<const char*>(&n), 8));
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(n + 8)), 0);
  expect_error([&] { load_safetensors(path); }, {path, "header length 104857608 exceeds the 104857600 byte limit"});
}

TEST(Safetensors, BadSaveRequestsAreRefusedAndWriteNothing) {
  TempDir dir;
  Tensor<float> a({2});
  a[0] = 1;
  a[1] = 2;
  std::string path = dir.file("x.safetensors");
  expect_error([&] { save_safetensors(path, {{"a", a.cview()}, {"a", a.cview()}}); }, {"\"a\" is given twice"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", a.cview()}}); }, {"not a tensor name"});
  expect_error([&] { save_safetensors(path, {{"bad\xff", a.cview()}}); }, {"not valid UTF-8"});
  // A negative dimension was written as "shape": [-1, 3] (offsets near 2^64), which no reader
  // takes; a broadcast view of 2^40 elements threw std::bad_alloc.
  const std::array<int64_t, 2> negative{-1, 3};
  expect_error(
      [&] {
        save_safetensors(path, {{"n", TensorView<const float>(a.data(), negative)}});
      },
      {"tensor \"n\": negative dimension in shape [-1, 3]"});
  const std::array<int64_t, 1> huge{int64_t{1} << 40}, zero{0};
  expect_error(
      [&] {
        save_safetensors(path, {{"b", TensorView<const float>(a.data(), huge, zero)}});
      },
      {"needs 4398046511", "of physical memory on this machine"});
  EXPECT_TRUE(dir.entries().empty());
}

TEST(Safetensors, CorruptedFilesNeverCrash) {
  test::Rng rng("Safetensors.Corrupted");
  TempDir dir("/dev/shm");
  Tensor<float> a = rng.normal32({2, 3});
  Tensor<float> b = rng.normal32({4});
  std::string path = dir.file("c.safetensors");
  save_safetensors(path, {{"a", a.cview()}, {"b", b.cview()}}, {{"k", "v"}});
  const std::string good = read_raw(path);
  auto attempt = [&](const std::string& bytes) {
    write_raw(path, bytes);
    try {
      load_safetensors(path);
    } catch (const Error&) {
    }
  };
  for (std::size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = good;
    for (int k = 0, flips = static_cast<int>(rng.uniform_int(1, 3)); k < flips; ++k)
      bytes[static_cast<std::size_t>(rng.uniform_int(0, static_cast<int64_t>(good.size()) - 1))] =
          static_cast<char>(rng.uniform_int(0, 255));
    attempt(bytes);
  }
}

}  // namespace
}  // namespace qkv
