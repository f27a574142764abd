// GrammarBuilder and the raw-text automata: see grammar.h. min_len is a fixpoint because schemas
// recurse ($ref); a node that can never complete keeps kInf and the matcher never enters it.
#include "structured/grammar.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <queue>

#include "structured/matcher.h"

namespace lily::structured {

namespace {

int64_t add_len(int64_t a, int64_t b) { return a >= kInf || b >= kInf ? kInf : std::min(kInf, a + b); }

}  // namespace

const TrieNode* Grammar::trie_child(uint32_t node, uint8_t byte) const {
  const TrieNode& n = trie[node];
  const TrieEdge* e = edges.data() + n.edge_begin;
  for (uint32_t i = 0; i < n.n_edges; ++i)
    if (e[i].byte == byte) return &trie[e[i].child];
  return nullptr;
}

std::shared_ptr<const RawAutomaton> raw_automaton(const std::string& terminator, const std::vector<std::string>& forbidden) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::vector<std::string>>, std::shared_ptr<const RawAutomaton>> cache;
  std::lock_guard<std::mutex> lk(mu);
  auto key = std::make_pair(terminator, forbidden);
  if (auto it = cache.find(key); it != cache.end()) return it->second;

  auto a = std::make_shared<RawAutomaton>();
  a->terminator = terminator;
  a->forbidden = forbidden;
  // Aho-Corasick: goto trie, failure links, then the full transition table.
  std::vector<std::map<uint8_t, int>> go(1);
  std::vector<int> depth(1, 0);
  std::vector<uint8_t> out(1, 0), on_term(1, 1);
  auto insert = [&](const std::string& w, uint8_t flag, bool is_term) {
    int s = 0;
    for (unsigned char c : w) {
      auto it = go[s].find(c);
      if (it == go[s].end()) {
        go.emplace_back();
        depth.push_back(depth[s] + 1);
        out.push_back(0);
        on_term.push_back(0);
        it = go[s].emplace(c, int(go.size()) - 1).first;
      }
      s = it->second;
      if (is_term) on_term[s] = 1;
    }
    out[s] |= flag;
  };
  insert(terminator, 1, true);
  for (const auto& f : forbidden) insert(f, 2, false);
  const int n = int(go.size());
  std::vector<int> fail(n, 0);
  a->next.assign(size_t(n) * 256, 0);
  a->term_depth.assign(n, 0);
  std::queue<int> q;
  for (int c = 0; c < 256; ++c) {
    auto it = go[0].find(uint8_t(c));
    a->next[size_t(c)] = uint16_t(it == go[0].end() ? 0 : it->second);
    if (it != go[0].end()) q.push(it->second);
  }
  std::vector<int> order;
  while (!q.empty()) {
    int s = q.front();
    q.pop();
    order.push_back(s);
    out[s] |= out[fail[s]];
    for (int c = 0; c < 256; ++c) {
      auto it = go[s].find(uint8_t(c));
      if (it != go[s].end()) {
        fail[it->second] = a->next[size_t(fail[s]) * 256 + c];
        a->next[size_t(s) * 256 + c] = uint16_t(it->second);
        q.push(it->second);
      } else {
        a->next[size_t(s) * 256 + c] = a->next[size_t(fail[s]) * 256 + c];
      }
    }
  }
  for (int s : order) a->term_depth[s] = uint8_t(on_term[s] ? depth[s] : a->term_depth[fail[s]]);
  a->out = out;
  for (const char* cand = "aeiouxyzAEIOU0123456789 "; *cand; ++cand) {
    bool ok = true;
    for (int s = 0; s < n && ok; ++s) {
      int t = a->next[size_t(s) * 256 + uint8_t(*cand)];
      ok = a->out[t] == 0 && a->term_depth[t] == 0;
    }
    if (ok) {
      a->safe_byte = uint8_t(*cand);
      break;
    }
  }
  cache.emplace(key, a);
  return a;
}

uint32_t GrammarBuilder::add(Kind k, uint32_t idx) {
  g_->nodes.push_back(Node{k, idx, kInf, {}});
  return uint32_t(g_->nodes.size() - 1);
}

uint32_t GrammarBuilder::build_trie(const std::vector<std::pair<std::string, int32_t>>& words) {
  struct Tmp {
    std::map<uint8_t, int> kids;
    int32_t payload = -1;
  };
  std::vector<Tmp> t(1);
  for (const auto& [w, p] : words) {
    int s = 0;
    for (unsigned char c : w) {
      auto it = t[s].kids.find(c);
      if (it == t[s].kids.end()) {
        t.emplace_back();
        it = t[s].kids.emplace(c, int(t.size()) - 1).first;
      }
      s = it->second;
    }
    if (t[s].payload < 0) t[s].payload = p;  // a duplicate literal keeps its first meaning
  }
  // Flatten in preorder: children get larger indices than their parent (compute_lengths relies on it).
  const uint32_t base = uint32_t(g_->trie.size());
  std::vector<uint32_t> index(t.size());
  std::vector<int> order;
  std::vector<int> stack{0};
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    index[s] = base + uint32_t(order.size());
    order.push_back(s);
    for (auto it = t[s].kids.rbegin(); it != t[s].kids.rend(); ++it) stack.push_back(it->second);
  }
  for (int s : order) {
    TrieNode n;
    n.payload = t[s].payload;
    n.edge_begin = uint32_t(g_->edges.size());
    n.n_edges = uint32_t(t[s].kids.size());
    for (auto [c, k] : t[s].kids) g_->edges.push_back({c, index[k]});
    g_->trie.push_back(n);
  }
  return base;
}

