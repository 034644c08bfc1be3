#include "wavealign/io.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string_view>
#include <type_traits>

#include "wavealign/error.h"

namespace wavealign {

// Array bytes are copied verbatim between files and memory, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kMagicSize = 8;  // magic string, major and minor version
constexpr size_t kAlign = 64;     // numpy pads the header so that the data starts 64-byte aligned
// numpy leaves room for the first axis to grow to 21 digits so that appending rewrites the header in place;
// we add the same spaces so that our files match numpy's byte for byte.
constexpr int kGrowthAxisDigits = 21;
constexpr int kMaxNesting = 16;  // bounds the parser's recursion on hostile headers; valid ones need 2

/// One Python literal of the header dict; only the forms numpy writes are understood.
struct Literal {
  enum class Kind { kString, kBool, kNone, kInt, kTuple, kList };
  Kind kind = Kind::kNone;
  std::string text;   // kString; the source spelling for the other kinds (for messages)
  bool flag = false;  // kBool
  int64_t number = 0;
  bool overflow = false;  // kInt that does not fit int64
  std::vector<Literal> items;
};

/// Recursive-descent parser for the header: a dict literal with string keys, then spaces and a newline.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  std::map<std::string, Literal> parse_dict() {
    std::map<std::string, Literal> dict;
    expect('{');
    skip_space();
    while (peek() != '}') {
      if (peek() != '\'' && peek() != '"') fail("expected a quoted key");
      std::string key = parse_string();
      skip_space();
      expect(':');
      Literal value = parse_value(0);
      if (!dict.emplace(key, std::move(value)).second) fail("key '" + key + "' appears twice");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the closing '}'");
    return dict;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(source_, detail::concat("header dict is not parseable: ", what, " at offset ", pos_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  std::string parse_string() {
    const char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      out += text_[pos_++];
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  Literal parse_value(int depth) {
    if (depth > kMaxNesting) fail("literal nested too deeply");
    skip_space();
    const size_t start = pos_;
    const char c = peek();
    Literal value;
    if (c == '\'' || c == '"') {
      value.kind = Literal::Kind::kString;
      value.text = parse_string();
      return value;
    }
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      bool comma = false;
      skip_space();
      while (peek() != close) {
        value.items.push_back(parse_value(depth + 1));
        skip_space();
        if (peek() == ',') {
          ++pos_;
          comma = true;
          skip_space();
        } else if (peek() != close) {
          fail(std::string("expected ',' or '") + close + "'");
        }
      }
      ++pos_;
      // As in Python, "(3)" is just 3; only a comma or emptiness makes a tuple.
      if (c == '(' && value.items.size() == 1 && !comma) return std::move(value.items.front());
      value.kind = c == '(' ? Literal::Kind::kTuple : Literal::Kind::kList;
      value.text = std::string(text_.substr(start, pos_ - start));
      return value;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_int();
    while (pos_ < text_.size() && std::isalpha(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    value.text = std::string(text_.substr(start, pos_ - start));
    if (value.text == "True" || value.text == "False") {
      value.kind = Literal::Kind::kBool;
      value.flag = value.text == "True";
    } else if (value.text == "None") {
      value.kind = Literal::Kind::kNone;
    } else {
      pos_ = start;
      fail("unexpected token");
    }
    return value;
  }

  Literal parse_int() {
    const size_t start = pos_;
    Literal value;
    value.kind = Literal::Kind::kInt;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit");
    // Accumulate as a negative number so that INT64_MIN parses too.
    int64_t number = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = text_[pos_++] - '0';
      if (number < (std::numeric_limits<int64_t>::min() + digit) / 10) value.overflow = true;
      if (!value.overflow) number = number * 10 - digit;
    }
    if (peek() == 'L' || peek() == 'l') ++pos_;  // Python 2 long suffix, found in old files
    if (!negative && number == std::numeric_limits<int64_t>::min()) value.overflow = true;
    value.number = negative ? number : -number;
    value.text = std::string(text_.substr(start, pos_ - start));
    return value;
  }

  std::string_view text_;
  const std::string& source_;
  size_t pos_ = 0;
};

std::string shape_text(std::span<const int64_t> shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

/// Product of the dimensions; throws InvalidArgument(argument) for a negative or overflowing shape.
int64_t element_count(std::span<const int64_t> shape, int item_size, const std::string& argument) {
  for (int64_t dim : shape) WA_CHECK_ARG(dim >= 0, argument, "shape ", shape_text(shape), " has a negative dimension");
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t count = 1, bytes = 0;
  for (int64_t dim : shape)
    WA_CHECK_ARG(!__builtin_mul_overflow(count, dim, &count), argument, "shape ", shape_text(shape),
                 " overflows 64-bit element counts");
  WA_CHECK_ARG(!__builtin_mul_overflow(count, int64_t{item_size}, &bytes), argument, "shape ", shape_text(shape),
               " overflows 64-bit byte counts");
  return count;
}

/// Maps a descr string to a DType; 1-byte types ignore the byte-order character.
DType parse_descr(const Literal& descr, const std::string& source) {
  constexpr std::string_view kSupported = "|b1, |u1, <u2, <i4, <i8, <f4";
  WA_CHECK_ARG(descr.kind == Literal::Kind::kString, source, "unsupported dtype ", descr.text,
               " (only simple dtypes are supported: ", kSupported, ")");
  const std::string& text = descr.text;
  const bool has_order = !text.empty() && std::string_view("<>|=").find(text[0]) != std::string_view::npos;
  const char order = has_order ? text[0] : '=';
  const std::string_view code = std::string_view(text).substr(has_order ? 1 : 0);
  static constexpr std::array<std::pair<std::string_view, DType>, 6> kCodes = {{{"b1", DType::kBool},
                                                                                 {"u1", DType::kUint8},
                                                                                 {"u2", DType::kUint16},
                                                                                 {"i4", DType::kInt32},
                                                                                 {"i8", DType::kInt64},
                                                                                 {"f4", DType::kFloat32}}};
  for (const auto& [name, dtype] : kCodes) {
    if (name != code) continue;
    if (dtype_size(dtype) == 1) return dtype;
    WA_CHECK_ARG(order != '>', source, "big-endian dtype '", text, "' is not supported (expected '<", code, "')");
    WA_CHECK_ARG(order != '|', source, "unsupported dtype '", text, "' (a ", dtype_size(dtype),
                 "-byte type needs a byte order, expected '<", code, "')");
    return dtype;
  }
  throw InvalidArgument(source, detail::concat("unsupported dtype '", text, "' (supported: ", kSupported, ")"));
}

uint32_t read_le(std::span<const std::byte> bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = (value << 8) | std::to_integer<uint32_t>(bytes[i]);
  return value;
}

void normalize_bools(std::vector<std::byte>& data) {
  for (std::byte& b : data) b = b != std::byte{0} ? std::byte{1} : std::byte{0};
}

using FilePtr = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

}  // namespace

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUint8: return 1;
    case DType::kUint16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64: return 8;
  }
  throw InvalidArgument("dtype", detail::concat("unknown dtype value ", static_cast<int>(dtype)));
}

std::string dtype_descr(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "|b1";
    case DType::kUint8: return "|u1";
    case DType::kUint16: return "<u2";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kFloat32: return "<f4";
  }
  throw InvalidArgument("dtype", detail::concat("unknown dtype value ", static_cast<int>(dtype)));
}

int64_t NpyArray::size() const { return element_count(shape, dtype_size(dtype), "shape"); }

NpyArray parse_npy(std::span<const std::byte> bytes, const std::string& source) {
  const size_t magic_seen = std::min(bytes.size(), kMagic.size());
  for (size_t i = 0; i < magic_seen; ++i)
    WA_CHECK_ARG(std::to_integer<char>(bytes[i]) == kMagic[i], source, "bad magic string: not a .npy file");
  WA_CHECK_ARG(bytes.size() >= kMagicSize, source, "truncated header: ", bytes.size(),
               " bytes, the magic string and version alone take ", kMagicSize);
  const int major = std::to_integer<int>(bytes[6]), minor = std::to_integer<int>(bytes[7]);
  WA_CHECK_ARG(major >= 1 && major <= 3 && minor == 0, source, "unsupported .npy format version ", major, ".", minor,
               " (expected 1.0, 2.0 or 3.0)");
  // Version 1.0 stores the header length in 2 bytes, later versions in 4.
  const size_t length_size = major == 1 ? 2 : 4;
  WA_CHECK_ARG(bytes.size() >= kMagicSize + length_size, source, "truncated header: the ", length_size,
               "-byte header length is cut off");
  const size_t header_size = read_le(bytes.subspan(kMagicSize, length_size));
  const size_t header_start = kMagicSize + length_size;
  WA_CHECK_ARG(bytes.size() - header_start >= header_size, source, "truncated header: it declares ", header_size,
               " bytes, only ", bytes.size() - header_start, " follow");

  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + header_start), header_size);
  auto dict = HeaderParser(header, source).parse_dict();
  for (const char* key : {"descr", "fortran_order", "shape"})
    WA_CHECK_ARG(dict.contains(key), source, "header dict lacks the key '", key, "'");
  WA_CHECK_ARG(dict.size() == 3, source, "header dict has unexpected keys (expected only descr, fortran_order, shape)");

