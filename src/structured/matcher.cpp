// The matcher: see matcher.h. Frame layouts, per kind:
//   Lit   s = trie node.
//   Text  JSON string: s = phase (0 before the opening quote, 1 body, 2 after '\', 3 in \uXXXX,
//         4 done), t/u = UTF-8 continuation bytes still due and their allowed range (phase 1) or
//         hex digits seen and their value (phase 3), a = code points so far. Raw text: s = 1 body
//         or 4 done, t/u as above, a = code points so far (a partial terminator included),
//         b = automaton state.
//   Num   s = phase (0 start, 1 after '-', 2 integer digits, 3 after '.', 4 fraction digits) plus
//         0x100 when negative, t = integer digits, u = fraction digits, a/b = their values.
//   Obj   s = 0 open literal (t = offset), 1 boundary (t = trie node), 2 suffix of property u
//         (t = offset), 3 value of property u due; free maps: 5 boundary (b = any written,
//         a = count), 6 key due, 7 colon due, 8 value due, 9 done.
//   Arr   s = 0 open (t = offset), 1 first, 2 after an item, 3 separator (t = offset), 4 close
//         (t = offset), 5 item due, 6 done; a = items written.
//   Seq   s = index of the next item.
// Every state a step produces can still complete (min_finish < kInf), so a walk never enters a
// dead end: that is what makes the budget guarantee hold.
#include "structured/matcher.h"

#include <algorithm>
#include <array>