uint32_t GrammarBuilder::literal(const std::vector<std::string>& alternatives) {
  std::vector<std::pair<std::string, int32_t>> w;
  for (const auto& a : alternatives) w.emplace_back(a, kLitEnd);
  g_->lits.push_back({build_trie(w)});
  return add(Kind::kLit, uint32_t(g_->lits.size() - 1));
}

uint32_t GrammarBuilder::text(int64_t min, int64_t max, std::shared_ptr<const RawAutomaton> raw) {
  TextNode t;
  t.min = min;
  t.max = max;
  if (raw) {
    t.raw = raw.get();
    g_->automata.push_back(std::move(raw));
  }
  g_->texts.push_back(t);
  return add(Kind::kText, uint32_t(g_->texts.size() - 1));
}

uint32_t GrammarBuilder::number(const NumNode& n) {
  g_->nums.push_back(n);
  return add(Kind::kNum, uint32_t(g_->nums.size() - 1));
}

uint32_t GrammarBuilder::object(ObjNode o) {
  if (o.map_value < 0) {
    // Boundary tries: before property i (after a written one or not), the next written property
    // may be any j >= i up to the first required one; the close literal only if none is required.
    const size_t n = o.props.size();
    o.boundary.assign((n + 1) * 2, 0);
    for (size_t i = 0; i <= n; ++i)
      for (int written = 0; written < 2; ++written) {
        std::vector<std::pair<std::string, int32_t>> w;
        bool blocked = false;
        for (size_t j = i; j < n && !blocked; ++j) {
          w.emplace_back((written ? o.sep : std::string()) + o.props[j].key, int32_t(j));
          blocked = o.props[j].required;
        }
        if (!blocked) w.emplace_back(o.close, kClose);
        o.boundary[i * 2 + size_t(written)] = build_trie(w);
      }
  }
  g_->objs.push_back(std::move(o));
  return add(Kind::kObj, uint32_t(g_->objs.size() - 1));
}

uint32_t GrammarBuilder::array(ArrNode a) {
  g_->arrs.push_back(std::move(a));
  return add(Kind::kArr, uint32_t(g_->arrs.size() - 1));
}

uint32_t GrammarBuilder::seq(std::vector<uint32_t> items) {
  g_->seqs.push_back({std::move(items), {}});
  return add(Kind::kSeq, uint32_t(g_->seqs.size() - 1));
}

uint32_t GrammarBuilder::alt(std::vector<uint32_t> alts) {
  g_->alts.push_back({std::move(alts)});
  return add(Kind::kAlt, uint32_t(g_->alts.size() - 1));
}

uint32_t GrammarBuilder::placeholder() { return alt({}); }

void GrammarBuilder::set_alts(uint32_t alt_node, std::vector<uint32_t> alts) {
  g_->alts[g_->nodes[alt_node].idx].alts = std::move(alts);
}

uint32_t GrammarBuilder::any_value(int depth) {
  depth = std::max(0, depth);
  if (any_.size() > size_t(depth)) return any_[size_t(depth)];
  while (any_.size() <= size_t(depth)) {
    const int d = int(any_.size());
    NumNode num;
    num.frac_digits = 6;
    std::vector<uint32_t> alts = {text(0, kInf), number(num), literal({"true", "false", "null"})};
    if (d > 0) {
      ObjNode o;
      o.open = "{";
      o.sep = ",";
      o.close = "}";
      o.map_key = int32_t(text(0, kInf));
      o.map_value = int32_t(any_[size_t(d - 1)]);
      alts.push_back(object(std::move(o)));
      ArrNode a;
      a.open = "[";
      a.sep = ",";
      a.close = "]";
      a.items = int32_t(any_[size_t(d - 1)]);
      alts.push_back(array(std::move(a)));
    }
    any_.push_back(alt(std::move(alts)));
  }
  return any_[size_t(depth)];
}

