// The vocabulary's byte trie (see json_schema.hpp).
#include <algorithm>

#include "exl3/text/json_schema.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3 {

namespace {
// Longer tokens are left out of masks: no vocabulary has real ones, and the build recurses once
// per byte.
constexpr size_t kMaxTokenBytes = 1024;
}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes)
    : vocab_size_(token_bytes.size()) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < token_bytes.size(); ++i) {
    const size_t n = token_bytes[i].size();
    if (n > 0 && n <= kMaxTokenBytes) ids.push_back(static_cast<int32_t>(i));
  }
  // Sorted by bytes, each node's tokens and subtrees are contiguous runs.
  std::sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) {
    const auto& a = token_bytes[static_cast<size_t>(x)];
    const auto& b = token_bytes[static_cast<size_t>(y)];
    return a != b ? a < b : x < y;
  });
  build(ids, 0, ids.size(), 0, token_bytes);
}

uint32_t TokenTrie::build(std::vector<int32_t>& ids, size_t lo, size_t hi, size_t depth,
                          const std::vector<std::string>& bytes) {
  const auto me = static_cast<uint32_t>(nodes_.size());
  nodes_.emplace_back();
  auto len = [&](size_t i) { return bytes[static_cast<size_t>(ids[i])].size(); };
  auto at = [&](size_t i) {
    return static_cast<uint8_t>(bytes[static_cast<size_t>(ids[i])][depth]);
  };
  size_t i = lo;
  nodes_[me].first_token = static_cast<uint32_t>(tokens_.size());
  while (i < hi && len(i) == depth) tokens_.push_back(ids[i++]);
  nodes_[me].num_tokens = static_cast<uint32_t>(tokens_.size()) - nodes_[me].first_token;
  struct Group {
    uint8_t byte;
    size_t lo, hi;
  };
  std::vector<Group> groups;
  while (i < hi) {
    const uint8_t b = at(i);
    size_t j = i;
    while (j < hi && at(j) == b) ++j;
    groups.push_back({b, i, j});
    i = j;
  }
  // This node's edges are reserved together before the children add theirs.
  const auto first = static_cast<uint32_t>(edges_.size());
  nodes_[me].first_edge = first;
  nodes_[me].num_edges = static_cast<uint32_t>(groups.size());
  edges_.resize(edges_.size() + groups.size());
  for (size_t k = 0; k < groups.size(); ++k) {
    const uint32_t child = build(ids, groups[k].lo, groups[k].hi, depth + 1, bytes);
    edges_[first + k] = {groups[k].byte, child};
  }
  return me;
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tok) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(tok.vocab_size(), 0)));
  for (size_t id = 0; id < bytes.size(); ++id) {
    const auto i = static_cast<int32_t>(id);
    if (tok.is_special(i)) continue;
    if (auto b = tok.token_bytes(i)) bytes[id] = std::move(*b);
  }
  return std::make_shared<const TokenTrie>(bytes);
}

}  // namespace exl3