namespace lily::structured {

namespace {

int64_t add_len(int64_t a, int64_t b) { return a >= kInf || b >= kInf ? kInf : std::min(kInf, a + b); }

i128 pow10(int k) {
  static const auto table = [] {
    std::array<i128, 39> t{};
    t[0] = 1;
    for (int i = 1; i < 39; ++i) t[size_t(i)] = t[size_t(i) - 1] * 10;
    return t;
  }();
  return table[size_t(std::clamp(k, 0, 38))];
}

// Floor division for the signed range checks.
i128 floor_div(i128 a, i128 b) {
  i128 q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ---- numbers ----

// Whether some multiple of `step` in [lo_abs, hi_abs] (negated when neg) lies in [n.lo, n.hi].
bool num_hits(const NumNode& n, bool neg, i128 lo_abs, i128 hi_abs, i128 step) {
  i128 lo = neg ? -hi_abs : lo_abs, hi = neg ? -lo_abs : hi_abs;
  if (n.bounded) {
    lo = std::max(lo, n.lo);
    hi = std::min(hi, n.hi);
  }
  if (lo > hi) return false;
  const i128 first = -floor_div(-lo, step) * step;  // ceil(lo / step) * step
  return first <= hi;
}

int64_t num_min_finish(const NumNode& n, const Frame& f) {
  const int phase = int(f.s & 0xff);
  const bool neg = (f.s >> 8) & 1;
  if (!n.bounded) return phase == 2 || phase == 4 ? 0 : 1;
  const int F = n.frac_digits, D = n.int_digits;
  const i128 S = pow10(F);
  int64_t best = kInf;
  auto frac_options = [&](bool sign, i128 ilo, i128 ihi, int64_t base_cost) {
    for (int j = 0; j <= F; ++j) {
      const int64_t cost = base_cost + (j ? 1 + j : 0);
      if (cost >= best) break;
      const i128 step = pow10(F - j);
      if (num_hits(n, sign, ilo * S, ihi * S + (pow10(j) - 1) * step, step)) best = cost;
    }
  };
  switch (phase) {
    case 0:
    case 1:
      for (int d = 1; d <= D; ++d) {
        const i128 ilo = d == 1 ? 0 : pow10(d - 1), ihi = pow10(d) - 1;
        if (phase == 0) frac_options(false, ilo, ihi, d);
        frac_options(true, ilo, ihi, d + (phase == 0 ? 1 : 0));
      }
      break;
    case 2: {
      const int kmax = (f.t == 1 && f.a == 0) ? 0 : D - int(f.t);
      for (int k = 0; k <= kmax; ++k) frac_options(neg, i128(f.a) * pow10(k), (i128(f.a) + 1) * pow10(k) - 1, k);
      break;
    }
    case 3:
      for (int j = 1; j <= F && j < best; ++j) {
        const i128 step = pow10(F - j);
        if (num_hits(n, neg, i128(f.a) * S, i128(f.a) * S + (pow10(j) - 1) * step, step)) best = j;
      }
      break;
    case 4: {
      const i128 base = i128(f.a) * S + i128(f.b) * pow10(F - int(f.u));
      for (int j = 0; j <= F - int(f.u) && j < best; ++j) {
        const i128 step = pow10(F - int(f.u) - j);
        if (num_hits(n, neg, base, base + (pow10(j) - 1) * step, step)) best = j;
      }
      break;
    }
  }
  return best;
}

bool num_can_end(const NumNode& n, const Frame& f) {
  const int phase = int(f.s & 0xff);
  if (phase != 2 && phase != 4) return false;
  if (!n.bounded) return true;
  const bool neg = (f.s >> 8) & 1;
  const int F = n.frac_digits;
  const i128 v = i128(f.a) * pow10(F) + (phase == 4 ? i128(f.b) * pow10(F - int(f.u)) : 0);
  return num_hits(n, neg, v, v, 1);
}

// ---- text ----

constexpr uint32_t kCont = (0x80u << 8) | 0xBFu;  // the usual continuation byte range

// A UTF-8 lead byte: the continuation bytes it needs and the range of the first one; false if
// it cannot start a character (continuation bytes, overlong leads, past U+10FFFF).
bool utf8_lead(uint8_t c, uint32_t& n, uint32_t& range) {
  if (c >= 0xC2 && c <= 0xDF) { n = 1; range = kCont; return true; }
  if (c == 0xE0) { n = 2; range = (0xA0u << 8) | 0xBF; return true; }
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) { n = 2; range = kCont; return true; }
  if (c == 0xED) { n = 2; range = (0x80u << 8) | 0x9F; return true; }  // no surrogates
  if (c == 0xF0) { n = 3; range = (0x90u << 8) | 0xBF; return true; }
  if (c >= 0xF1 && c <= 0xF3) { n = 3; range = kCont; return true; }
  if (c == 0xF4) { n = 3; range = (0x80u << 8) | 0x8F; return true; }
  return false;
}

int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int64_t text_min_finish(const TextNode& n, const Frame& f) {
  if (f.s == 4) return 0;
  const int64_t need = std::max<int64_t>(0, n.min - f.a);
  if (!n.raw) {
    switch (f.s) {
      case 0: return add_len(2, n.min);
      case 1: return int64_t(f.t) + need + 1;
      case 2: return 2 + need;
      default: return int64_t(4 - f.t) + need + 1;
    }
  }
  const RawAutomaton& ra = *n.raw;
  const int64_t L = int64_t(ra.terminator.size());
  if (f.t > 0) return int64_t(f.t) + need + L;  // a pending character: no partial terminator
  const int64_t depth = ra.term_depth[size_t(f.b)];
  if (f.a - depth >= n.min) return L - depth;  // finish the terminator
  if (depth == 0) return need + L;
  return std::max<int64_t>(1, need) + L;  // break the partial terminator with safe bytes first
}

void text_step(const TextNode& n, const Frame& f, uint8_t c, StepOut& out) {
  Frame g = f;
  auto emit = [&] { out.next[out.n_next++] = g; };
  if (f.s == 4) return;
  if (n.raw) {
    const RawAutomaton& ra = *n.raw;
    const uint16_t st = ra.next[size_t(f.b) * 256 + c];
    if (f.t > 0) {  // a continuation byte (never part of a pattern)
      if (c < (f.u >> 8) || c > (f.u & 0xff)) return;
      g.t = f.t - 1;
      g.u = kCont;
      g.b = st;
      emit();
      return;
    }
    const int64_t a2 = f.a + 1;
    if (ra.out[st] & 1) {  // the terminator: the text ends
      const int64_t content = a2 - int64_t(ra.terminator.size());
      if (content < n.min || content > n.max) return;
      g.s = 4;
      g.a = a2;
      g.b = st;
      emit();
      return;
    }
    if (ra.out[st] & 2) return;  // a forbidden string
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') return;
    if (c >= 0x80) {
      uint32_t k, range;
      if (!utf8_lead(c, k, range)) return;
      g.t = k;
      g.u = range;
    }
    const int64_t depth = ra.term_depth[st];
    const int64_t content = a2 - depth;  // bytes of a partial terminator may still end the text
    if (content > n.max) return;
    if (content < n.min && depth > 0 && a2 + 1 > n.max) return;  // neither ending nor breaking could work
    g.a = a2;
    g.b = st;
    emit();
    return;
  }
  switch (f.s) {
    case 0:
      if (c != '"') return;
      g.s = 1;
      emit();
      return;
    case 1:
      if (f.t > 0) {
        if (c < (f.u >> 8) || c > (f.u & 0xff)) return;
        g.t = f.t - 1;
        g.u = kCont;
        emit();
        return;
      }
      if (c == '"') {
        if (f.a < n.min) return;
        g.s = 4;
        emit();
        return;
      }
      if (f.a >= n.max || c < 0x20) return;
      g.a = f.a + 1;
      if (c == '\\') {
        g.s = 2;
      } else if (c >= 0x80) {
        uint32_t k, range;
        if (!utf8_lead(c, k, range)) return;
        g.t = k;
        g.u = range;
      }
      emit();
      return;
    case 2:
      if (c == 'u') {
        g.s = 3;
        g.t = 0;
        g.u = 0;
      } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        g.s = 1;
      } else {
        return;
      }
      emit();
      return;
    case 3: {
      const int h = hex_value(c);
      if (h < 0) return;
      const uint32_t v = f.u * 16 + uint32_t(h);
      if (f.t == 1 && v >= 0xD8 && v <= 0xDF) return;  // no surrogate halves: one escape, one code point
      g.u = v;
      g.t = f.t + 1;
      if (g.t == 4) {
        g.s = 1;
        g.t = 0;
        g.u = 0;
      }
      emit();
      return;
    }
  }
}

void num_step(const NumNode& n, const Frame& f, uint8_t c, StepOut& out) {
  const int phase = int(f.s & 0xff);
  const uint32_t neg = f.s & 0x100;
  Frame g = f;
  const bool digit = c >= '0' && c <= '9';
  const int d = c - '0';
  switch (phase) {
    case 0:
      if (c == '-') {
        g.s = 1 | 0x100;
        break;
      }
      [[fallthrough]];
    case 1:
      if (!digit) return;
      g.s = 2 | neg;
      g.t = 1;
      g.a = d;
      break;
    case 2:
      if (digit) {
        if ((f.t == 1 && f.a == 0) || int(f.t) >= n.int_digits) return;
        g.a = f.a * 10 + d;
        g.t = f.t + 1;
      } else if (c == '.' && n.frac_digits > 0) {
        g.s = 3 | neg;
      } else {
        return;
      }
      break;
    case 3:
      if (!digit) return;
      g.s = 4 | neg;
      g.u = 1;
      g.b = d;
      break;
    case 4:
      if (!digit || int(f.u) >= n.frac_digits) return;
      g.b = f.b * 10 + d;
      g.u = f.u + 1;
      break;
    default:
      return;
  }
  if (num_min_finish(n, g) >= kInf) return;
  out.next[out.n_next++] = g;
}

}  // namespace

