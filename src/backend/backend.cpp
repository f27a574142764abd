// Default implementations of the Backend interface's optional methods: the synchronous launch/wait
// over a backend's step(), and step() over its forward / forward_batch / decode_draw.
#include "backend/backend.h"

#include <algorithm>
#include <cstdio>

#include "core/thread_pool.h"

namespace lily {

Result<DeviceMemory> host_memory() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return errorf("cannot read /proc/meminfo");
  DeviceMemory m;
  bool have_total = false, have_avail = false;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "MemTotal: %llu kB", &kb) == 1) m.total = size_t(kb) << 10, have_total = true;
    else if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) m.free = size_t(kb) << 10, have_avail = true;
  }
  std::fclose(f);
  if (!have_total || !have_avail) return errorf("/proc/meminfo has no MemTotal or MemAvailable");
  return m;
}

Result<DeviceMemory> Backend::device_memory() { return host_memory(); }

Status Backend::forward_batch(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                              std::span<float> logits) {
  const size_t B = states.size();
  if (tokens.size() != B) return errorf("forward_batch: {} states but {} tokens", B, tokens.size());
  if (B == 0) return Status::ok();
  if (logits.size() % B != 0) return errorf("forward_batch: logits size {} is not a multiple of {} rows", logits.size(), B);
  const size_t V = logits.size() / B;
  for (size_t b = 0; b < B; ++b)
    LILY_TRY(forward(*states[b], tokens.subspan(b, 1), logits.subspan(b * V, V)));
  return Status::ok();
}

Status Backend::decode_draw(std::span<SeqState* const> states, std::span<const int32_t> tokens,
                            std::span<const DrawSpec> spec, std::span<Drawn> out) {
  const size_t B = states.size();
  if (tokens.size() != B || spec.size() != B || out.size() != B)
    return errorf("decode_draw: {} states, {} tokens, {} specs, {} outputs", B, tokens.size(), spec.size(), out.size());
  if (B == 0) return Status::ok();
  if (vocab_size() <= 0) return errorf("decode_draw: backend {} does not report its vocabulary size", name());
  const size_t V = size_t(vocab_size());
  std::vector<float> logits(B * V);
  if (B == 1) LILY_TRY(forward(*states[0], tokens, logits));
  else LILY_TRY(forward_batch(states, tokens, logits));
  std::vector<HostDraw> rows(B);
  for (size_t b = 0; b < B; ++b) rows[b] = {logits.data() + b * V, &spec[b], &out[b]};
  draw_on_host(rows, V);
  return Status::ok();
}

void draw_on_host(std::span<const HostDraw> rows, size_t vocab) {
  auto draw = [&](size_t a, size_t b) {
    std::vector<float> w;
    std::vector<double> sums;
    for (size_t i = a; i < b; ++i) draw_row(std::span<const float>(rows[i].logits, vocab), *rows[i].spec, *rows[i].out, w, sums);
  };
  if (rows.size() >= 2 && ThreadPool::global().size() > 1) ThreadPool::global().parallel_for(rows.size(), 1, draw);
  else draw(0, rows.size());
}

Status Backend::step_segment(const StepFeed& f) {
  const size_t V = size_t(std::max(vocab_size(), 0));
  if (!f.draw) return forward(*f.state, f.tokens, f.logits ? std::span<float>(f.logits, V) : std::span<float>());
  if (V == 0) return errorf("step: backend {} does not report its vocabulary size", name());
  std::vector<float> tmp(V), w;
  std::vector<double> sums;
  LILY_TRY(forward(*f.state, f.tokens, tmp));
  draw_row(tmp, *f.draw, *f.drawn, w, sums);
  return Status::ok();
}

Status Backend::step(std::span<const StepFeed> feeds) {
  const size_t V = size_t(std::max(vocab_size(), 0));
  std::vector<float> tmp;
  std::vector<float> w;
  std::vector<double> sums;
  // Prompt segments, one forward each (verify feeds exist only where a backend speculates, which
  // runs them itself).
  for (const StepFeed& f : feeds)
    if (f.tokens.size() >= 2) LILY_TRY(step_segment(f));
  // One-token feeds: one decode step.
  std::vector<const StepFeed*> rows;
  bool host = false;
  for (const StepFeed& f : feeds)
    if (f.tokens.size() == 1) rows.push_back(&f), host |= f.logits != nullptr;
  if (rows.empty()) return Status::ok();
  const size_t B = rows.size();
  std::vector<SeqState*> states(B);
  std::vector<int32_t> toks(B);
  for (size_t b = 0; b < B; ++b) states[b] = rows[b]->state, toks[b] = rows[b]->tokens[0];
  if (!host) {
    std::vector<DrawSpec> spec(B);
    std::vector<Drawn> out(B);
    for (size_t b = 0; b < B; ++b)
      if (rows[b]->draw) spec[b] = *rows[b]->draw;
    LILY_TRY(decode_draw(states, toks, spec, out));
    for (size_t b = 0; b < B; ++b)
      if (rows[b]->draw) *rows[b]->drawn = out[b];
    return Status::ok();
  }
  if (V == 0) return errorf("step: backend {} does not report its vocabulary size", name());
  tmp.resize(B * V);
  if (B == 1) LILY_TRY(forward(*states[0], toks, tmp));
  else LILY_TRY(forward_batch(states, toks, tmp));
  for (size_t b = 0; b < B; ++b) {
    const std::span<const float> row(tmp.data() + b * V, V);
    if (rows[b]->logits) std::copy(row.begin(), row.end(), rows[b]->logits);
    else if (rows[b]->draw) draw_row(row, *rows[b]->draw, *rows[b]->drawn, w, sums);
  }
  return Status::ok();
}

Result<StepTicket> Backend::launch(std::span<const StepFeed> feeds) {
  Status st = step(feeds);
  ran_.add(++launched_, std::move(st));
  return launched_;
}

Status Backend::wait(StepTicket ticket) {
  if (ticket == 0 || ticket > launched_) return errorf("wait: step {} was never launched", ticket);
  if (auto st = ran_.take(ticket)) return std::move(*st);
  return errorf("wait: step {} was already waited for", ticket);
}

Status Backend::rewind(SeqState&, int) { return errorf("backend {} cannot rewind a state", name()); }

Status Backend::profile_decode(SeqState&) { return errorf("backend {}: no per-op decode profile", name()); }

}  // namespace lily