  NpyArray array;
  array.dtype = parse_descr(dict["descr"], source);
  const Literal& fortran = dict["fortran_order"];
  WA_CHECK_ARG(fortran.kind == Literal::Kind::kBool, source, "fortran_order is ", fortran.text, ", not True or False");
  WA_CHECK_ARG(!fortran.flag, source, "fortran_order is True; only C-order arrays are supported");
  const Literal& shape = dict["shape"];
  WA_CHECK_ARG(shape.kind == Literal::Kind::kTuple, source, "shape ", shape.text, " is not a tuple");
  for (const Literal& dim : shape.items) {
    WA_CHECK_ARG(dim.kind == Literal::Kind::kInt, source, "shape ", shape.text, " has a non-integer entry");
    WA_CHECK_ARG(!dim.overflow, source, "shape ", shape.text, " has a dimension that overflows 64 bits");
    array.shape.push_back(dim.number);
  }

  const int64_t count = element_count(array.shape, dtype_size(array.dtype), source);
  const size_t expected = size_t(count) * dtype_size(array.dtype);
  const size_t present = bytes.size() - header_start - header_size;
  WA_CHECK_ARG(present >= expected, source, "truncated data: shape ", shape_text(array.shape), " of '",
               dtype_descr(array.dtype), "' needs ", expected, " bytes, only ", present, " present");
  WA_CHECK_ARG(present == expected, source, "data size mismatch: shape ", shape_text(array.shape), " of '",
               dtype_descr(array.dtype), "' needs ", expected, " bytes, but ", present, " follow the header");
  const auto data = bytes.subspan(header_start + header_size);
  array.data.assign(data.begin(), data.end());
  // numpy reads any nonzero byte as True; keep bool data canonical 0/1.
  if (array.dtype == DType::kBool) normalize_bools(array.data);
  return array;
}