Frame initial_frame(const Grammar& g, uint32_t node) {
  const Node& nd = g.nodes[node];
  Frame f;
  f.node = node;
  switch (nd.kind) {
    case Kind::kLit: f.s = g.lits[nd.idx].root; break;
    case Kind::kText: f.s = g.texts[nd.idx].raw ? 1 : 0; break;
    case Kind::kObj: {
      const ObjNode& o = g.objs[nd.idx];
      if (!o.open.empty()) f.s = 0;
      else if (o.map_value >= 0) f.s = 5;
      else f.s = 1, f.t = o.boundary[0];
      break;
    }
    case Kind::kArr: f.s = g.arrs[nd.idx].open.empty() ? 1 : 0; break;
    default: break;
  }
  return f;
}

namespace {

int64_t arr_item_len(const Grammar& g, const ArrNode& a, int64_t p) {
  if (p < int64_t(a.prefix.size())) return g.nodes[a.prefix[size_t(p)]].min_len;
  return a.items >= 0 ? g.nodes[uint32_t(a.items)].min_len : kInf;
}
int32_t arr_item(const ArrNode& a, int64_t p) {
  if (p >= a.max) return -1;
  if (p < int64_t(a.prefix.size())) return int32_t(a.prefix[size_t(p)]);
  return a.items;
}
// Bytes for the required items after `done` items (separators included), then the close.
int64_t arr_after(const ArrNode& a, int64_t done) {
  const int64_t need = done < int64_t(a.need.size()) ? a.need[size_t(done)] : 0;
  return add_len(need, int64_t(a.close.size()));
}

}  // namespace

