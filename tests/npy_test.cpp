// .npy: round trips, files written by numpy itself, and every malformed file the reader refuses.
#include <array>
#include <filesystem>
#include <cstring>
#include <tuple>

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

// A .npy file with a hand-written header dict (padded like numpy's) and raw data bytes.
std::string make_npy(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict;
  std::size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  uint32_t len = static_cast<uint32_t>(header.size());
  out.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
  return out + header + data;
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(Npy, RoundTripFloatDoubleAndU8AtRanks0To4) {
  test::Rng rng("Npy.RoundTrip");
  TempDir dir;
  for (int rank = 0; rank <= 4; ++rank) {
    std::vector<int64_t> shape;
    for (int i = 0; i < rank; ++i) shape.push_back(rng.uniform_int(1, 5));
    Tensor<float> f = rng.normal32(shape);
    save_npy<float>(dir.file("f.npy"), f.cview());
    Tensor<float> f2 = load_npy<float>(dir.file("f.npy"));
    ASSERT_EQ(std::vector<int64_t>(f2.shape().begin(), f2.shape().end()), shape);
    EXPECT_EQ(std::memcmp(f.data(), f2.data(), sizeof(float) * f.numel()), 0) << "rank " << rank;

    Tensor<double> d{std::span<const int64_t>(shape)};
    for (int64_t i = 0; i < d.numel(); ++i) d[i] = rng.uniform(-1e6, 1e6);
    save_npy<double>(dir.file("d.npy"), d.cview());
    Tensor<double> d2 = load_npy<double>(dir.file("d.npy"));
    EXPECT_EQ(std::memcmp(d.data(), d2.data(), sizeof(double) * d.numel()), 0) << "rank " << rank;

    Tensor<uint8_t> u{std::span<const int64_t>(shape)};
    for (int64_t i = 0; i < u.numel(); ++i) u[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
    save_npy<uint8_t>(dir.file("u.npy"), u.cview());
    Tensor<uint8_t> u2 = load_npy<uint8_t>(dir.file("u.npy"));
    EXPECT_EQ(std::memcmp(u.data(), u2.data(), u.numel()), 0) << "rank " << rank;
    EXPECT_EQ(read_npy_info(dir.file("u.npy")).descr, "|u1");
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"d.npy", "f.npy", "u.npy"}));
}

TEST(Npy, StridedViewIsWrittenContiguousAndNpyBytesMatchesTheFile) {
  test::Rng rng("Npy.Strided");
  TempDir dir;
  Tensor<float> a = rng.normal32({3, 5});
  TensorView<const float> t = a.cview().transposed(0, 1);  // [5, 3], column-major strides
  save_npy<float>(dir.file("t.npy"), t);
  EXPECT_EQ(read_raw(dir.file("t.npy")), npy_bytes<float>(t));
  Tensor<float> back = load_npy<float>(dir.file("t.npy"));
  ASSERT_EQ(back.dim(0), 5);
  ASSERT_EQ(back.dim(1), 3);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(back[i * 3 + j], a[j * 5 + i]);
  EXPECT_EQ(read_raw(dir.file("t.npy")).size() % 64, 5u * 3 * 4 % 64) << "data starts 64-byte aligned";
}

