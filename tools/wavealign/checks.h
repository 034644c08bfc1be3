// Checks of command-line numbers, shared by every subcommand. The validators read the value as the user typed
// it, before CLI11 converts it, so "nan", "inf", "-1" for an unsigned option, "1e3" for an integer and values
// outside the range all stop the parse: exit status 2 and a message that starts with the flag ("--plan-reuse:
// ..."). Checks that depend on other values (the frames a model takes, the heads of a mask) run in the
// subcommand; with_flag_names() makes the library's errors there name the flag too.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "wavealign/enums.h"
#include "wavealign/error.h"

namespace wavealign::cli {

/// Whether a finite value lies in the interval; `interval_text` writes it the way the messages do: "(0, 1]",
/// ">= 0", "> 0".
struct Interval {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool open_min = false;
  bool open_max = false;

  bool contains(double value) const {
    return (open_min ? value > min : value >= min) && (open_max ? value < max : value <= max);
  }
};
std::string interval_text(const Interval& interval);

/// A finite number in `interval`.
CLI::Validator number_in(Interval interval);

/// One of `words`, or a finite number in `interval` (e.g. --plan-cost gpu|cpu|MS).
CLI::Validator word_or_number(std::vector<std::string> words, Interval interval);

/// A decimal integer that fits T and lies in [min, max] (no sign for an unsigned T, no exponent, no fraction).
template <class T>
CLI::Validator integer_in(T min, T max = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>);
  const std::string range = max == std::numeric_limits<T>::max()
                                ? ">= " + std::to_string(min)
                                : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        T value{};
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error == std::errc::result_out_of_range)
          return "must be an integer " + range + ", got " + text + " (too large)";
        if (error != std::errc() || end != text.data() + text.size())
          return "must be an integer " + range + ", got '" + text + "'";
        if (value < min || value > max) return "must be an integer " + range + ", got " + text;
        return {};
      },
      "INT " + range);
}

/// The message of an InvalidArgument without its "invalid argument '<argument>': " prefix.
inline std::string message_of(const InvalidArgument& error) {
  const std::string prefix = "invalid argument '" + error.argument() + "': ";
  const std::string what = error.what();
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

/// Runs `body`. An InvalidArgument from the library that names one of `names`' first members (the library's
/// argument, e.g. "frames") is rethrown naming the second (the flag, e.g. "--frames"), with the same message.
using FlagNames = std::initializer_list<std::pair<std::string_view, std::string_view>>;
template <class Body>
decltype(auto) with_flag_names(FlagNames names, Body&& body) {
  try {
    return body();
  } catch (const InvalidArgument& error) {
    for (const auto& [argument, flag] : names)
      if (error.argument() == argument) throw InvalidArgument(std::string(flag), message_of(error));
    throw;
  }
}

/// Throws InvalidArgument naming `out_flag` when `out` is the same file as one of `inputs` (flag, path; an empty
/// path is not given): writing it would destroy an input the command reads. Checked before anything is written.
void check_output_is_not_an_input(std::string_view out_flag, const std::string& out, FlagNames inputs);

/// Outputs above this size need --allow-large-output: 1 GB, decimal, as the sizes are printed.
constexpr int64_t kLargeOutputBytes = 1'000'000'000;

/// The size check of an output file before it is built: over kLargeOutputBytes, InvalidArgument naming
/// `out_flag` with the size and `what` (e.g. "bool [40, 11364, 11364]") unless `allowed`, then a warning on
/// stderr. "19.6 GB" style text of a byte count: size_text.
void check_output_size(std::string_view out_flag, int64_t bytes, const std::string& what, bool allowed);
std::string size_text(int64_t bytes);

/// --allow-large-output, the confirmation of check_output_size.
void add_allow_large_output_flag(CLI::App& command, bool& allowed);

/// from_string<E>(value), its error naming `flag` instead of the enum's kind ("--orders" rather than "order").
template <class E>
E enum_flag(std::string_view flag, std::string_view value) {
  return with_flag_names({{EnumNames<E>::kind, flag}}, [&] { return from_string<E>(value); });
}

}  // namespace wavealign::cli