bool can_end(const Grammar& g, const Frame& f) {
  const Node& nd = g.nodes[f.node];
  switch (nd.kind) {
    case Kind::kLit: return g.trie[f.s].payload >= 0;
    case Kind::kText: return f.s == 4;
    case Kind::kNum: return num_can_end(g.nums[nd.idx], f);
    case Kind::kObj: return f.s == 9 || (f.s == 1 && g.trie[f.t].payload == kClose);
    case Kind::kArr: {
      const ArrNode& a = g.arrs[nd.idx];
      return f.s == 6 || ((f.s == 1 || f.s == 2) && a.close.empty() && f.a >= a.min);
    }
    case Kind::kSeq: return f.s >= g.seqs[nd.idx].items.size();
    case Kind::kAlt: return false;
  }
  return false;
}

int64_t min_finish(const Grammar& g, const Frame& f) {
  const Node& nd = g.nodes[f.node];
  switch (nd.kind) {
    case Kind::kLit: return g.trie[f.s].to_end;
    case Kind::kText: return text_min_finish(g.texts[nd.idx], f);
    case Kind::kNum: return num_min_finish(g.nums[nd.idx], f);
    case Kind::kObj: {
      const ObjNode& o = g.objs[nd.idx];
      if (o.map_value >= 0) {
        const int64_t close = int64_t(o.close.size());
        const int64_t v = g.nodes[uint32_t(o.map_value)].min_len, k = g.nodes[uint32_t(o.map_key)].min_len;
        switch (f.s) {
          case 0: return int64_t(o.open.size() - f.t) + close;
          case 5: return close;
          case 6: return add_len(add_len(k, 1), add_len(v, close));
          case 7: return add_len(1, add_len(v, close));
          case 8: return add_len(v, close);
          default: return 0;
        }
      }
      auto rest = [&](uint32_t j) { return g.trie[o.boundary[(size_t(j) + 1) * 2 + 1]].to_end; };
      switch (f.s) {
        case 0: return add_len(int64_t(o.open.size() - f.t), g.trie[o.boundary[0]].to_end);
        case 1: return g.trie[f.t].to_end;
        case 2: return add_len(int64_t(o.props[f.u].suffix.size() - f.t), rest(f.u));
        default: {
          const Prop& p = o.props[f.u];
          return add_len(add_len(g.nodes[p.value].min_len, int64_t(p.suffix.size())), rest(f.u));
        }
      }
    }
    case Kind::kArr: {
      const ArrNode& a = g.arrs[nd.idx];
      auto first = [&] { return a.min == 0 ? int64_t(a.close.size()) : add_len(arr_item_len(g, a, 0), arr_after(a, 1)); };
      switch (f.s) {
        case 0: return add_len(int64_t(a.open.size() - f.t), first());
        case 1: return first();
        case 2: return arr_after(a, f.a);
        case 3: return add_len(int64_t(a.sep.size() - f.t), add_len(arr_item_len(g, a, f.a), arr_after(a, f.a + 1)));
        case 4: return int64_t(a.close.size() - f.t);
        case 5: return add_len(arr_item_len(g, a, f.a), arr_after(a, f.a + 1));
        default: return 0;
      }
    }
    case Kind::kSeq: {
      const SeqNode& s = g.seqs[nd.idx];
      return f.s < s.rest.size() ? s.rest[f.s] : 0;
    }
    case Kind::kAlt: return kInf;
  }
  return kInf;
}