// numpy writes every supported dtype (and Fortran order, 0-d, zero-size, format 2.0 and 3.0),
// plus the same values as raw little-endian float64 in C order, which the reader must match.
TEST(Npy, ReadsFilesWrittenByNumpy) {
  test::Rng rng("Npy.ReadsNumpy");
  TempDir dir;
  const std::string script = fmt::format(R"(
import sys, numpy as np
from numpy.lib import format as npf
d = sys.argv[1]; rng = np.random.default_rng({})
cases = {{
  'f4': rng.standard_normal((3, 5)).astype('<f4'),
  'f8': rng.standard_normal((2, 3, 4)),
  'f2': rng.standard_normal(7).astype('<f2'),
  'b1': rng.random((4, 3)) > 0.5,
  'u1': rng.integers(0, 256, (2, 2, 3), dtype=np.uint8),
  'i1': rng.integers(-128, 128, (5,), dtype=np.int8),
  'i4': rng.integers(-2**31, 2**31, (3, 1), dtype='<i4'),
  'i8': rng.integers(-2**40, 2**40, (1, 2, 1, 3), dtype='<i8'),
  'fortran': np.asfortranarray(rng.standard_normal((3, 4, 2)).astype('<f4')),
  'fortran2': np.asfortranarray(rng.standard_normal((5, 3))),
  'scalar': np.array(rng.standard_normal(), dtype='<f4'),
  'empty': np.zeros((0, 3), dtype='<f4'),
  'native': rng.standard_normal(4).astype('=f4'),
}}
for name, a in cases.items():
  np.save(f'{{d}}/{{name}}.npy', a)
  np.ascontiguousarray(a, dtype='<f8').tofile(f'{{d}}/{{name}}.bin')
for version in [(2, 0), (3, 0)]:
  a = rng.standard_normal((2, 3)).astype('<f4')
  with open(f'{{d}}/v{{version[0]}}.npy', 'wb') as f:
    npf.write_array(f, a, version=version)
  a.astype('<f8').tofile(f'{{d}}/v{{version[0]}}.bin')
)",
                                         rng.uniform_int(0, 1 << 30));
  ASSERT_EQ(test::run_python(script, dir.path()), 0);
  for (std::string name : {"f4", "f8", "f2", "b1", "u1", "i1", "i4", "i8", "fortran", "fortran2", "scalar", "empty",
                           "native", "v2", "v3"}) {
    SCOPED_TRACE(name);
    std::string raw = read_raw(dir.file(name + ".bin"));
    std::vector<double> expected(raw.size() / 8);
    if (!raw.empty()) std::memcpy(expected.data(), raw.data(), raw.size());
    Tensor<double> d = load_npy<double>(dir.file(name + ".npy"));
    ASSERT_EQ(d.numel(), static_cast<int64_t>(expected.size()));
    for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(d[i], expected[i]) << "element " << i;
    Tensor<float> f = load_npy<float>(dir.file(name + ".npy"));
    for (int64_t i = 0; i < f.numel(); ++i) EXPECT_EQ(f[i], static_cast<float>(expected[i])) << "element " << i;
  }
  EXPECT_EQ(load_npy<float>(dir.file("scalar.npy")).rank(), 0);
  NpyInfo info = read_npy_info(dir.file("fortran.npy"));
  EXPECT_TRUE(info.fortran_order);
  EXPECT_EQ(info.shape, (std::vector<int64_t>{3, 4, 2}));
  EXPECT_EQ(info.descr, "<f4");
  Tensor<uint8_t> u = load_npy<uint8_t>(dir.file("u1.npy"));
  std::string raw = read_raw(dir.file("u1.bin"));
  for (int64_t i = 0; i < u.numel(); ++i) {
    double v;
    std::memcpy(&v, raw.data() + 8 * i, 8);
    EXPECT_EQ(u[i], static_cast<uint8_t>(v));
  }
}

