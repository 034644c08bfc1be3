#include "wavealign/io.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "wavealign/error.h"

namespace wavealign {
namespace {

const std::string kSource = "input.npy";

std::vector<std::byte> to_bytes(std::string_view text) {
  std::vector<std::byte> bytes(text.size());
  std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

/// A .npy image around `dict`, padded with spaces and a newline as numpy does (to `align` bytes).
std::vector<std::byte> npy_image(const std::string& dict, std::string_view data, int major = 1, size_t align = 64) {
  const size_t prelude = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append(align - (prelude + header.size() + 1) % align, ' ');
  header += '\n';
  std::string image = "\x93NUMPY";
  image += char(major);
  image += '\0';
  for (size_t i = 0; i < prelude - 8; ++i) image += char((header.size() >> (8 * i)) & 0xFF);
  return to_bytes(image + header + std::string(data));
}

std::string header_dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

/// The message of the InvalidArgument that parsing throws; fails the test unless it names kSource.
std::string parse_error(std::span<const std::byte> image) {
  try {
    parse_npy(image, kSource);
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), kSource) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "parse_npy accepted the image";
  return "";
}

std::string dict_error(const std::string& dict, std::string_view data = "") {
  return parse_error(npy_image(dict, data));
}

using test_support::TempPath;

// Exactly what numpy 2.x writes for np.save(f, np.array([[True, False, True], [False, False, True]])) and
// np.save(f, np.array([1, -2, 3], dtype=np.int32)): format 1.0, header length 118 (0x76), so that the 10-byte
// prelude plus header fills 128 bytes; the spaces include numpy's 21-digit room for the first axis to grow.
const std::string kNumpyBool = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                               "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') +
                               "\n" + std::string("\x01\x00\x01\x00\x00\x01", 6);
const std::string kNumpyInt32 = std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                                "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }" + std::string(60, ' ') +
                                "\n" + std::string("\x01\x00\x00\x00\xfe\xff\xff\xff\x03\x00\x00\x00", 12);

TEST(Npy, DtypeTables) {
  EXPECT_EQ(dtype_size(DType::kBool), 1);
  EXPECT_EQ(dtype_size(DType::kUint8), 1);
  EXPECT_EQ(dtype_size(DType::kUint16), 2);
  EXPECT_EQ(dtype_size(DType::kInt32), 4);
  EXPECT_EQ(dtype_size(DType::kInt64), 8);
  EXPECT_EQ(dtype_size(DType::kFloat32), 4);
  EXPECT_EQ(dtype_descr(DType::kBool), "|b1");
  EXPECT_EQ(dtype_descr(DType::kUint8), "|u1");
  EXPECT_EQ(dtype_descr(DType::kUint16), "<u2");
  EXPECT_EQ(dtype_descr(DType::kInt32), "<i4");
  EXPECT_EQ(dtype_descr(DType::kInt64), "<i8");
  EXPECT_EQ(dtype_descr(DType::kFloat32), "<f4");
}

TEST(Npy, ReadsNumpyFiles) {
  ASSERT_EQ(kNumpyBool.size(), 128u + 6);
  const NpyArray bools = parse_npy(to_bytes(kNumpyBool), kSource);
  EXPECT_EQ(bools.dtype, DType::kBool);
  EXPECT_EQ(bools.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(bools.size(), 6);
  EXPECT_EQ(std::vector<uint8_t>(bools.values<uint8_t>().begin(), bools.values<uint8_t>().end()),
            (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));

  const NpyArray ints = parse_npy(to_bytes(kNumpyInt32), kSource);
  EXPECT_EQ(ints.dtype, DType::kInt32);
  EXPECT_EQ(ints.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(std::vector<int32_t>(ints.values<int32_t>().begin(), ints.values<int32_t>().end()),
            (std::vector<int32_t>{1, -2, 3}));
}

TEST(Npy, WritesWhatNumpyWrites) {
  const std::vector<uint8_t> bools = {1, 0, 1, 0, 0, 1};
  EXPECT_EQ(serialize_npy(make_npy<uint8_t>(DType::kBool, {2, 3}, bools)), to_bytes(kNumpyBool));
  const std::vector<int32_t> ints = {1, -2, 3};
  EXPECT_EQ(serialize_npy(make_npy<int32_t>(DType::kInt32, {3}, ints)), to_bytes(kNumpyInt32));
}

TEST(Npy, HeaderIsPaddedTo64Bytes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {7}, {1, 1}, {4, 0, 9}, {123456789012, 0}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}};
  for (const auto& shape : shapes) {
    const NpyArray array = make_npy<float>(DType::kFloat32, shape,
                                           std::vector<float>(size_t(NpyArray{DType::kFloat32, shape, {}}.size())));
    const auto image = serialize_npy(array);
    const size_t header_size = std::to_integer<size_t>(image[8]) | std::to_integer<size_t>(image[9]) << 8;
    EXPECT_EQ(image[6], std::byte{1});
    EXPECT_EQ((10 + header_size) % 64, 0u);
    EXPECT_EQ(image[10 + header_size - 1], std::byte{'\n'});
    const NpyArray back = parse_npy(image, kSource);
    EXPECT_EQ(back.shape, shape);
  }
}

TEST(Npy, LongHeaderUsesVersion2) {
  // 22,000 dimensions of 1 need about 66,000 header bytes, past version 1.0's 16-bit length.
  const std::vector<int64_t> shape(22000, 1);
  const std::vector<int64_t> value = {-5};
  const auto image = serialize_npy(make_npy<int64_t>(DType::kInt64, shape, value));
  EXPECT_EQ(image[6], std::byte{2});
  const size_t header_size = std::to_integer<size_t>(image[8]) | std::to_integer<size_t>(image[9]) << 8 |
                             std::to_integer<size_t>(image[10]) << 16 | std::to_integer<size_t>(image[11]) << 24;
  EXPECT_GT(header_size, 0xFFFFu);
  EXPECT_EQ((12 + header_size) % 64, 0u);
  const NpyArray back = parse_npy(image, kSource);
  EXPECT_EQ(back.shape, shape);
  EXPECT_EQ(back.values<int64_t>()[0], -5);
}

template <class T>
void expect_round_trip(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  const NpyArray array = make_npy<T>(dtype, shape, values);
  EXPECT_EQ(array.dtype, dtype);
  EXPECT_EQ(array.shape, shape);
  ASSERT_EQ(array.data.size(), values.size() * sizeof(T));
  const NpyArray back = parse_npy(serialize_npy(array), kSource);
  EXPECT_EQ(back.dtype, dtype);
  EXPECT_EQ(back.shape, shape);
  EXPECT_EQ(back.data, array.data);
  const auto typed = back.values<T>();
  ASSERT_EQ(typed.size(), values.size());
  if (dtype != DType::kBool && !values.empty())
    EXPECT_EQ(std::memcmp(typed.data(), values.data(), array.data.size()), 0);
}

TEST(Npy, RoundTripsEveryDtype) {
  expect_round_trip<uint8_t>(DType::kBool, {2, 2}, {0, 1, 1, 0});
  expect_round_trip<uint8_t>(DType::kUint8, {5}, {0, 1, 127, 128, 255});
  expect_round_trip<uint16_t>(DType::kUint16, {3, 1}, {0x3F80, 0xBF80, 0xFFFF});  // bf16 1.0, -1.0, NaN
  expect_round_trip<int32_t>(DType::kInt32, {2, 1, 2}, {INT32_MIN, -1, 0, INT32_MAX});
  expect_round_trip<int64_t>(DType::kInt64, {2}, {INT64_MIN, INT64_MAX});
  expect_round_trip<float>(DType::kFloat32, {}, {-0.5f});
  expect_round_trip<float>(DType::kFloat32, {1, 3},
                           {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 1e-40f});
  expect_round_trip<int32_t>(DType::kInt32, {0, 4}, {});
}

TEST(Npy, BoolsAreStoredAsZeroOrOne) {
  const std::vector<uint8_t> raw = {0, 2, 255};
  const NpyArray made = make_npy<uint8_t>(DType::kBool, {3}, raw);
  EXPECT_EQ(made.data, (std::vector<std::byte>{std::byte{0}, std::byte{1}, std::byte{1}}));
  const NpyArray parsed = parse_npy(npy_image(header_dict("'|b1'", "(3,)"), std::string("\0\x02\xff", 3)), kSource);
  EXPECT_EQ(parsed.data, made.data);
}

TEST(Npy, AcceptsHeaderVariants) {
  const std::string one_byte(1, '\x07');
  for (const char* descr : {"'|b1'", "'<b1'", "'=b1'", "'|u1'", "'<u1'", "'=u1'", "'>u1'"})
    EXPECT_NO_THROW(parse_npy(npy_image(header_dict(descr, "(1,)"), one_byte), kSource)) << descr;
  const std::string four_bytes(4, '\x01');
  EXPECT_EQ(parse_npy(npy_image(header_dict("'=i4'", "(1,)"), four_bytes), kSource).dtype, DType::kInt32);
  EXPECT_EQ(parse_npy(npy_image(header_dict("'<f4'", "()"), four_bytes), kSource).shape.size(), 0u);
  // Python 2 longs, double quotes, other key order, no trailing comma, 16-byte alignment of old numpy.
  EXPECT_EQ(parse_npy(npy_image(header_dict("'<u2'", "(2L, 1L)"), four_bytes), kSource).shape,
            (std::vector<int64_t>{2, 1}));
  EXPECT_NO_THROW(parse_npy(
      npy_image("{\"shape\": (1,), \"fortran_order\": False, \"descr\": \"<i4\"}", four_bytes, 1, 16), kSource));
  EXPECT_NO_THROW(parse_npy(npy_image("{ 'descr' : '<i4' ,'fortran_order':False,'shape':( 1 , ) }", four_bytes),
                            kSource));
  for (int major : {2, 3}) {
    const NpyArray array = parse_npy(npy_image(header_dict("'<i4'", "(1,)"), four_bytes, major), kSource);
    EXPECT_EQ(array.values<int32_t>()[0], 0x01010101);
  }
}

TEST(Npy, RejectsBadPrelude) {
  auto image = to_bytes(kNumpyInt32);
  image[1] = std::byte{'n'};
  EXPECT_NE(parse_error(image).find("bad magic"), std::string::npos);
  EXPECT_NE(parse_error(to_bytes("PK\x03\x04 a zip file")).find("bad magic"), std::string::npos);
  const auto numpy_int32 = to_bytes(kNumpyInt32);
  for (size_t size : {0, 3, 6, 7, 9, 10, 60, 127})
    EXPECT_NE(parse_error(std::span(numpy_int32).first(size)).find("truncated header"), std::string::npos) << size;
  for (const auto& [major, minor] : {std::pair{0, 0}, std::pair{4, 0}, std::pair{1, 1}}) {
    image = to_bytes(kNumpyInt32);
    image[6] = std::byte(major);
    image[7] = std::byte(minor);
    EXPECT_NE(parse_error(image).find("unsupported .npy format version"), std::string::npos);
  }
}

TEST(Npy, RejectsBadData) {
  const auto image = to_bytes(kNumpyInt32);
  EXPECT_NE(parse_error(std::span(image).first(image.size() - 1)).find("truncated data"), std::string::npos);
  EXPECT_NE(parse_error(std::span(image).first(128)).find("truncated data"), std::string::npos);
  auto longer = image;
  longer.push_back(std::byte{0});
  EXPECT_NE(parse_error(longer).find("data size mismatch"), std::string::npos);
}

TEST(Npy, RejectsBadHeaders) {
  const std::string i4 = "'<i4'";
  for (const std::string& dict : {std::string("['descr', '<i4']"), std::string("{'descr': '<i4'"),
                                  std::string("{'descr: '<i4', 'fortran_order': False, 'shape': (1,)}"),
                                  std::string("{'descr': '<i4' 'fortran_order': False, 'shape': (1,)}"),
                                  std::string("{'descr': <i4, 'fortran_order': False, 'shape': (1,)}"),
                                  std::string("{'descr': '<i4', 'fortran_order': false, 'shape': (1,)}"),
                                  std::string("{'descr': '<i4', 'fortran_order': False, 'shape': (1,)} x"),
                                  std::string("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), 'shape': (1,)}"),
                                  std::string("{'descr': '<i4', 'fortran_order': False, 'shape': (1.5,)}"),
                                  std::string("{'descr': '<i4', 'fortran_order': False, 'shape': (-,)}"),
                                  std::string(""), "{'shape': " + std::string(40, '(')})
    EXPECT_NE(dict_error(dict, "\1\0\0\0").find("header dict is not parseable"), std::string::npos) << dict;

  EXPECT_NE(dict_error("{'descr': '<i4', 'shape': (1,)}").find("lacks the key 'fortran_order'"), std::string::npos);
  EXPECT_NE(dict_error("{'fortran_order': False, 'shape': (1,)}").find("lacks the key 'descr'"), std::string::npos);
  EXPECT_NE(dict_error("{'descr': '<i4', 'fortran_order': False}").find("lacks the key 'shape'"), std::string::npos);
  EXPECT_NE(dict_error("{'descr': '<i4', 'fortran_order': False, 'shape': (), 'x': 1}").find("unexpected keys"),
            std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(1,)", "True"), "\1\0\0\0").find("fortran_order is True"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(1,)", "1"), "\1\0\0\0").find("not True or False"), std::string::npos);

