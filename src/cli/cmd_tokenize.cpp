// `lily tokenize`: stdin text -> JSON ids (HF encode, add_special_tokens=false), or with
// --decode stdin JSON ids -> text. --jsonl handles one JSON document per line (the oracle
// tests use it to check many documents in one process; a line may be a byte array to encode
// bytes that are not UTF-8); --bench-iters times encode alone.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "text/tokenizer.h"

namespace lily::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  bool decode = false, skip_special = false, jsonl = false;
  int bench_iters = 0;
};

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

Result<std::vector<int32_t>> parse_ids(const nlohmann::json& j) {
  if (!j.is_array()) return errorf("expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer()) return errorf("expected integer token ids, got {}", v.dump());
    ids.push_back(v.get<int32_t>());
  }
  return ids;
}

void write(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

int bench(const Tokenizer& tok, const std::string& text, int iters) {
  // CPU time as well as wall time: on a shared machine the CPU figure is the steadier one.
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  };
  size_t n_tokens = tok.encode(text).size();  // also warms the cache, as a server would be
  auto t0 = std::chrono::steady_clock::now();
  double c0 = cpu_now();
  for (int i = 0; i < iters; ++i) n_tokens = tok.encode(text).size();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = cpu_now() - c0;
  double mb = double(text.size()) * iters / 1e6;
  fmt::print(stderr, "encode: {} bytes -> {} tokens, {} iters, wall {:.3f} s, {:.2f} MB/s, cpu {:.3f} s, {:.2f} MB/s(cpu)\n",
             text.size(), n_tokens, iters, s, mb / s, cpu, mb / cpu);
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  auto loaded = Tokenizer::load_dir(a.model);
  if (!loaded) {
    fmt::print(stderr, "error: {}\n", loaded.message());
    return 1;
  }
  const Tokenizer& tok = **loaded;
  std::string in = read_stdin();
  try {
    if (a.bench_iters > 0) return bench(tok, in, a.bench_iters);
    if (!a.jsonl) {
      if (!a.decode) {
        write(fmt::format("[{}]\n", fmt::join(tok.encode(in), ",")));
        return 0;
      }
      auto ids = parse_ids(nlohmann::json::parse(in));
      if (!ids) {
        fmt::print(stderr, "error: {}\n", ids.message());
        return 1;
      }
      write(tok.decode(*ids, a.skip_special));
      return 0;
    }
    size_t pos = 0;
    while (pos < in.size()) {
      size_t nl = in.find('\n', pos);
      if (nl == std::string::npos) nl = in.size();
      std::string_view line(in.data() + pos, nl - pos);
      pos = nl + 1;
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      if (!a.decode) {
        std::string text;
        if (j.is_string()) {
          text = j.get<std::string>();
        } else if (j.is_array()) {  // raw bytes, which need not be valid UTF-8
          for (const auto& b : j) {
            if (!b.is_number_integer() || b.get<int>() < 0 || b.get<int>() > 255) {
              fmt::print(stderr, "error: --jsonl byte arrays hold integers 0..255\n");
              return 1;
            }
            text.push_back(static_cast<char>(b.get<int>()));
          }
        } else {
          fmt::print(stderr, "error: --jsonl encode expects a JSON string or byte array per line\n");
          return 1;
        }
        write(fmt::format("[{}]\n", fmt::join(tok.encode(text), ",")));
      } else {
        auto ids = parse_ids(j);
        if (!ids) {
          fmt::print(stderr, "error: {}\n", ids.message());
          return 1;
        }
        write(nlohmann::json(tok.decode(*ids, a.skip_special)).dump(-1, ' ', false,
                                                                     nlohmann::json::error_handler_t::replace) +
              "\n");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fmt::print(stderr, "error: bad JSON input: {}\n", e.what());
    return 1;
  }
  return 0;
}

Registrar reg("tokenize", "Encode stdin text to token ids, or decode ids to text", [](CLI::App& app) -> RunFn {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("--model", a->model, "Directory with tokenizer.json (and tokenizer_config.json)")->required();
  app.add_flag("--decode", a->decode, "Read a JSON array of ids, write the text");
  app.add_flag("--skip-special", a->skip_special, "With --decode: drop special tokens");
  app.add_flag("--jsonl", a->jsonl, "One JSON document per line in and out: encode takes strings (or byte arrays), decode id arrays");
  app.add_option("--bench-iters", a->bench_iters, "Time N encodes of stdin (single thread); prints MB/s to stderr");
  return [a] { return run_tokenize(*a); };
});

}  // namespace
}  // namespace lily::cli