int64_t min_finish(const Grammar& g, std::span<const Frame> stack) {
  int64_t sum = 0;
  for (const Frame& f : stack) sum = add_len(sum, min_finish(g, f));
  return sum;
}

void step(const Grammar& g, const Frame& f, uint8_t c, StepOut& out) {
  out.n_next = out.n_calls = 0;
  const Node& nd = g.nodes[f.node];
  auto next = [&](Frame h) {
    if (min_finish(g, h) < kInf) out.next[out.n_next++] = h;
  };
  auto call = [&](Frame resume, uint32_t child) {
    if (g.nodes[child].min_len < kInf && min_finish(g, resume) < kInf) out.calls[out.n_calls++] = {resume, child};
  };
  Frame h = f;
  switch (nd.kind) {
    case Kind::kLit: {
      const TrieNode& n = g.trie[f.s];
      for (uint32_t i = 0; i < n.n_edges; ++i)
        if (g.edges[n.edge_begin + i].byte == c) {
          h.s = g.edges[n.edge_begin + i].child;
          next(h);
        }
      return;
    }
    case Kind::kText: text_step(g.texts[nd.idx], f, c, out); return;
    case Kind::kNum: num_step(g.nums[nd.idx], f, c, out); return;
    case Kind::kObj: {
      const ObjNode& o = g.objs[nd.idx];
      const bool map = o.map_value >= 0;
      switch (f.s) {
        case 0:
          if (c != uint8_t(o.open[f.t])) return;
          if (f.t + 1 < o.open.size()) h.t = f.t + 1;
          else if (map) h = Frame{f.node, 5, 0, 0, 0, 0};
          else h.s = 1, h.t = o.boundary[0];
          next(h);
          return;
        case 1: {
          const TrieNode& n = g.trie[f.t];
          for (uint32_t i = 0; i < n.n_edges; ++i) {
            if (g.edges[n.edge_begin + i].byte != c) continue;
            const uint32_t child = g.edges[n.edge_begin + i].child;
            const int32_t p = g.trie[child].payload;
            if (p >= 0 && p != kClose) h.s = 3, h.u = uint32_t(p), h.t = 0;
            else h.t = child;
            next(h);
          }
          return;
        }
        case 2:
          if (c != uint8_t(o.props[f.u].suffix[f.t])) return;
          if (f.t + 1 < o.props[f.u].suffix.size()) h.t = f.t + 1;
          else h.s = 1, h.t = o.boundary[(size_t(f.u) + 1) * 2 + 1];
          next(h);
          return;
        case 3: {
          const Prop& p = o.props[f.u];
          Frame r = f;
          if (!p.suffix.empty()) r.s = 2, r.t = 0;
          else r.s = 1, r.t = o.boundary[(size_t(f.u) + 1) * 2 + 1];
          call(r, p.value);
          return;
        }
        case 5:
          if (c == uint8_t(o.close[0])) next(Frame{f.node, 9, 0, 0, f.a, 0});
          if (f.b && c == uint8_t(o.sep[0])) next(Frame{f.node, 6, 0, 0, f.a, 1});
          if (!f.b) call(Frame{f.node, 7, 0, 0, f.a, 0}, uint32_t(o.map_key));
          return;
        case 6: call(Frame{f.node, 7, 0, 0, f.a, 1}, uint32_t(o.map_key)); return;
        case 7:
          if (c == ':') next(Frame{f.node, 8, 0, 0, f.a, 1});
          return;
        case 8: call(Frame{f.node, 5, 0, 0, f.a + 1, 1}, uint32_t(o.map_value)); return;
        default: return;
      }
    }
    case Kind::kArr: {
      const ArrNode& a = g.arrs[nd.idx];
      auto close_first = [&] {
        if (a.close.empty() || c != uint8_t(a.close[0])) return;
        next(a.close.size() == 1 ? Frame{f.node, 6, 0, 0, f.a, 0} : Frame{f.node, 4, 1, 0, f.a, 0});
      };
      auto item = [&](int64_t p) {
        const int32_t it = arr_item(a, p);
        if (it >= 0) call(Frame{f.node, 2, 0, 0, p + 1, 0}, uint32_t(it));
      };
      switch (f.s) {
        case 0:
          if (c != uint8_t(a.open[f.t])) return;
          next(f.t + 1 < a.open.size() ? Frame{f.node, 0, f.t + 1, 0, 0, 0} : Frame{f.node, 1, 0, 0, 0, 0});
          return;
        case 1:
          if (a.min == 0) close_first();
          item(0);
          return;
        case 2:
          if (arr_item(a, f.a) >= 0) {
            if (a.sep.empty()) item(f.a);
            else if (c == uint8_t(a.sep[0]))
              next(a.sep.size() == 1 ? Frame{f.node, 5, 0, 0, f.a, 0} : Frame{f.node, 3, 1, 0, f.a, 0});
          }
          if (f.a >= a.min) close_first();
          return;
        case 3:
          if (c != uint8_t(a.sep[f.t])) return;
          next(f.t + 1 < a.sep.size() ? Frame{f.node, 3, f.t + 1, 0, f.a, 0} : Frame{f.node, 5, 0, 0, f.a, 0});
          return;
        case 4:
          if (c != uint8_t(a.close[f.t])) return;
          next(f.t + 1 < a.close.size() ? Frame{f.node, 4, f.t + 1, 0, f.a, 0} : Frame{f.node, 6, 0, 0, f.a, 0});
          return;
        case 5: item(f.a); return;
        default: return;
      }
    }
    case Kind::kSeq: {
      const SeqNode& s = g.seqs[nd.idx];
      if (f.s < s.items.size()) {
        h.s = f.s + 1;
        call(h, s.items[f.s]);
      }
      return;
    }
    case Kind::kAlt: return;
  }
}