TEST(Npy, NumpyReadsWhatWeWrite) {
  test::Rng rng("Npy.NumpyReads");
  TempDir dir;
  Tensor<float> a = rng.normal32({3, 1, 59});
  Tensor<double> b = rng.normal64({1});
  Tensor<uint8_t> c({2, 3});
  for (int64_t i = 0; i < c.numel(); ++i) c[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
  save_npy<float>(dir.file("a.npy"), a.cview());
  save_npy<double>(dir.file("b.npy"), b.cview());
  save_npy<uint8_t>(dir.file("c.npy"), c.cview());
  ASSERT_EQ(test::run_python(R"(
import sys, numpy as np
d = sys.argv[1]
for n, dt, shape in [('a', '<f4', (3, 1, 59)), ('b', '<f8', (1,)), ('c', '|u1', (2, 3))]:
  x = np.load(f'{d}/{n}.npy')
  assert x.dtype == np.dtype(dt) and x.shape == shape, (n, x.dtype, x.shape)
  x.tofile(f'{d}/{n}.raw')
)",
                             dir.path()),
            0);
  EXPECT_EQ(read_raw(dir.file("a.raw")), std::string(reinterpret_cast<const char*>(a.data()), a.numel() * 4));
  EXPECT_EQ(read_raw(dir.file("b.raw")), std::string(reinterpret_cast<const char*>(b.data()), 8));
  EXPECT_EQ(read_raw(dir.file("c.raw")), std::string(reinterpret_cast<const char*>(c.data()), 6));
}

struct BadFile {
  std::string name;
  std::string bytes;
  std::vector<std::string> message;
};

TEST(Npy, MalformedFilesAreRefusedWithAReason) {
  TempDir dir;
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string data = float_bytes({1, 2, 3, 4, 5, 6});
  const std::string good = make_npy(good_dict, data);
  std::string version4 = good;
  version4[6] = 4;
  std::string long_header = good;
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  std::vector<BadFile> cases = {
      {"truncated", good.substr(0, good.size() - 5), {"truncated", "declares 24 bytes but the file holds 19"}},
      {"truncated_header", good.substr(0, 40), {"header length is 118 bytes but only 30 follow"}},
      {"tiny", "\x93NUM", {"too short"}},
      {"magic", "PK\x03\x04" + good.substr(4), {"not a .npy file"}},
      {"version", version4, {"unsupported .npy format version 4.0"}},
      {"header_len", long_header, {"header length is 32767 bytes"}},
      {"not_dict", make_npy("[1, 2]", data), {"bad .npy header", "not a dict"}},
      {"garbage", make_npy("{'descr': '<f4', 'fortran_order': Fals", data), {"bad .npy header"}},
      {"unclosed", make_npy("{'descr': '<f4", data), {"bad .npy header", "not closed"}},
      {"missing_shape", make_npy("{'descr': '<f4', 'fortran_order': False}", data), {"'shape' is missing"}},
      {"extra_key",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", data),
       {"unexpected key \"x\""}},
      {"fortran_type", make_npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", data), {"fortran_order"}},
      {"shape_type",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': 6}", data),
       {"'shape' is not a tuple"}},
      {"shape_float", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6.0,)}", data), {"not an integer"}},
      {"negative",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -3), }", data),
       {"negative dimension -2"}},
      {"huge_dim",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", data),
       {"too large"}},
      {"overflow",
       make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", data),
       {"more bytes than can be addressed"}},
      {"two_tb",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (500000, 1000000), }", data),
       {"declares 2000000000000 bytes but the file holds 24"}},
      {"trailing", make_npy(good_dict, data + "junk"), {"declares 24 bytes but the file holds 28", "4 trailing bytes"}},
      {"complex",
       make_npy("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", data),
       {"unsupported .npy dtype \"<c8\""}},
      // The descr is the file's text: control bytes are escaped, so the message stays one line.
      {"control_bytes_in_descr",
       make_npy("{'descr': '<f4\nzz', 'fortran_order': False, 'shape': (3,), }", data),
       {"unsupported .npy dtype \"<f4\\x0azz\""}},
      {"big_endian",
       make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", data),
       {"big-endian", "'>f4'", "astype('<f4')"}},
      {"structured",
       make_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", data),
       {"structured arrays are not supported"}},
      {"rank5",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 2, 1, 3), }", data),
       {"rank 5", "rank 0 to 4"}},
      {"dup_key",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'shape': (2, 3)}", data),
       {"bad .npy header", "the key \"shape\" appears twice"}},
      {"nesting",
       make_npy("{'descr': " + std::string(50, '(') + std::string(50, ')') + "}", data),
       {"nesting is too deep"}},
      // Read as Python reads the literal, as numpy does (each one numpy refuses; qkv once read the
      // first two as '<f4', the list and (6) as shapes and 02 as 2).
      {"escape_form_feed",
       make_npy(R"({'descr': '<\f4', 'fortran_order': False, 'shape': (6,), })", data),
       {"unsupported .npy dtype \"<\\x0c4\""}},
      {"escape_unknown",
       make_npy(R"({'descr': '\<f4', 'fortran_order': False, 'shape': (6,), })", data),
       {"unsupported .npy dtype \"\\\\<f4\""}},
      {"shape_list",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", data),
       {"bad .npy header", "'shape' is not a tuple (it is a list, which numpy refuses)"}},
      {"shape_parenthesized_int",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", data),
       {"bad .npy header", "'shape' is not a tuple"}},
      {"leading_zero",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (02, 3), }", data),
       {"bad .npy header", "the integer \"02\" has a leading zero"}},
      {"lowercase_long",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2l, 3), }", data),
       {"bad .npy header", "unexpected \"l\" after the integer \"2\""}},
      {"long_in_version_3",
       make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3), }", data, 3),
       {"bad .npy header", "unexpected \"L\" after the integer \"2\""}},
      {"short_hex_escape",
       make_npy(R"({'descr': '<\x6', 'fortran_order': False, 'shape': (6,), })", data),
       {"bad .npy header", "the escape \"\\\\x6'\" needs 2 hex digits"}},
      {"named_escape",
       make_npy(R"({'descr': '<\N{LATIN SMALL LETTER F}4', 'fortran_order': False, 'shape': (6,), })", data),
       {"bad .npy header", "named escape", "not supported"}},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = dir.file(c.name + ".npy");
    write_raw(path, c.bytes);
    std::vector<std::string> parts = c.message;
    parts.push_back(path);
    expect_error([&] { load_npy<float>(path); }, parts);
    expect_error([&] { read_npy_info(path); }, parts);
  }
}