std::vector<std::byte> serialize_npy(const NpyArray& array) {
  const int64_t count = array.size();
  WA_CHECK_ARG(array.data.size() == size_t(count) * dtype_size(array.dtype), "array", "holds ", array.data.size(),
               " bytes, shape ", shape_text(array.shape), " of '", dtype_descr(array.dtype), "' needs ",
               size_t(count) * dtype_size(array.dtype));
  // Same text as numpy's _write_array_header: sorted keys, repr values, a trailing ", ".
  std::string header = "{'descr': '" + dtype_descr(array.dtype) + "', 'fortran_order': False, 'shape': " +
                       shape_text(array.shape) + ", }";
  if (!array.shape.empty())
    header.append(size_t(std::max<int>(0, kGrowthAxisDigits - int(std::to_string(array.shape[0]).size()))), ' ');
  // Spaces and a final newline pad the prelude plus header to a multiple of 64 (a full 64 when already aligned,
  // as numpy does); version 2.0 only when the padded header no longer fits version 1.0's 16-bit length.
  auto padded_size = [&](size_t length_size) {
    const size_t unpadded = header.size() + 1;
    return unpadded + kAlign - (kMagicSize + length_size + unpadded) % kAlign;
  };
  const bool version2 = padded_size(2) > 0xFFFF;
  const size_t length_size = version2 ? 4 : 2;
  const size_t header_size = padded_size(length_size);
  WA_CHECK_ARG(header_size <= 0xFFFFFFFFu, "array", "rank ", array.shape.size(), " makes the header too long");
  header.append(header_size - header.size() - 1, ' ');
  header += '\n';

  std::vector<std::byte> out;
  out.reserve(kMagicSize + length_size + header_size + array.data.size());
  for (char c : kMagic) out.push_back(std::byte(c));
  out.push_back(std::byte(version2 ? 2 : 1));
  out.push_back(std::byte(0));
  for (size_t i = 0; i < length_size; ++i) out.push_back(std::byte((header_size >> (8 * i)) & 0xFF));
  for (char c : header) out.push_back(std::byte(c));
  out.insert(out.end(), array.data.begin(), array.data.end());
  return out;
}

NpyArray read_npy(const std::filesystem::path& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"), &std::fclose);
  WA_CHECK(file, "cannot open '", path.string(), "' for reading: ", std::strerror(errno));
  std::vector<std::byte> bytes;
  std::array<std::byte, 1 << 16> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), file.get()))
    bytes.insert(bytes.end(), buffer.begin(), buffer.begin() + n);
  WA_CHECK(!std::ferror(file.get()), "cannot read '", path.string(), "': ", std::strerror(errno));
  return parse_npy(bytes, path.string());
}

