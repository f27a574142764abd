// Running a Grammar over bytes. A position is a set of stacks of frames (one per live reading of
// the output so far: alternatives stay open until a byte rules them out); a frame is a node and
// its small state (phase, counters, literal trie node, number digits). Pops are lazy: a frame that
// may end stays on the stack until a byte it cannot take arrives, so "12" is one stack that may
// end or take another digit. This file is the scalar definition the token masks are tested
// against: feeding a token's bytes one by one from a position is what "the token is allowed" means.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace lily::structured {

struct Frame {
  uint32_t node = 0;
  uint32_t s = 0, t = 0, u = 0;  // phase and small state words (meaning per kind, matcher.cpp)
  int64_t a = 0, b = 0;          // counters and values
  bool operator==(const Frame&) const = default;
};

using Stack = std::vector<Frame>;  // bottom first

// The first frame of a concrete (non-Alt) node.
Frame initial_frame(const Grammar& g, uint32_t node);
// Whether the frame's node may end here.
bool can_end(const Grammar& g, const Frame& f);
// Fewest bytes that complete this frame's node from its state (kInf: it cannot complete). For a
// frame below the top of a stack that is what remains once the frames above it have ended, so a
// stack needs the sum over its frames. Every path it counts is one the matcher accepts, byte by
// byte, so a budget of that many single-byte tokens is always enough.
int64_t min_finish(const Grammar& g, const Frame& f);
int64_t min_finish(const Grammar& g, std::span<const Frame> stack);

// What one byte does to the top frame: it takes the byte (next), or it first starts a child node
// that takes the byte (calls: the frame resumes as `resume` when the child ends).
struct StepOut {
  Frame next[4];
  int n_next = 0;
  struct Call {
    Frame resume;
    uint32_t child;
  } calls[4];
  int n_calls = 0;
};
void step(const Grammar& g, const Frame& f, uint8_t byte, StepOut& out);

// A stack during a walk: the bottom `keep` frames of a committed stack (`base`), plus up to
// kOverlay frames of its own on top, so copying one is cheap.
constexpr int kOverlay = 8;
constexpr int kMaxDepth = 96;  // deeper nesting is refused
struct Cursor {
  uint16_t base = 0;  // index of the committed stack
  uint16_t keep = 0;  // frames of it still in use
  uint8_t n = 0;      // frames of its own
  Frame top[kOverlay];
  int depth() const { return keep + n; }
};

// The committed position and the operations a walk needs on it.
class Position {
 public:
  Position() = default;
  Position(const Grammar& g);  // the start of the grammar's root
  const std::vector<Stack>& stacks() const { return stacks_; }
  bool dead() const { return stacks_.empty(); }
  // Whether the output so far is complete (some stack may end all its frames, or is empty).
  bool can_complete(const Grammar& g) const;
  // Fewest bytes that complete the output (kInf when dead).
  int64_t min_finish(const Grammar& g) const;
  // Whether some byte may still follow (false: the output is complete and nothing can extend it).
  bool can_continue(const Grammar& g) const;

  // Cursors at this position (one per stack).
  void cursors(std::vector<Cursor>& out) const;
  const Frame& top(const Cursor& c) const { return c.n ? c.top[c.n - 1] : stacks_[c.base][c.keep - 1]; }
  // Feeds a byte to every cursor of `in`, appending the live results to `out` (deduplicated).
  void feed(const Grammar& g, std::span<const Cursor> in, uint8_t byte, std::vector<Cursor>& out) const;
  // Fewest bytes that complete the output from a cursor.
  int64_t min_finish(const Grammar& g, const Cursor& c) const;
  // Prefix sums of min_finish over the committed stacks (for fast cursor totals).
  void prepare(const Grammar& g);

  // Advances the committed position by bytes; false (and the position is left unchanged) when
  // they are not allowed.
  bool advance(const Grammar& g, std::string_view bytes);
  // Whether `bytes` are allowed from here and, if so, the fewest bytes that complete the output
  // after them (the scalar reference of the token masks).
  bool accepts(const Grammar& g, std::string_view bytes, int64_t* finish_after) const;

 private:
  void feed_one(const Grammar& g, const Cursor& c, uint8_t byte, std::vector<Cursor>& out, int guard) const;
  std::vector<Stack> stacks_;
  std::vector<std::vector<int64_t>> mf_prefix_;  // [stack][k]: sum of min_finish of frames [0, k)
};

}  // namespace lily::structured