void GrammarBuilder::compute_lengths() {
  Grammar& g = *g_;
  // Tries: to_end over a contiguous preorder range, children first.
  auto trie_ends = [&](uint32_t root, uint32_t end, auto&& payload_cost) {
    for (uint32_t i = end; i-- > root;) {
      TrieNode& n = g.trie[i];
      int64_t best = n.payload >= 0 ? payload_cost(n.payload) : kInf;
      for (uint32_t k = 0; k < n.n_edges; ++k) best = std::min(best, add_len(1, g.trie[g.edges[n.edge_begin + k].child].to_end));
      n.to_end = best;
    }
  };
  auto trie_end = [&](uint32_t root) {  // one past the last node of the trie at root (preorder)
    uint32_t end = root + 1;
    std::vector<uint32_t> st{root};
    while (!st.empty()) {
      uint32_t s = st.back();
      st.pop_back();
      end = std::max(end, s + 1);
      const TrieNode& n = g.trie[s];
      for (uint32_t k = 0; k < n.n_edges; ++k) st.push_back(g.edges[n.edge_begin + k].child);
    }
    return end;
  };
  std::vector<uint32_t> lit_end(g.lits.size());
  for (size_t i = 0; i < g.lits.size(); ++i) lit_end[i] = trie_end(g.lits[i].root);
  std::vector<std::vector<uint32_t>> obj_end(g.objs.size());
  for (size_t i = 0; i < g.objs.size(); ++i)
    for (uint32_t r : g.objs[i].boundary) obj_end[i].push_back(trie_end(r));
  for (size_t i = 0; i < g.lits.size(); ++i) trie_ends(g.lits[i].root, lit_end[i], [](int32_t) { return int64_t(0); });

  for (int iter = 0; iter < 10000; ++iter) {
    bool changed = false;
    for (uint32_t id = 0; id < g.nodes.size(); ++id) {
      Node& nd = g.nodes[id];
      int64_t len = kInf;
      switch (nd.kind) {
        case Kind::kLit: len = g.trie[g.lits[nd.idx].root].to_end; break;
        case Kind::kText: {
          const TextNode& t = g.texts[nd.idx];
          if (t.min <= t.max) len = t.raw ? add_len(t.min, int64_t(t.raw->terminator.size())) : add_len(t.min, 2);
          break;
        }
        case Kind::kNum: len = min_finish(g, Frame{id, 0, 0, 0, 0, 0}); break;
        case Kind::kObj: {
          ObjNode& o = g.objs[nd.idx];
          if (o.map_value >= 0) {
            len = int64_t(o.open.size() + o.close.size());
            break;
          }
          const size_t n = o.props.size();
          for (size_t i = n + 1; i-- > 0;)
            for (int w = 1; w >= 0; --w) {
              const size_t r = i * 2 + size_t(w);
              trie_ends(o.boundary[r], obj_end[nd.idx][r], [&](int32_t p) {
                if (p == kClose) return int64_t(0);
                const Prop& pr = o.props[size_t(p)];
                return add_len(add_len(g.nodes[pr.value].min_len, int64_t(pr.suffix.size())),
                               g.trie[o.boundary[(size_t(p) + 1) * 2 + 1]].to_end);
              });
            }
          len = add_len(int64_t(o.open.size()), g.trie[o.boundary[0]].to_end);
          break;
        }
        case Kind::kArr: {
          ArrNode& a = g.arrs[nd.idx];
          auto item_len = [&](int64_t p) -> int64_t {
            if (p < int64_t(a.prefix.size())) return g.nodes[a.prefix[size_t(p)]].min_len;
            return a.items >= 0 ? g.nodes[uint32_t(a.items)].min_len : kInf;
          };
          const int64_t m = std::min<int64_t>(a.min, 1 << 20);
          a.need.assign(size_t(m) + 1, 0);
          for (int64_t p = m; p-- > 0;) a.need[size_t(p)] = add_len(add_len(int64_t(a.sep.size()), item_len(p)), a.need[size_t(p) + 1]);
          if (a.min > a.max) break;
          len = int64_t(a.open.size() + a.close.size());
          if (m > 0) len = add_len(len, add_len(item_len(0), m > 1 ? a.need[1] : 0));
          break;
        }
        case Kind::kSeq: {
          SeqNode& s = g.seqs[nd.idx];
          s.rest.assign(s.items.size() + 1, 0);
          for (size_t i = s.items.size(); i-- > 0;) s.rest[i] = add_len(g.nodes[s.items[i]].min_len, s.rest[i + 1]);
          len = s.rest[0];
          break;
        }
        case Kind::kAlt:
          for (uint32_t a : g.alts[nd.idx].alts) len = std::min(len, g.nodes[a].min_len);
          break;
      }
      if (len < nd.min_len) {
        nd.min_len = len;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // What a call starts: an Alt's finite leaves, flattened.
  for (uint32_t id = 0; id < g.nodes.size(); ++id) {
    std::vector<uint32_t> out, stack{id};
    std::vector<char> seen(g.nodes.size(), 0);
    while (!stack.empty()) {
      uint32_t s = stack.back();
      stack.pop_back();
      if (seen[s] || g.nodes[s].min_len >= kInf) continue;
      seen[s] = 1;
      if (g.nodes[s].kind == Kind::kAlt) {
        const auto& al = g.alts[g.nodes[s].idx].alts;
        for (auto it = al.rbegin(); it != al.rend(); ++it) stack.push_back(*it);
      } else {
        out.push_back(s);
      }
    }
    g.nodes[id].concrete = std::move(out);
  }
}

std::string GrammarBuilder::finish(uint32_t root, std::unique_ptr<Grammar>& out) {
  g_->root = root;
  compute_lengths();
  if (g_->nodes[root].min_len >= kInf) return "the schema admits no finite JSON value";
  out = std::move(g_);
  g_ = std::make_unique<Grammar>();
  any_.clear();
  return "";
}

}  // namespace lily::structured
