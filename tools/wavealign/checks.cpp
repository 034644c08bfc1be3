#include "checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

namespace wavealign::cli {

namespace {

std::string bound_text(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", value);
  return buffer;
}

// The whole text as a double; false for anything else (trailing characters, an empty text).
bool parse_number(const std::string& text, double& value) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin != end && *begin == '+') ++begin;  // from_chars takes no '+', users may type one
  const auto [stop, error] = std::from_chars(begin, end, value);
  return begin != end && stop == end && error == std::errc();
}

std::string check_number(const std::string& text, const Interval& interval) {
  double value = 0;
  if (!parse_number(text, value)) return "must be a number " + interval_text(interval) + ", got '" + text + "'";
  if (!std::isfinite(value)) return "must be a finite number " + interval_text(interval) + ", got " + text;
  if (!interval.contains(value)) return "must be " + interval_text(interval) + ", got " + text;
  return {};
}

}  // namespace

std::string interval_text(const Interval& interval) {
  const bool bounded_below = std::isfinite(interval.min);
  const bool bounded_above = std::isfinite(interval.max);
  if (bounded_below && bounded_above)
    return "in " + std::string(interval.open_min ? "(" : "[") + bound_text(interval.min) + ", " +
           bound_text(interval.max) + (interval.open_max ? ")" : "]");
  if (bounded_below) return (interval.open_min ? "> " : ">= ") + bound_text(interval.min);
  if (bounded_above) return (interval.open_max ? "< " : "<= ") + bound_text(interval.max);
  return "(any finite value)";
}

CLI::Validator number_in(Interval interval) {
  return CLI::Validator([interval](std::string& text) { return check_number(text, interval); },
                        "NUMBER " + interval_text(interval));
}

CLI::Validator word_or_number(std::vector<std::string> words, Interval interval) {
  std::string choices;
  for (const std::string& word : words) choices += word + "|";
  const std::string description = choices + "NUMBER " + interval_text(interval);
  return CLI::Validator(
      [words = std::move(words), interval, description](std::string& text) -> std::string {
        if (std::find(words.begin(), words.end(), text) != words.end()) return {};
        const std::string problem = check_number(text, interval);
        return problem.empty() ? problem : "must be " + description + ", got '" + text + "'";
      },
      description);
}

void check_output_is_not_an_input(std::string_view out_flag, const std::string& out, FlagNames inputs) {
  for (const auto& [flag, input] : inputs) {
    std::error_code error;
    if (input.empty() || !std::filesystem::equivalent(out, input, error)) continue;
    throw InvalidArgument(std::string(out_flag), "names the same file as " + std::string(flag) + " (" +
                                                     std::string(input) +
                                                     "): writing it would destroy that input; choose another path");
  }
}

std::string size_text(int64_t bytes) {
  char text[32];
  if (bytes >= 1'000'000'000)
    std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  else if (bytes >= 1'000'000)
    std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  else
    std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
  return text;
}

void check_output_size(std::string_view out_flag, int64_t bytes, const std::string& what, bool allowed) {
  if (bytes <= kLargeOutputBytes) return;
  const std::string size = size_text(bytes) + " (" + std::to_string(bytes) + " bytes: " + what + ")";
  if (!allowed)
    throw InvalidArgument(std::string(out_flag), "would be " + size + "; outputs over 1 GB (" +
                                                     std::to_string(kLargeOutputBytes) +
                                                     " bytes) are written only with --allow-large-output");
  std::cerr << "wavealign: warning: writing " << size << " (--allow-large-output)" << std::endl;
}

void add_allow_large_output_flag(CLI::App& command, bool& allowed) {
  command.add_flag("--allow-large-output", allowed,
                   "write an output over " + size_text(kLargeOutputBytes) + " (refused without this flag)");
}

}  // namespace wavealign::cli