  EXPECT_NE(dict_error(header_dict("'<f8'", "(1,)"), std::string(8, '\0')).find("unsupported dtype '<f8'"),
            std::string::npos);
  EXPECT_NE(dict_error(header_dict("'|i4'", "(1,)"), "\1\0\0\0").find("unsupported dtype '|i4'"), std::string::npos);
  EXPECT_NE(dict_error(header_dict("'<U3'", "(1,)")).find("unsupported dtype '<U3'"), std::string::npos);
  EXPECT_NE(dict_error(header_dict("[('a', '<i4')]", "(1,)"), "\1\0\0\0").find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(dict_error(header_dict("'>i4'", "(1,)"), "\0\0\0\1").find("big-endian"), std::string::npos);
  EXPECT_NE(dict_error(header_dict("'>f4'", "()"), "\0\0\0\1").find("big-endian"), std::string::npos);

  EXPECT_NE(dict_error(header_dict(i4, "(-1, 3)")).find("negative"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(99999999999999999999,)")).find("overflows"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(-99999999999999999999,)")).find("overflows"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(4611686018427387904, 4)")).find("overflows"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(2305843009213693952,)")).find("overflows"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "[1]"), "\1\0\0\0").find("not a tuple"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "(1)"), "\1\0\0\0").find("not a tuple"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "('1',)"), "\1\0\0\0").find("non-integer"), std::string::npos);
  EXPECT_NE(dict_error(header_dict(i4, "((1,),)"), "\1\0\0\0").find("non-integer"), std::string::npos);
  // A zero dimension makes the array empty whatever the others are, as in numpy.
  EXPECT_EQ(parse_npy(npy_image(header_dict(i4, "(4611686018427387904, 4, 0)"), ""), kSource).size(), 0);
}

