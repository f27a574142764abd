// MaskComputer: see token_mask.h. Both paths apply the same rules as Position::accepts; the
// string tables hold counts relative to the body state they start from (vocab_index.h).
#include "structured/token_mask.h"

#include <algorithm>
#include <cstring>

namespace lily::structured {

namespace {

int64_t add_len(int64_t a, int64_t b) { return a >= kInf || b >= kInf ? kInf : std::min(kInf, a + b); }

void set_token(const VocabIndex& v, std::span<uint64_t> bits, int32_t id) {
  for (; id >= 0; id = v.dup_next(id)) set_bit(bits, size_t(id));
}

}  // namespace

void reference_mask(const Grammar& g, const Position& pos, const VocabIndex& vocab, int64_t limit,
                    std::span<const uint64_t> allowed, std::span<uint64_t> bits) {
  std::fill(bits.begin(), bits.end(), 0);
  for (int32_t id = 0; id < vocab.n_vocab(); ++id) {
    if (!test_bit(allowed, size_t(id)) || !vocab.in_trie(id)) continue;
    int64_t mf = kInf;
    if (pos.accepts(g, vocab.bytes(id), &mf) && mf <= limit) set_bit(bits, size_t(id));
  }
}

bool MaskComputer::text_stack(const Grammar& g, const Position& pos, size_t si, int64_t limit, std::span<uint64_t> bits) {
  const Stack& st = pos.stacks()[si];
  const Frame& f = st.back();
  const Node& nd = g.nodes[f.node];
  if (nd.kind != Kind::kText || f.s != 1 || f.t != 0) return false;
  const TextNode& n = g.texts[nd.idx];
  const RawAutomaton* raw = n.raw;
  if (raw && raw->term_depth[size_t(f.b)] > 0) return false;  // counts relative to a partial terminator: walk
  const TextTable& t = v_.text_table(raw, raw ? uint32_t(f.b) : 0);
  Cursor below;
  below.base = uint16_t(si);
  below.keep = uint16_t(st.size() - 1);
  const int64_t base_mf = pos.min_finish(g, below);
  const int64_t a = f.a, L = raw ? int64_t(raw->terminator.size()) : 1;
  const size_t W = v_.words();
  tmp_.assign(W, 0);
  std::span<uint64_t> mine(tmp_);

  // Tokens that stay inside: a bitset by count when no token can exceed the budget, else exact.
  const int64_t need_worst = raw ? std::max<int64_t>(1, n.min - a) : std::max<int64_t>(0, n.min - a);
  const bool tight = add_len(base_mf, 3 + need_worst + L) > limit;
  const int64_t r = n.max >= kInf ? kInf : n.max - a;  // code points still allowed
  if (!tight) {
    ++stats_.table_fast;
    if (r >= t.max_count) {
      std::memcpy(mine.data(), t.inside.data(), W * 8);
    } else if (r >= 0 && r <= TextTable::kCum) {
      std::memcpy(mine.data(), t.cum[size_t(r)].data(), W * 8);
    } else if (r > TextTable::kCum) {
      std::memcpy(mine.data(), t.inside.data(), W * 8);
      for (int32_t id : t.long_inside) {
        if (t.count[size_t(id)] <= r) break;
        mine[size_t(id) / 64] &= ~(uint64_t(1) << (id % 64));
      }
    }
    if (raw)  // ending inside a partial terminator: it must still be possible to end or break it
      for (int32_t id : t.partial) {
        const int64_t def = a + t.count[size_t(id)], a2 = def + t.tdepth[size_t(id)];
        if (def < n.min && a2 + 1 > n.max) mine[size_t(id) / 64] &= ~(uint64_t(1) << (id % 64));
      }
  } else {
    ++stats_.table_scans;
    for (int32_t id = 0; id < v_.n_vocab(); ++id) {
      if (t.cls[size_t(id)] != 1) continue;
      const int64_t c = t.count[size_t(id)], pend = t.pend[size_t(id)];
      int64_t mf;
      if (!raw) {
        if (a + c > n.max) continue;
        mf = pend + std::max<int64_t>(0, n.min - (a + c)) + 1;
      } else {
        const int64_t td = t.tdepth[size_t(id)], def = a + c, a2 = def + td;
        if (def > n.max || (def < n.min && td > 0 && a2 + 1 > n.max)) continue;
        if (pend > 0) mf = pend + std::max<int64_t>(0, n.min - a2) + L;
        else if (def >= n.min) mf = L - td;
        else if (td == 0) mf = n.min - a2 + L;
        else mf = std::max<int64_t>(1, n.min - a2) + L;
      }
      if (add_len(base_mf, mf) <= limit) set_bit(mine, size_t(id));
    }
  }

  // Tokens that end the text: the rest of the token goes to the frames below, once per suffix
  // (and once per string while those frames stay the same).
  if (suffix_memo_.size() < t.suffixes.size()) {
    suffix_memo_.resize(t.suffixes.size());
    suffix_gen_.resize(t.suffixes.size(), 0);
  }
  const bool same_below = memo_table_ == &t && memo_grammar_ == &g && memo_below_.size() + 1 == st.size() &&
                          std::equal(memo_below_.begin(), memo_below_.end(), st.begin());
  if (!same_below) {
    ++gen_;
    memo_table_ = &t;
    memo_grammar_ = &g;
    memo_below_.assign(st.begin(), st.end() - 1);
  }
  Frame done = f;
  done.s = 4;
  for (int32_t id : t.ends) {
    const int64_t content = a + t.count[size_t(id)];
    if (content < n.min || content > n.max) continue;
    const uint32_t sid = t.suffix[size_t(id)];
    if (suffix_gen_[sid] != gen_) {
      suffix_gen_[sid] = gen_;
      int64_t best = kInf;
      const std::string& suf = t.suffixes[sid];
      if (suf.empty()) {
        best = base_mf;
      } else {
        Cursor c = below;
        c.n = 1;
        c.top[0] = done;
        cur_.assign(1, c);
        for (unsigned char b : suf) {
          pos.feed(g, cur_, b, nxt_);
          cur_.swap(nxt_);
          if (cur_.empty()) break;
        }
        for (const Cursor& x : cur_) best = std::min(best, pos.min_finish(g, x));
      }
      suffix_memo_[sid] = best;
    }
    if (suffix_memo_[sid] <= limit) set_bit(mine, size_t(id));
  }
  for (size_t w = 0; w < W; ++w) bits[w] |= mine[w];
  return true;
}

void MaskComputer::walk(const Grammar& g, const Position& pos, const std::vector<Cursor>& start, int64_t limit,
                        std::span<uint64_t> bits) {
  ++stats_.walks;
  const auto& byte = v_.trie_byte();
  const auto& depth = v_.trie_depth();
  const auto& skip = v_.trie_skip();
  const auto& token = v_.trie_token();
  levels_.resize(size_t(v_.max_depth()) + 2);
  levels_[0] = start;
  const size_t N = v_.trie_size();
  size_t i = 0, visited = 0;
  while (i < N) {
    const size_t d = depth[i];
    ++visited;
    pos.feed(g, levels_[d - 1], byte[i], levels_[d]);
    if (levels_[d].empty()) {
      i = skip[i];
      continue;
    }
    if (token[i] >= 0) {
      int64_t best = kInf;
      for (const Cursor& c : levels_[d]) best = std::min(best, pos.min_finish(g, c));
      if (best <= limit) set_token(v_, bits, token[i]);
    }
    ++i;
  }
  stats_.walk_nodes += visited;
}

void MaskComputer::compute(const Grammar& g, const Position& pos, int64_t limit, std::span<const uint64_t> allowed,
                           std::span<uint64_t> bits) {
  ++stats_.masks;
  std::fill(bits.begin(), bits.end(), 0);
  std::vector<Cursor> rest;
  for (size_t i = 0; i < pos.stacks().size(); ++i) {
    if (pos.stacks()[i].empty()) continue;  // complete: takes no more bytes
    if (text_stack(g, pos, i, limit, bits)) continue;
    Cursor c;
    c.base = uint16_t(i);
    c.keep = uint16_t(pos.stacks()[i].size());
    rest.push_back(c);
  }
  if (!rest.empty()) walk(g, pos, rest, limit, bits);
  for (size_t w = 0; w < bits.size(); ++w) bits[w] &= allowed[w];
}

}  // namespace lily::structured
