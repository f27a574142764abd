// BPE merge loop: always apply the adjacent pair with the lowest merge rank, leftmost first
// among equal ranks (HF's Word::merge_all without dropout). Symbols live in a linked array; a
// min-heap of candidate pairs is re-validated on pop.
#include "text/bpe.h"

#include <algorithm>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/json_int.h"
#include "text/byte_level.h"

namespace lily {

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words: fast for the short keys pre-tokens are.
  uint64_t h = 1469598103934665603ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  __builtin_memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 1099511628211ull;
  h ^= h >> 32;
  return static_cast<size_t>(h);
}

namespace {
constexpr size_t kCacheMaxBytes = 64u << 20;
constexpr size_t kCacheMaxWordLen = 256;  // longer pre-tokens are rare and not worth keeping
}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const nlohmann::json& m) {
  auto model = std::make_unique<BpeModel>();
  std::string type = m.value("type", "");
  if (type != "BPE") return errorf("tokenizer.json: model.type '{}' is not supported (only BPE)", type);
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    return errorf("tokenizer.json: model.dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
      return errorf("tokenizer.json: model.{} is not supported", k);
  if (m.value("byte_fallback", false)) return errorf("tokenizer.json: model.byte_fallback=true is not supported");
  model->fuse_unk_ = m.value("fuse_unk", false);
  model->ignore_merges_ = m.value("ignore_merges", false);
  if (!m.contains("vocab") || !m["vocab"].is_object()) return errorf("tokenizer.json: model.vocab missing");

  int32_t max_id = -1;
  model->vocab_.reserve(m["vocab"].size() * 2);
  model->bytes_vocab_.reserve(m["vocab"].size() * 2);
  for (auto& [tok, idj] : m["vocab"].items()) {
    const auto id = json_int(idj, 0, INT32_MAX / 2);
    if (!id) return errorf("tokenizer.json: vocab entry '{}' has no integer id in [0, {}]", tok, INT32_MAX / 2);
    model->vocab_.emplace(tok, static_cast<int32_t>(*id));
    max_id = std::max(max_id, static_cast<int32_t>(*id));
  }
  model->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  model->has_id_.assign(static_cast<size_t>(max_id + 1), false);
  std::fill(std::begin(model->byte_id_), std::end(model->byte_id_), -1);
  for (auto& [tok, id] : model->vocab_) {
    model->id_to_token_[id] = tok;
    model->has_id_[id] = true;
    if (auto raw = byte_level::decode(tok)) {
      if (raw->size() == 1) model->byte_id_[static_cast<uint8_t>((*raw)[0])] = id;
      model->bytes_vocab_.emplace(std::move(*raw), id);
    }
  }
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    auto unk = m["unk_token"].get<std::string>();
    auto it = model->vocab_.find(unk);
    if (it == model->vocab_.end()) return errorf("tokenizer.json: unk_token '{}' not in vocab", unk);
    model->unk_id_ = it->second;
  }

  // Merges: either "a b" strings or ["a", "b"] pairs. A later duplicate overrides (HF collects
  // them into a map in file order).
  const auto& merges = m.contains("merges") ? m["merges"] : nlohmann::json::array();
  if (!merges.is_array()) return errorf("tokenizer.json: model.merges is not an array");
  model->merges_.reserve(merges.size() * 2);
  uint32_t rank = 0;
  std::string joined;
  for (const auto& mj : merges) {
    std::string_view a, b;
    if (mj.is_string()) {
      const auto& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) return errorf("tokenizer.json: merge '{}' has no space", s);
      a = std::string_view(s).substr(0, sp);
      b = std::string_view(s).substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get_ref<const std::string&>();
      b = mj[1].get_ref<const std::string&>();
    } else {
      return errorf("tokenizer.json: merge #{} is neither \"a b\" nor [\"a\",\"b\"]", rank);
    }
    joined.assign(a);
    joined.append(b);
    auto ia = model->vocab_.find(a), ib = model->vocab_.find(b), inew = model->vocab_.find(joined);
    if (ia == model->vocab_.end() || ib == model->vocab_.end())
      return errorf("tokenizer.json: merge #{} '{} {}' uses a token not in the vocab", rank, a, b);
    if (inew == model->vocab_.end())
      return errorf("tokenizer.json: merge #{} '{} {}' makes a token not in the vocab", rank, a, b);
    model->merges_[pair_key(ia->second, ib->second)] = Merge{rank, inew->second};
    ++rank;
  }
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() <= kCacheMaxWordLen) {
    std::shared_lock lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_uncached(word, out);
  if (word.size() <= kCacheMaxWordLen) {
    std::unique_lock lock(cache_mu_);
    if (cache_bytes_ > kCacheMaxBytes) {
      cache_.clear();
      cache_bytes_ = 0;
    }
    auto [it, inserted] = cache_.try_emplace(std::string(word), out.begin() + start, out.end());
    if (inserted) cache_bytes_ += word.size() + 4 * it->second.size() + 64;
  }
}

void BpeModel::merge_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = bytes_vocab_.find(word);
    if (it != bytes_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols: one per byte (one ByteLevel char per byte).
  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  bool last_unk = false;
  for (size_t i = 0; i < word.size(); ++i) {
    int32_t id = byte_id_[static_cast<uint8_t>(word[i])];
    if (id >= 0) {
      last_unk = false;
    } else if (unk_id_) {
      if (fuse_unk_ && last_unk) continue;
      id = *unk_id_;
      last_unk = true;
    } else {
      continue;  // HF drops a char that is not in the vocab when there is no unk token
    }
    int32_t k = static_cast<int32_t>(syms.size());
    syms.push_back({id, k - 1, k + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  // Candidate merges ordered by (rank, position).
  struct Cand {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Cand> heap;
  heap.clear();
  auto push = [&](Cand c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i)
    if (const Merge* mg = find_merge(syms[i].id, syms[i + 1].id)) push({mg->rank, i, mg->new_id});

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    Cand c = heap.back();
    heap.pop_back();
    Sym& left = syms[c.pos];
    if (!left.alive || left.next < 0) continue;
    Sym& right = syms[left.next];
    const Merge* mg = find_merge(left.id, right.id);
    if (!mg || mg->rank != c.rank || mg->new_id != c.new_id) continue;  // stale candidate
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    if (left.prev >= 0)
      if (const Merge* m2 = find_merge(syms[left.prev].id, left.id)) push({m2->rank, left.prev, m2->new_id});
    if (left.next >= 0)
      if (const Merge* m2 = find_merge(left.id, syms[left.next].id)) push({m2->rank, c.pos, m2->new_id});
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace lily