TEST(Npy, FuzzedImagesOnlyThrowInvalidArgument) {
  std::vector<std::vector<std::byte>> seeds = {to_bytes(kNumpyBool), to_bytes(kNumpyInt32)};
  const std::vector<int64_t> int64s = {1, -2, 3, 4};
  seeds.push_back(serialize_npy(make_npy<int64_t>(DType::kInt64, {2, 2}, int64s)));
  seeds.push_back(npy_image(header_dict("'<u2'", "(2L, 1L)"), "abcd", 3));
  // Bytes that steer the header parser into its branches.
  const std::string alphabet = "{}()[],:'\" \n-0123456789LTrueFalsNn<>|=biuf\x93\x01";
  std::mt19937_64 rng(20240601);
  int accepted = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    auto image = seeds[trial % seeds.size()];
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits && !image.empty(); ++e) {
      const size_t at = rng() % image.size();
      switch (rng() % 5) {
        case 0: image.resize(at); break;
        case 1: image[at] = std::byte(rng()); break;
        case 2: image[at] = std::byte(alphabet[rng() % alphabet.size()]); break;
        case 3: image.insert(image.begin() + ptrdiff_t(at), std::byte(alphabet[rng() % alphabet.size()])); break;
        default: image.erase(image.begin() + ptrdiff_t(at)); break;
      }
    }
    try {
      const NpyArray array = parse_npy(image, kSource);
      ++accepted;
      const NpyArray again = parse_npy(serialize_npy(array), kSource);
      EXPECT_EQ(again.dtype, array.dtype);
      EXPECT_EQ(again.shape, array.shape);
      EXPECT_EQ(again.data, array.data);
    } catch (const InvalidArgument& error) {
      ASSERT_EQ(error.argument(), kSource) << error.what();
    } catch (const std::exception& error) {
      FAIL() << "trial " << trial << " threw a non-InvalidArgument exception: " << error.what();
    }
  }
  // Most mutations break the file; some (a byte inside the data or the padding) must still read.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 6000);
}

