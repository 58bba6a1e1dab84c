// conveyor::kv::glob_pattern — Redis's glob matching (its util.c
// stringmatchlen), for KEYS, SCAN MATCH and CONFIG GET (glob.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::kv {

// A Redis glob pattern (KEYS, SCAN MATCH, CONFIG GET): * ? [a-z] [^x] and backslash
// escapes, with Redis's meanings (an unterminated [ runs to the end of the
// pattern; ranges may be reversed; a \ inside [] takes the next byte literally).
//
// Compiled once, matched against many keys. Matching splits the pattern at its
// stars and places each piece at its leftmost fit: a piece of plain bytes is
// found with memmem (linear), one with ? or [..] by trying each position. The
// work of one match is bounded by 64 x (|s| + |pattern|) steps whatever the
// input; only a pattern with a run of more than 64 non-star elements that holds
// ? or [..] can reach the bound on a hostile key, and then counts as no match.
// A pattern of more than max_elements non-star elements (longer than any key
// the store accepts) matches nothing and is not compiled: what a pattern makes
// the server allocate stays within about 70 bytes per element.
class glob_pattern {
 public:
  static constexpr std::size_t max_elements = std::size_t{512} << 10;  // the store's max_key
  explicit glob_pattern(std::string_view pattern, bool nocase = false);
  // steps, when given, receives the work done (elements compared).
  bool match(std::string_view s, std::uint64_t* steps = nullptr) const;

 private:
  struct element {
    std::uint8_t kind;   // literal, any, class
    unsigned char a, b;  // literal: the byte and (nocase) its other case
    std::uint32_t cls;   // class: index into classes_
  };
  struct piece {
    std::size_t begin, end;  // elements_[begin, end)
    bool is_plain;           // every element a case-sensitive literal: literals_[begin, end)
  };
  bool match_at(const piece& p, std::string_view s, std::size_t at, std::uint64_t& steps) const;
  std::vector<element> elements_;
  std::string literals_;  // each element's byte (a), for memmem over plain pieces
  std::vector<std::array<std::uint64_t, 4>> classes_;
  std::vector<piece> pieces_;
  // With a star: pieces_ holds the part before the first star (anchored at the
  // start), the parts between stars, and the part after the last (anchored at
  // the end), either end possibly empty. Without: one piece, the whole pattern.
  bool star_ = false;
  bool never_ = false;  // more than max_elements
  std::size_t pattern_size_ = 0;
};

// One-shot glob_pattern(pattern, nocase).match(s).
bool glob_match(std::string_view pattern, std::string_view s, bool nocase = false);

}  // namespace conveyor::kv