TEST(Npy, MissingFileDirectoryAndUnrepresentableValues) {
  TempDir dir;
  expect_error([&] { load_npy<float>(dir.file("none.npy")); }, {"cannot open", dir.file("none.npy"), "No such file"});
  expect_error([&] { load_npy<float>(dir.path()); }, {dir.path(), "is a directory"});
  write_raw(dir.file("empty.npy"), "");
  expect_error([&] { load_npy<float>(dir.file("empty.npy")); }, {"too short"});

  std::string path = dir.file("v.npy");
  write_raw(path, make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", float_bytes({1, 2.5f, 3})));
  expect_error([&] { load_npy<uint8_t>(path); }, {"element 1 (2.5) is not a uint8 value"});
  std::vector<double> big = {1e300};
  write_raw(path, make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                           std::string(reinterpret_cast<const char*>(big.data()), 8)));
  expect_error([&] { load_npy<float>(path); }, {"overflows float32"});
  EXPECT_EQ(load_npy<double>(path)[0], 1e300);
  // Writers: a negative dimension wrote a header no reader takes (or threw std::length_error), a
  // broadcast view of 2^40 elements std::bad_alloc.
  float x = 1;
  const std::array<int64_t, 2> negative{-1, 3};
  expect_error([&] { save_npy<float>(dir.file("n.npy"), TensorView<const float>(&x, negative)); },
               {"negative dimension in shape [-1, 3]"});
  const std::array<int64_t, 1> huge{int64_t{1} << 40}, zero{0};
  expect_error([&] { npy_bytes<float>(TensorView<const float>(&x, huge, zero)); },
               {"npy_bytes: needs 4398046511", "of physical memory on this machine"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("n.npy")));
}