TEST(Npy, MakeNpyChecksItsArguments) {
  const std::vector<float> floats(6);
  const auto argument_of = [](auto action) {
    try {
      action();
    } catch (const InvalidArgument& error) {
      return error.argument();
    }
    return std::string();
  };
  EXPECT_EQ(argument_of([&] { make_npy<float>(DType::kInt32, {6}, floats); }), "dtype");
  EXPECT_EQ(argument_of([&] { make_npy<float>(DType::kFloat32, {5}, floats); }), "values");
  EXPECT_EQ(argument_of([&] { make_npy<float>(DType::kFloat32, {-6}, floats); }), "shape");
  EXPECT_EQ(argument_of([] { make_npy<int64_t>(DType::kUint8, {}, std::vector<int64_t>{1}); }), "dtype");
  NpyArray broken = make_npy<float>(DType::kFloat32, {2, 3}, floats);
  broken.data.pop_back();
  EXPECT_EQ(argument_of([&] { serialize_npy(broken); }), "array");
}

TEST(Npy, FileRoundTripAndIoErrors) {
  const TempPath file(".npy");
  const std::vector<uint16_t> values = {1, 2, 3, 65535};
  const NpyArray array = make_npy<uint16_t>(DType::kUint16, {2, 2}, values);
  write_npy(file.path(), array);
  const NpyArray back = read_npy(file.path());
  EXPECT_EQ(back.dtype, array.dtype);
  EXPECT_EQ(back.shape, array.shape);
  EXPECT_EQ(back.data, array.data);

  const TempPath missing("_missing");
  try {
    read_npy(missing.path());
    FAIL() << "read_npy accepted a missing file";
  } catch (const InvalidArgument&) {
    FAIL() << "an I/O failure is not an invalid argument";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(missing.path().string()), std::string::npos);
    EXPECT_NE(std::string(error.what()).find(std::strerror(ENOENT)), std::string::npos);
  }
  EXPECT_THROW(write_npy(missing.path() / "no_such_dir" / "x.npy", array), Error);
  std::filesystem::create_directory(missing.path());
  EXPECT_THROW(read_npy(missing.path()), Error);

  // A malformed file names the file.
  const std::string text = "not an array";
  std::FILE* out = std::fopen(file.path().c_str(), "wb");
  ASSERT_NE(out, nullptr);
  std::fwrite(text.data(), 1, text.size(), out);
  std::fclose(out);
  try {
    read_npy(file.path());
    FAIL() << "read_npy accepted a text file";
  } catch (const InvalidArgument& error) {
    EXPECT_EQ(error.argument(), file.path().string());
  }
}

