// Errors as values: Status (ok or a message) and Result<T> (a value or a Status).
// Library code returns these; only main() turns them into exit codes.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace lily {

class Status {
 public:
  Status() = default;  // ok
  static Status ok() { return Status(); }
  static Status error(std::string msg) {
    Status s;
    s.msg_ = std::move(msg);
    s.failed_ = true;
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return msg_; }

 private:
  std::string msg_;
  bool failed_ = false;
};

template <typename... Args>
Status errorf(fmt::format_string<Args...> f, Args&&... args) {
  return Status::error(fmt::format(f, std::forward<Args>(args)...));
}

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status st) : v_(std::move(st)) {}   // NOLINT
  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  T& operator*() { return std::get<0>(v_); }
  Status status() const { return is_ok() ? Status::ok() : std::get<1>(v_); }
  const std::string& message() const { return std::get<1>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace lily

// Propagate an error Status from an expression returning Status.
#define LILY_TRY(expr)                          \
  do {                                          \
    ::lily::Status _st = (expr);                \
    if (!_st.is_ok()) return _st;               \
  } while (0)

#define LILY_CONCAT_(a, b) a##b
#define LILY_CONCAT(a, b) LILY_CONCAT_(a, b)
// Assign the value of a Result<T> expression or propagate its error.
#define LILY_ASSIGN_OR_RETURN(lhs, expr) LILY_ASSIGN_OR_RETURN_(LILY_CONCAT(_res_, __LINE__), lhs, expr)
#define LILY_ASSIGN_OR_RETURN_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.is_ok()) return tmp.status();       \
  lhs = std::move(tmp).value()

// Invariant checks: a failed check is a bug in lily, not bad input. Aborts with file:line.
#define LILY_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)