// '=' (native, little-endian here) and '|' / '<' on one-byte types are the same data to the reader.
TEST(Npy, ByteOrderMarksNumpyMayWrite) {
  TempDir dir;
  std::string path = dir.file("o.npy");
  write_raw(path, make_npy("{'descr': '=f4', 'fortran_order': False, 'shape': (3,), }", float_bytes({1.5f, -2, 3})));
  Tensor<float> f = load_npy<float>(path);
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -2.0f);
  write_raw(path, make_npy("{\"descr\": \"<u1\", \"fortran_order\": True, \"shape\": (2, 2)}", "\x01\x02\x03\x04", 2));
  Tensor<uint8_t> u = load_npy<uint8_t>(path);  // column-major [[1, 3], [2, 4]]
  EXPECT_EQ((std::vector<int>{u[0], u[1], u[2], u[3]}), (std::vector<int>{1, 3, 2, 4}));
  write_raw(path, make_npy("{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", "\xff\x05"));
  expect_error([&] { load_npy<uint8_t>(path); }, {"element 0 (-1) is not a uint8 value"});
  EXPECT_EQ(load_npy<float>(path)[0], -1.0f);
}

// numpy's one-character type codes and bare type names (np.dtype's spellings, which np.load
// accepts in a header) are the types numpy gives them, not a refusal.
TEST(Npy, TypeCodesAndNamesAreNumpys) {
  TempDir dir;
  const std::string path = dir.file("t.npy");
  const std::string two_floats = float_bytes({1.5f, -2});
  double d = -0.25;
  int64_t l = -7;
  const std::vector<std::tuple<std::string, std::string, std::string, double>> cases = {
      {"float32", two_floats, "<f4", 1.5},
      {"f", two_floats, "<f4", 1.5},
      {"|f", two_floats, "<f4", 1.5},
      {"float", std::string(reinterpret_cast<char*>(&d), 8), "<f8", -0.25},
      {"d", std::string(reinterpret_cast<char*>(&d), 8), "<f8", -0.25},
      {"l", std::string(reinterpret_cast<char*>(&l), 8), "<i8", -7},
      {"int", std::string(reinterpret_cast<char*>(&l), 8), "<i8", -7},
      {"b", "\xfe", "|i1", -2},
      {"B", "\xfe", "|u1", 254},
      {"?", "\x01", "|b1", 1},
      {"bool", "\x01", "|b1", 1}};
  for (const auto& [descr, data, canonical, first] : cases) {
    SCOPED_TRACE(descr);
    const std::size_t n = data.size() == 8 && canonical != "<f4" ? 1 : data.size() / (canonical == "<f4" ? 4 : 1);
    write_raw(path,
              make_npy(fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({},), }}", descr, n), data));
    EXPECT_EQ(read_npy_info(path).descr, canonical);
    EXPECT_EQ(load_npy<double>(path)[0], first);
  }
  write_raw(path, make_npy("{'descr': '<float32', 'fortran_order': False, 'shape': (2,), }", two_floats));
  expect_error([&] { load_npy<float>(path); }, {"unsupported .npy dtype \"<float32\""});
}

// qkv reads a header as numpy does: each header below is loaded by both or refused by both (numpy
// 1.x's np.load is asked, not assumed). Byte-order characters: numpy reads 'f4', '=f4' and '|f4' as
// the native float32 (qkv refused 'f4' and '|f4'); escapes are Python's ('<\x664' is '<f4');
// (2, 3) may be spelled ((2, 3)) or with a trailing comma, and 2L in formats 1.0 and 2.0.
// np.load's verdict on each of `names` (quoted, comma-separated stems of .npy files in dir): one
// '1' (loads) or '0' (ValueError) per file, in order.
std::string numpy_verdicts(const TempDir& dir, const std::string& names) {
  EXPECT_EQ(test::run_python(R"(
import sys, numpy as np
d = sys.argv[1]
with open(f'{d}/numpy.txt', 'w') as out:
  for name in [)" + names + R"(]:
    try:
      np.load(f'{d}/{name}.npy')
      out.write('1')
    except ValueError:
      out.write('0')
)",
                             dir.path()),
            0);
  return read_raw(dir.file("numpy.txt"));
}