TEST(NpyMask, RoundTrip) {
  std::mt19937_64 rng(7);
  BlockMask mask(3, 5, 70);
  for (int h = 0; h < 3; ++h)
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 70; ++j) mask.set(h, i, j, rng() % 3 == 0);
  const NpyArray array = mask_to_npy(mask);
  EXPECT_EQ(array.dtype, DType::kBool);
  EXPECT_EQ(array.shape, (std::vector<int64_t>{3, 5, 70}));
  EXPECT_EQ(mask_from_npy(parse_npy(serialize_npy(array), kSource), kSource), mask);

  const TempPath file(".npy");
  write_npy(file.path(), mask_to_npy(mask));
  EXPECT_EQ(mask_from_npy(read_npy(file.path()), file.path().string()), mask);
}

TEST(NpyMask, TwoDimensionalAndUint8) {
  const NpyArray two_d = parse_npy(to_bytes(kNumpyBool), kSource);
  const BlockMask mask = mask_from_npy(two_d, kSource);
  EXPECT_EQ(mask.heads(), 1);
  EXPECT_EQ(mask.q_blocks(), 2);
  EXPECT_EQ(mask.kv_blocks(), 3);
  EXPECT_EQ(mask.to_dense(), (std::vector<uint8_t>{1, 0, 1, 0, 0, 1}));

  const std::vector<uint8_t> values = {0, 7, 1, 255};
  const BlockMask from_uint8 = mask_from_npy(make_npy<uint8_t>(DType::kUint8, {1, 2, 2}, values), kSource);
  EXPECT_EQ(from_uint8.to_dense(), (std::vector<uint8_t>{0, 1, 1, 1}));
}