void write_npy(const std::filesystem::path& path, const NpyArray& array) {
  const std::vector<std::byte> bytes = serialize_npy(array);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  WA_CHECK(file, "cannot open '", path.string(), "' for writing: ", std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  int error = errno;
  // fclose flushes the buffer, so a full disk may only show here.
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    error = errno;
  }
  WA_CHECK(ok, "cannot write '", path.string(), "': ", std::strerror(error));
}

template <class T>
NpyArray make_npy(DType dtype, std::vector<int64_t> shape, std::span<const T> values) {
  const bool matches = std::is_same_v<T, uint8_t> ? (dtype == DType::kBool || dtype == DType::kUint8)
                       : std::is_same_v<T, uint16_t> ? dtype == DType::kUint16
                       : std::is_same_v<T, int32_t>  ? dtype == DType::kInt32
                       : std::is_same_v<T, int64_t>  ? dtype == DType::kInt64
                                                     : dtype == DType::kFloat32;
  WA_CHECK_ARG(matches, "dtype", "'", dtype_descr(dtype), "' does not match a ", sizeof(T), "-byte element type");
  const int64_t count = element_count(shape, dtype_size(dtype), "shape");
  WA_CHECK_ARG(values.size() == size_t(count), "values", "has ", values.size(), " elements, shape ",
               shape_text(shape), " needs ", count);
  NpyArray array{dtype, std::move(shape), std::vector<std::byte>(values.size_bytes())};
  if (!values.empty()) std::memcpy(array.data.data(), values.data(), values.size_bytes());
  if (dtype == DType::kBool) normalize_bools(array.data);
  return array;
}

template NpyArray make_npy<uint8_t>(DType, std::vector<int64_t>, std::span<const uint8_t>);
template NpyArray make_npy<uint16_t>(DType, std::vector<int64_t>, std::span<const uint16_t>);
template NpyArray make_npy<int32_t>(DType, std::vector<int64_t>, std::span<const int32_t>);
template NpyArray make_npy<int64_t>(DType, std::vector<int64_t>, std::span<const int64_t>);
template NpyArray make_npy<float>(DType, std::vector<int64_t>, std::span<const float>);

BlockMask mask_from_npy(const NpyArray& array, const std::string& source) {
  WA_CHECK_ARG(array.dtype == DType::kBool || array.dtype == DType::kUint8, source, "a mask must be bool or uint8, got '",
               dtype_descr(array.dtype), "'");
  const size_t rank = array.shape.size();
  WA_CHECK_ARG(rank == 2 || rank == 3, source, "a mask must have shape [H, MB, NB] or [MB, NB], got ",
               shape_text(array.shape));
  const int64_t count = element_count(array.shape, 1, source);
  WA_CHECK_ARG(array.data.size() == size_t(count), source, "holds ", array.data.size(), " bytes, shape ",
               shape_text(array.shape), " needs ", count);
  // BlockMask counts blocks in int and rounds kv_blocks up to 64-bit words, so keep 63 below INT_MAX.
  for (int64_t dim : array.shape)
    WA_CHECK_ARG(dim <= INT_MAX - 63, source, "mask shape ", shape_text(array.shape), " exceeds ", INT_MAX - 63,
                 " blocks in a dimension");
  const int heads = rank == 3 ? int(array.shape[0]) : 1;
  const int q_blocks = int(array.shape[rank - 2]), kv_blocks = int(array.shape[rank - 1]);
  return BlockMask::from_dense({reinterpret_cast<const uint8_t*>(array.data.data()), array.data.size()}, heads,
                               q_blocks, kv_blocks);
}

NpyArray mask_to_npy(const BlockMask& mask) {
  const std::vector<uint8_t> dense = mask.to_dense();
  return make_npy<uint8_t>(DType::kBool, {mask.heads(), mask.q_blocks(), mask.kv_blocks()}, dense);
}

NpyArray permutations_to_npy(std::span<const int32_t> permutations, int heads, int q_blocks) {
  WA_CHECK_ARG(heads >= 0, "heads", "must be >= 0, got ", heads);
  WA_CHECK_ARG(q_blocks >= 0, "q_blocks", "must be >= 0, got ", q_blocks);
  WA_CHECK_ARG(permutations.size() == size_t(heads) * q_blocks, "permutations", "has ", permutations.size(),
               " entries, expected heads*q_blocks = ", size_t(heads) * q_blocks);
  return make_npy<int32_t>(DType::kInt32, {heads, q_blocks}, permutations);
}

}  // namespace wavealign