TEST(Npy, HeadersAreReadAsNumpyReadsThem) {
  TempDir dir;
  struct Case {
    std::string descr, shape;
    bool loads;
    int major = 1;
    std::size_t item = 0;  // bytes per element; 0: the descr's last digit
  };
  const std::vector<Case> cases = {
      {"'<f4'", "(2, 3)", true},
      {"'f4'", "(2, 3)", true},
      {"'=f4'", "(2, 3)", true},
      {"'|f4'", "(2, 3)", true},
      {"'f8'", "(2, 3)", true},
      {"'|f8'", "(2, 3)", true},
      {"'=f2'", "(2, 3)", true},
      {"'f2'", "(2, 3)", true},
      {"'b1'", "(2, 3)", true},
      {"'>b1'", "(2, 3)", true},
      {"'<u1'", "(2, 3)", true},
      {"'=i1'", "(2, 3)", true},
      {"'i4'", "(2, 3)", true},
      {"'|i8'", "(2, 3)", true},
      {R"('<\x664')", "(2, 3)", true},
      {R"('<\1464')", "(2, 3)", true},
      {R"('<\u0066\U00000034')", "(2, 3)", true},
      {"'<f\\\n4'", "(2, 3)", true},  // a backslash-newline continues the string
      {R"("<f4")", "((2, 3))", true},
      {"'<f4'", "(2, 3,)", true},
      {"'<f4'", "(2L, 3)", true},
      {"'<f4'", "(2L, 3)", true, 2},
      {"'<f4'", "(0_2, 3)", false},
      {"'<f4'", "(2, 3)", true, 3},
      {"'<f4'", "(2L, 3)", false, 3},
      // numpy's type codes and names (qkv refused them before the eighteenth session)
      {"'float32'", "(2, 3)", true, 1, 4},
      {"'single'", "(2, 3)", true, 1, 4},
      {"'f'", "(2, 3)", true, 1, 4},
      {"'|f'", "(2, 3)", true, 1, 4},
      {"'<d'", "(2, 3)", true, 1, 8},
      {"'float'", "(2, 3)", true, 1, 8},
      {"'half'", "(2, 3)", true, 1, 2},
      {"'e'", "(2, 3)", true, 1, 2},
      {"'?'", "(2, 3)", true, 1, 1},
      {"'>?'", "(2, 3)", true, 1, 1},
      {"'bool'", "(2, 3)", true, 1, 1},
      {"'B'", "(2, 3)", true, 1, 1},
      {"'b'", "(2, 3)", true, 1, 1},
      {"'int32'", "(2, 3)", true, 1, 4},
      {"'int64'", "(2, 3)", true, 1, 8},
      {"'int'", "(2, 3)", true, 1, 8},
      {"'l'", "(2, 3)", true, 1, 8},
      {"'=q'", "(2, 3)", true, 1, 8},
      {"'<float32'", "(2, 3)", false, 1, 4},
      {"'Float32'", "(2, 3)", false, 1, 4},
      {"'float32 '", "(2, 3)", false, 1, 4},
      {"'<int'", "(2, 3)", false, 1, 8},
      {"'ff'", "(2, 3)", false, 1, 4},
      {R"('<\f4')", "(2, 3)", false},
      {R"('\<f4')", "(2, 3)", false},
      {R"('<\x6')", "(2, 3)", false},
      {"'<f4'", "[2, 3]", false},
      {"'<f4'", "(6)", false},
      {"'<f4'", "(02, 3)", false},
      {"'<f4'", "(2l, 3)", false},
      {"'<f4'", "(2, 3j)", false},
  };
  std::string names;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string dict = "{'descr': " + c.descr + ", 'fortran_order': False, 'shape': " + c.shape + ", }";
    // The item size from the dtype's last digit: 6 elements of it.
    const std::size_t item = c.item ? c.item : static_cast<std::size_t>(c.descr[c.descr.size() - 2] - '0');
    write_raw(dir.file(fmt::format("c{}.npy", i)), make_npy(dict, std::string(6 * item, '\0'), c.major));
    names += fmt::format("{}'c{}'", i ? ", " : "", i);
  }
  const std::string numpy_says = numpy_verdicts(dir, names);
  ASSERT_EQ(numpy_says.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(fmt::format("descr {} shape {} format {}.0", c.descr, c.shape, c.major));
    EXPECT_EQ(numpy_says[i] == '1', c.loads) << "numpy";
    const std::string path = dir.file(fmt::format("c{}.npy", i));
    bool loaded = true;
    try {
      EXPECT_EQ(load_npy<double>(path).numel(), 6);
      const NpyInfo info = read_npy_info(path);
      EXPECT_EQ(info.shape, (std::vector<int64_t>{2, 3}));
      // The descr as numpy writes the dtype: what `qkv attend` tests to tell float32 from float64.
      EXPECT_TRUE(info.descr == "|b1" || info.descr == "|u1" || info.descr == "|i1" || info.descr[0] == '<')
          << info.descr;
    } catch (const Error& e) {
      loaded = false;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    EXPECT_EQ(loaded, c.loads) << "qkv";
  }
  EXPECT_EQ(read_npy_info(dir.file("c1.npy")).descr, "<f4");  // 'f4'
  EXPECT_EQ(read_npy_info(dir.file("c9.npy")).descr, "|b1");  // '>b1'
}

