// VocabIndex: see vocab_index.h. The string tables run each token through the same text step the
// matcher uses (matcher.cpp), from a node without length bounds, and record counts relative to
// the start; the mask code applies the real bounds.
#include "structured/vocab_index.h"

#include <algorithm>
#include <numeric>

#include "structured/matcher.h"

namespace lily::structured {

VocabIndex::VocabIndex(const Tokenizer& tok, int n_vocab) : n_vocab_(std::max(0, n_vocab)) {
  const size_t V = size_t(n_vocab_);
  off_.assign(V + 1, 0);
  in_trie_.assign(V, 0);
  plain_.assign(words(), 0);
  for (size_t id = 0; id < V; ++id) {
    off_[id] = uint32_t(bytes_.size());
    const std::string* b = tok.token_bytes(int32_t(id));
    if (!b || b->empty() || tok.is_special(int32_t(id))) continue;
    bytes_ += *b;
    in_trie_[id] = 1;
    if (!tok.is_added(int32_t(id))) plain_[id / 64] |= uint64_t(1) << (id % 64);
  }
  off_[V] = uint32_t(bytes_.size());
  build_trie();
}

VocabIndex::VocabIndex(const std::vector<std::string>& tokens) : n_vocab_(int(tokens.size())) {
  const size_t V = tokens.size();
  off_.assign(V + 1, 0);
  in_trie_.assign(V, 0);
  plain_.assign(words(), 0);
  for (size_t id = 0; id < V; ++id) {
    off_[id] = uint32_t(bytes_.size());
    if (tokens[id].empty()) continue;
    bytes_ += tokens[id];
    in_trie_[id] = 1;
    plain_[id / 64] |= uint64_t(1) << (id % 64);
  }
  off_[V] = uint32_t(bytes_.size());
  build_trie();
}

void VocabIndex::build_trie() {
  const size_t V = size_t(n_vocab_);
  std::vector<int32_t> ids;
  for (size_t id = 0; id < V; ++id)
    if (in_trie_[id]) ids.push_back(int32_t(id));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    auto x = bytes(a), y = bytes(b);
    return x != y ? x < y : a < b;
  });
  dup_.assign(V, -1);
  // Preorder trie from the sorted tokens: a token shares its prefix with the one before it.
  std::vector<uint32_t> open;  // open[d-1]: node at depth d on the current path
  std::string_view prev;
  for (int32_t id : ids) {
    const std::string_view w = bytes(id);
    size_t lcp = 0;
    while (lcp < w.size() && lcp < prev.size() && w[lcp] == prev[lcp]) ++lcp;
    while (open.size() > lcp) {
      skip_[open.back()] = uint32_t(byte_.size());
      open.pop_back();
    }
    if (w.size() == lcp) {  // same bytes as the previous token
      int32_t head = token_[open.back()];
      while (dup_[size_t(head)] >= 0) head = dup_[size_t(head)];
      dup_[size_t(head)] = id;
      continue;
    }
    for (size_t d = lcp; d < w.size(); ++d) {
      open.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(w[d]));
      depth_.push_back(uint8_t(std::min<size_t>(d + 1, 255)));
      skip_.push_back(0);
      token_.push_back(-1);
    }
    token_[open.back()] = id;
    max_depth_ = std::max(max_depth_, int(w.size()));
    prev = w;
  }
  while (!open.empty()) {
    skip_[open.back()] = uint32_t(byte_.size());
    open.pop_back();
  }
}

const TextTable& VocabIndex::text_table(const RawAutomaton* raw, uint32_t state) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = tables_[{raw, state}];
  if (!slot) {
    slot = std::make_unique<TextTable>();
    build_table(*slot, raw, state);
  }
  return *slot;
}

void VocabIndex::build_table(TextTable& t, const RawAutomaton* raw, uint32_t state) const {
  const size_t V = size_t(n_vocab_);
  t.cls.assign(V, 0);
  t.count.assign(V, 0);
  t.pend.assign(V, 0);
  t.tdepth.assign(V, 0);
  t.suffix.assign(V, 0);
  t.inside.assign(words(), 0);
  // A one-node grammar: the text without bounds (raw counts may go below zero at the end).
  Grammar g;
  TextNode tn;
  tn.raw = raw;
  tn.min = -kInf;
  tn.max = kInf;
  g.texts.push_back(tn);
  g.nodes.push_back(Node{Kind::kText, 0, 0, {0}});
  std::map<std::string, uint32_t> suffix_ids;
  for (size_t id = 0; id < V; ++id) {
    if (!in_trie_[id]) continue;
    const std::string_view w = bytes(int32_t(id));
    Frame f{0, 1, 0, 0, 0, int64_t(state)};
    StepOut so;
    size_t i = 0;
    bool ok = true;
    for (; i < w.size(); ++i) {
      step(g, f, uint8_t(w[i]), so);
      if (so.n_next == 0) {
        ok = false;
        break;
      }
      f = so.next[0];
      if (f.s == 4) break;
    }
    if (!ok) continue;
    if (f.s == 4) {
      t.cls[id] = 2;
      const int64_t content = raw ? f.a - int64_t(raw->terminator.size()) : f.a;
      t.count[id] = int16_t(std::clamp<int64_t>(content, -30000, 30000));
      const std::string suf(w.substr(i + 1));
      auto it = suffix_ids.emplace(suf, uint32_t(t.suffixes.size())).first;
      if (it->second == t.suffixes.size()) t.suffixes.push_back(suf);
      t.suffix[id] = it->second;
      t.ends.push_back(int32_t(id));
      continue;
    }
    t.cls[id] = 1;
    int64_t depth = 0, pend = f.t;
    if (raw) {
      depth = f.t > 0 ? 0 : raw->term_depth[size_t(f.b)];
    } else if (f.s == 2) {
      pend = 1;
    } else if (f.s == 3) {
      pend = 4 - int64_t(f.t);
    }
    const int64_t c = f.a - depth;
    t.count[id] = int16_t(std::min<int64_t>(c, 30000));
    t.pend[id] = uint8_t(pend);
    t.tdepth[id] = uint8_t(depth);
    if (depth > 0) t.partial.push_back(int32_t(id));
    t.inside[id / 64] |= uint64_t(1) << (id % 64);
    t.max_count = std::max<int>(t.max_count, t.count[id]);
    if (c > TextTable::kCum) t.long_inside.push_back(int32_t(id));
  }
  t.cum.assign(TextTable::kCum + 1, std::vector<uint64_t>(words(), 0));
  for (size_t id = 0; id < V; ++id)
    if (t.cls[id] == 1 && t.count[id] >= 0 && t.count[id] <= TextTable::kCum)
      for (int k = t.count[id]; k <= TextTable::kCum; ++k) t.cum[size_t(k)][id / 64] |= uint64_t(1) << (id % 64);
  std::sort(t.long_inside.begin(), t.long_inside.end(), [&](int32_t a, int32_t b) { return t.count[size_t(a)] > t.count[size_t(b)]; });
}

}  // namespace lily::structured
