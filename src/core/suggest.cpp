// closest_name: Levenshtein distance on names normalized to '_' without leading dashes.
#include "qkv/suggest.h"

#include <algorithm>
#include <vector>

namespace qkv {
namespace {

std::string normalized(std::string_view name) {
  while (name.starts_with('-')) name.remove_prefix(1);
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// `given` is `name` with a word joined before or after it by '_'.
bool adds_a_word(const std::string& given, const std::string& name) {
  if (name.empty() || given.size() <= name.size() + 1) return false;
  return (given.ends_with(name) && given[given.size() - name.size() - 1] == '_') ||
         (given.starts_with(name) && given[name.size()] == '_');
}

}  // namespace

std::optional<std::string> closest_name(std::string_view given, std::span<const std::string> known) {
  const std::string g = normalized(given);
  std::optional<std::string> best;
  std::size_t best_distance = 3;  // 0-2 edits; a joined word counts as 3, below every other
  bool joined = false;
  for (const std::string& k : known) {
    const std::string n = normalized(k);
    if (const std::size_t d = edit_distance(g, n); d < best_distance) {
      best = k, best_distance = d;
    } else if (!best && !joined && adds_a_word(g, n)) {
      best = k, joined = true;
    }
  }
  return best;
}

}  // namespace qkv
