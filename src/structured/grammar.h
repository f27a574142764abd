// An output grammar over bytes: what a JSON schema (or a tool-call format) compiles to, and what
// the matcher runs. Nodes are few and JSON-shaped instead of a general CFG, so each can count what
// a schema bounds (string code points, array items, number digits and range) without unrolling
// it into states. Alternatives (anyOf, optional shapes) are resolved at run time by keeping every
// live stack. Every node knows the fewest bytes that complete it (min_len), which is what lets a
// constrained reply always end in complete output within its token budget.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lily::structured {

constexpr int64_t kInf = INT64_MAX / 4;  // "no bound" / "cannot complete"
using i128 = __int128;

enum class Kind : uint8_t { kLit, kText, kNum, kObj, kArr, kSeq, kAlt };

// A byte trie over a set of literals; one pool per grammar. Edges of a node are sorted by byte.
struct TrieNode {
  uint32_t edge_begin = 0, n_edges = 0;
  int32_t payload = -1;   // -1: no literal ends here; else what ends here (kLitEnd, a property, kClose)
  int64_t to_end = kInf;  // fewest bytes from here to the end of the node, what follows the literal included
};
struct TrieEdge {
  uint8_t byte;
  uint32_t child;
};
constexpr int32_t kLitEnd = 0;           // plain literals
constexpr int32_t kClose = INT32_MAX;    // object boundaries: the close literal

// Raw text ends at a terminator and must not contain any forbidden string (Aho-Corasick DFA over
// bytes). The Qwen tool-call format writes string arguments this way: "VALUE\n</parameter>".
struct RawAutomaton {
  std::string terminator;
  std::vector<std::string> forbidden;
  std::vector<uint16_t> next;       // [n_states * 256]
  std::vector<uint8_t> term_depth;  // longest suffix of the state's text that is a prefix of the terminator
  std::vector<uint8_t> out;         // 1: the terminator ends here; 2: a forbidden string ends here
  uint8_t safe_byte = 'a';          // a byte that leads every state to a plain one (no match, depth 0)
  int n_states() const { return int(term_depth.size()); }
};
// Built once per (terminator, forbidden) and shared by every grammar (and the vocabulary tables).
std::shared_ptr<const RawAutomaton> raw_automaton(const std::string& terminator,
                                                  const std::vector<std::string>& forbidden);

struct LitNode {
  uint32_t root = 0;  // trie node
};
struct TextNode {
  const RawAutomaton* raw = nullptr;  // null: a JSON string (quotes and escapes); else raw text
  int64_t min = 0, max = kInf;        // length in code points (the content, without terminator)
};
// -?(0|[1-9]d*)(.d+)? with at most int_digits integer digits and frac_digits fraction digits; the
// value times 10^frac_digits must lie in [lo, hi] (exact, in 128-bit integers).
struct NumNode {
  int int_digits = 15, frac_digits = 0;
  bool bounded = false;
  i128 lo = 0, hi = 0;
};
struct Prop {
  std::string key;     // the literal before the value: "\"name\":" or "<parameter=name>\n"
  uint32_t value = 0;
  std::string suffix;  // the literal after the value ("" in JSON)
  bool required = false;
};
// An object in fixed property order: each property in turn may be written (required ones must),
// `sep` before all but the first. map_value >= 0 instead: free keys (JSON strings) -> map_value.
struct ObjNode {
  std::string open, sep, close;
  std::vector<Prop> props;
  std::vector<uint32_t> boundary;  // trie roots, [i * 2 + any_written]: what may come before property i
  int32_t map_key = -1, map_value = -1;
};
struct ArrNode {
  std::string open, sep, close;
  std::vector<uint32_t> prefix;  // per-position item nodes (prefixItems)
  int32_t items = -1;            // the rest (-1: no more items)
  int64_t min = 0, max = kInf;
  std::vector<int64_t> need;     // [min + 1]: fewest bytes for the items still required after a items
};
struct SeqNode {
  std::vector<uint32_t> items;
  std::vector<int64_t> rest;  // [n + 1]: fewest bytes of items[i..]
};
struct AltNode {
  std::vector<uint32_t> alts;
};

struct Node {
  Kind kind;
  uint32_t idx;             // into the grammar's vector of that kind
  int64_t min_len = kInf;   // fewest bytes of a complete value (kInf: none is finite)
  std::vector<uint32_t> concrete;  // what a call to this node starts: itself, or an Alt's leaves
};

struct Grammar {
  std::vector<Node> nodes;
  std::vector<TrieNode> trie;
  std::vector<TrieEdge> edges;
  std::vector<LitNode> lits;
  std::vector<TextNode> texts;
  std::vector<NumNode> nums;
  std::vector<ObjNode> objs;
  std::vector<ArrNode> arrs;
  std::vector<SeqNode> seqs;
  std::vector<AltNode> alts;
  std::vector<std::shared_ptr<const RawAutomaton>> automata;  // keeps TextNode::raw alive
  uint32_t root = 0;

  const TrieNode* trie_child(uint32_t node, uint8_t byte) const;
  const Node& node(uint32_t id) const { return nodes[id]; }
};

// Builds a Grammar. Nodes may be created before their contents (set_alts on a placeholder), so
// recursive schemas ($ref cycles) are fine; finish() computes min_len by fixpoint, drops what can
// never complete, and fails when the root cannot.
class GrammarBuilder {
 public:
  uint32_t literal(const std::vector<std::string>& alternatives);
  uint32_t text(int64_t min, int64_t max, std::shared_ptr<const RawAutomaton> raw = nullptr);
  uint32_t number(const NumNode& n);
  uint32_t object(ObjNode o);  // boundary tries are built here from props/open/sep/close
  uint32_t array(ArrNode a);
  uint32_t seq(std::vector<uint32_t> items);
  uint32_t alt(std::vector<uint32_t> alts);
  uint32_t placeholder();                         // an Alt filled later
  void set_alts(uint32_t alt_node, std::vector<uint32_t> alts);
  // Any JSON value, nested at most `depth` deep (objects as free maps).
  uint32_t any_value(int depth);
  size_t n_nodes() const { return g_->nodes.size(); }
  size_t trie_size() const { return g_->trie.size(); }

  // Fails (message) when the root admits no finite output.
  std::string finish(uint32_t root, std::unique_ptr<Grammar>& out);

 private:
  uint32_t add(Kind k, uint32_t idx);
  uint32_t build_trie(const std::vector<std::pair<std::string, int32_t>>& words);
  void compute_lengths();
  std::unique_ptr<Grammar> g_ = std::make_unique<Grammar>();
  std::vector<uint32_t> any_;  // any_value(depth) cache
};

}  // namespace lily::structured