// ---- Position ----

namespace {

void replace_top(Cursor& c, const Frame& f) {
  if (c.n > 0) {
    c.top[c.n - 1] = f;
  } else {
    --c.keep;
    c.top[0] = f;
    c.n = 1;
  }
}
void pop(Cursor& c) {
  if (c.n > 0) --c.n;
  else --c.keep;
}
bool same(const Cursor& x, const Cursor& y) {
  if (x.base != y.base || x.keep != y.keep || x.n != y.n) return false;
  for (int i = 0; i < x.n; ++i)
    if (!(x.top[i] == y.top[i])) return false;
  return true;
}

}  // namespace

Position::Position(const Grammar& g) {
  for (uint32_t n : g.nodes[g.root].concrete) stacks_.push_back({initial_frame(g, n)});
  prepare(g);
}

bool Position::can_complete(const Grammar& g) const {
  for (const Stack& s : stacks_) {
    bool all = true;
    for (const Frame& f : s) all = all && can_end(g, f);
    if (all) return true;
  }
  return false;
}

int64_t Position::min_finish(const Grammar& g) const {
  int64_t best = kInf;
  for (const Stack& s : stacks_) best = std::min(best, structured::min_finish(g, s));
  return best;
}

bool Position::can_continue(const Grammar& g) const {
  std::vector<Cursor> cur, nxt;
  cursors(cur);
  for (int b = 0; b < 256; ++b) {
    feed(g, cur, uint8_t(b), nxt);
    if (!nxt.empty()) return true;
  }
  return false;
}