TEST(NpyMask, RejectsOtherDtypesAndRanks) {
  const auto expect_rejected = [](const NpyArray& array) {
    try {
      mask_from_npy(array, kSource);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& error) {
      EXPECT_EQ(error.argument(), kSource);
    }
  };
  expect_rejected(make_npy<int32_t>(DType::kInt32, {1, 2}, std::vector<int32_t>{0, 1}));
  expect_rejected(make_npy<float>(DType::kFloat32, {1, 1, 1}, std::vector<float>{1}));
  expect_rejected(make_npy<uint8_t>(DType::kBool, {4}, std::vector<uint8_t>(4)));
  expect_rejected(make_npy<uint8_t>(DType::kBool, {1, 1, 2, 2}, std::vector<uint8_t>(4)));
  expect_rejected(make_npy<uint8_t>(DType::kBool, {0, 1, 3'000'000'000}, {}));
  NpyArray inconsistent = make_npy<uint8_t>(DType::kUint8, {2, 2}, std::vector<uint8_t>(4));
  inconsistent.data.pop_back();
  expect_rejected(inconsistent);
  inconsistent.shape = {-2, -2};
  expect_rejected(inconsistent);
}

TEST(NpyPermutations, WritesInt32HeadsByRows) {
  const std::vector<int32_t> permutations = {2, 0, 1, 0, 1, 2};
  const NpyArray array = permutations_to_npy(permutations, 2, 3);
  EXPECT_EQ(array.dtype, DType::kInt32);
  EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3}));
  const NpyArray back = parse_npy(serialize_npy(array), kSource);
  EXPECT_EQ(std::vector<int32_t>(back.values<int32_t>().begin(), back.values<int32_t>().end()), permutations);
  EXPECT_THROW(permutations_to_npy(permutations, 2, 2), InvalidArgument);
  EXPECT_THROW(permutations_to_npy(permutations, -2, -3), InvalidArgument);
  EXPECT_EQ(permutations_to_npy({}, 0, 5).shape, (std::vector<int64_t>{0, 5}));
}

}  // namespace
}  // namespace wavealign