// numpy refuses a header of over 10,000 characters (unsafe to parse); qkv accepted any length.
// Formats 1.0 and 3.0, 10,000 and 10,001 characters, each verdict checked against np.load.
TEST(Npy, HeadersOverNumpysLengthLimitAreRefused) {
  TempDir dir;
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string names;
  for (const int major : {1, 3})
    for (const std::size_t chars : {10000, 10001}) {
      std::string header = dict + std::string(chars - 1 - dict.size(), ' ') + '\n';
      std::string bytes = "\x93NUMPY";
      bytes += static_cast<char>(major);
      bytes += '\0';
      const uint32_t len = static_cast<uint32_t>(header.size());
      bytes.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
      const std::string name = fmt::format("h{}_{}", major, chars);
      write_raw(dir.file(name + ".npy"), bytes + header + std::string(24, '\0'));
      names += fmt::format("{}'{}'", names.empty() ? "" : ", ", name);
    }
  EXPECT_EQ(numpy_verdicts(dir, names), "1010");
  for (const int major : {1, 3}) {
    EXPECT_EQ(load_npy<float>(dir.file(fmt::format("h{}_10000.npy", major))).numel(), 6);
    const std::string path = dir.file(fmt::format("h{}_10001.npy", major));
    test::expect_error([&] { load_npy<float>(path); },
                       {path + ": bad .npy header: 10001 characters, over numpy's limit of 10000"});
    test::expect_error([&] { read_npy_info(path); }, {"over numpy's limit"});
  }
}

// Every truncation and many random corruptions of a valid file either load or throw qkv::Error.
TEST(Npy, CorruptedFilesNeverCrash) {
  test::Rng rng("Npy.Corrupted");
  TempDir dir("/dev/shm");
  Tensor<float> a = rng.normal32({3, 4});
  const std::string good = npy_bytes<float>(a.cview());
  std::string path = dir.file("c.npy");
  auto attempt = [&](const std::string& bytes) {
    write_raw(path, bytes);
    try {
      load_npy<float>(path);
    } catch (const Error&) {
    }
  };
  for (std::size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes = good;
    int flips = static_cast<int>(rng.uniform_int(1, 4));
    for (int k = 0; k < flips; ++k)
      bytes[static_cast<std::size_t>(rng.uniform_int(0, 80))] = static_cast<char>(rng.uniform_int(0, 255));
    attempt(bytes);
  }
}

}  // namespace
}  // namespace qkv