void Position::prepare(const Grammar& g) {
  mf_prefix_.resize(stacks_.size());
  for (size_t i = 0; i < stacks_.size(); ++i) {
    auto& p = mf_prefix_[i];
    p.assign(stacks_[i].size() + 1, 0);
    for (size_t k = 0; k < stacks_[i].size(); ++k) p[k + 1] = add_len(p[k], structured::min_finish(g, stacks_[i][k]));
  }
}

void Position::cursors(std::vector<Cursor>& out) const {
  out.clear();
  for (size_t i = 0; i < stacks_.size(); ++i) {
    Cursor c;
    c.base = uint16_t(i);
    c.keep = uint16_t(stacks_[i].size());
    out.push_back(c);
  }
}

int64_t Position::min_finish(const Grammar& g, const Cursor& c) const {
  int64_t sum = c.base < mf_prefix_.size() && c.keep < mf_prefix_[c.base].size()
                    ? mf_prefix_[c.base][c.keep]
                    : structured::min_finish(g, std::span<const Frame>(stacks_[c.base].data(), c.keep));
  for (int i = 0; i < c.n; ++i) sum = add_len(sum, structured::min_finish(g, c.top[i]));
  return sum;
}

void Position::feed_one(const Grammar& g, const Cursor& c, uint8_t byte, std::vector<Cursor>& out, int guard) const {
  if (c.depth() == 0 || guard > 2 * kMaxDepth) return;
  const Frame& f = top(c);
  StepOut so;
  step(g, f, byte, so);
  auto keep_unique = [&](const Cursor& d) {
    for (const Cursor& o : out)
      if (same(o, d)) return;
    out.push_back(d);
  };
  for (int i = 0; i < so.n_next; ++i) {
    Cursor d = c;
    replace_top(d, so.next[i]);
    keep_unique(d);
  }
  for (int i = 0; i < so.n_calls; ++i) {
    Cursor d = c;
    replace_top(d, so.calls[i].resume);
    if (d.n >= kOverlay || d.depth() >= kMaxDepth) continue;
    for (uint32_t child : g.nodes[so.calls[i].child].concrete) {
      Cursor e = d;
      e.top[e.n++] = initial_frame(g, child);
      feed_one(g, e, byte, out, guard + 1);
    }
  }
  if (can_end(g, f)) {
    Cursor d = c;
    pop(d);
    feed_one(g, d, byte, out, guard + 1);
  }
}

void Position::feed(const Grammar& g, std::span<const Cursor> in, uint8_t byte, std::vector<Cursor>& out) const {
  out.clear();
  for (const Cursor& c : in) feed_one(g, c, byte, out, 0);
}

bool Position::accepts(const Grammar& g, std::string_view bytes, int64_t* finish_after) const {
  std::vector<Cursor> cur, nxt;
  cursors(cur);
  for (unsigned char b : bytes) {
    feed(g, cur, b, nxt);
    if (nxt.empty()) return false;
    cur.swap(nxt);
  }
  if (finish_after) {
    int64_t best = kInf;
    for (const Cursor& c : cur) {
      int64_t sum = structured::min_finish(g, std::span<const Frame>(stacks_[c.base].data(), c.keep));
      for (int i = 0; i < c.n; ++i) sum = add_len(sum, structured::min_finish(g, c.top[i]));
      best = std::min(best, sum);
    }
    *finish_after = best;
  }
  return !cur.empty();
}

bool Position::advance(const Grammar& g, std::string_view bytes) {
  Position p = *this;
  std::vector<Cursor> cur, nxt;
  for (unsigned char b : bytes) {
    p.cursors(cur);
    p.feed(g, cur, b, nxt);
    if (nxt.empty()) return false;
    std::vector<Stack> stacks;
    for (const Cursor& c : nxt) {
      Stack s(p.stacks_[c.base].begin(), p.stacks_[c.base].begin() + c.keep);
      s.insert(s.end(), c.top, c.top + c.n);
      if (std::find(stacks.begin(), stacks.end(), s) == stacks.end()) stacks.push_back(std::move(s));
    }
    p.stacks_ = std::move(stacks);
  }
  *this = std::move(p);
  prepare(g);
  return true;
}

}  // namespace lily::structured
