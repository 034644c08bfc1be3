// Errors thrown by wavealign. Library code never exits; it throws one of these.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace wavealign {

/// Any failure inside wavealign (I/O, CUDA, internal invariant).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed a bad value; `argument()` names it (a parameter, flag or file).
class InvalidArgument : public Error {
 public:
  InvalidArgument(std::string argument, const std::string& message)
      : Error("invalid argument '" + argument + "': " + message), argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

namespace detail {
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

}  // namespace wavealign

/// Throws InvalidArgument naming `argument` when `condition` is false; the rest is streamed into the message.
#define WA_CHECK_ARG(condition, argument, ...)                                                   \
  do {                                                                                           \
    if (!(condition)) throw ::wavealign::InvalidArgument((argument), ::wavealign::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Throws Error when an internal invariant or an I/O step fails.
#define WA_CHECK(condition, ...)                                                                 \
  do {                                                                                           \
    if (!(condition)) throw ::wavealign::Error(::wavealign::detail::concat(__VA_ARGS__));       \
  } while (0)
