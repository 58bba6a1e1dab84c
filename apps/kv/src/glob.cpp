// Redis's glob patterns, compiled once and matched in bounded steps (glob.hpp).
#include "glob.hpp"

#include <cstring>

namespace conveyor::kv {

namespace {
enum : std::uint8_t { elem_literal, elem_any, elem_class };

unsigned char other_case(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return static_cast<unsigned char>(c - 'A' + 'a');
  if (c >= 'a' && c <= 'z') return static_cast<unsigned char>(c - 'a' + 'A');
  return c;
}
}  // namespace

glob_pattern::glob_pattern(std::string_view p, bool nocase) : pattern_size_(p.size()) {
  // Scans the pattern as Redis's stringmatchlen does (the scan never depends on
  // the string), turning it into elements and the star positions between them.
  std::vector<std::size_t> stars;  // element index where each star run sits
  std::size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '*') {
      while (i < p.size() && p[i] == '*') ++i;
      stars.push_back(elements_.size());
      continue;
    }
    if (c == '?') {
      elements_.push_back({elem_any, 0, 0, 0});
      ++i;
    } else if (c == '[') {
      std::array<std::uint64_t, 4> set{};
      auto add = [&](unsigned char b) { set[b >> 6] |= std::uint64_t{1} << (b & 63); };
      ++i;
      const bool negate = i < p.size() && p[i] == '^';
      if (negate) ++i;
      while (i < p.size() && p[i] != ']') {
        if (p[i] == '\\' && i + 1 < p.size()) {  // the next byte, exactly (no case folding)
          add(static_cast<unsigned char>(p[i + 1]));
          i += 2;
        } else if (i + 2 < p.size() && p[i + 1] == '-') {
          // Redis compares signed chars: swap first, then fold the case.
          int lo = static_cast<signed char>(p[i]), hi = static_cast<signed char>(p[i + 2]);
          if (lo > hi) std::swap(lo, hi);
          if (nocase) {
            lo = lo >= 'A' && lo <= 'Z' ? lo - 'A' + 'a' : lo;
            hi = hi >= 'A' && hi <= 'Z' ? hi - 'A' + 'a' : hi;
          }
          for (int b = 0; b < 256; ++b) {
            int v = static_cast<signed char>(static_cast<unsigned char>(b));
            if (nocase && v >= 'A' && v <= 'Z') v = v - 'A' + 'a';
            if (v >= lo && v <= hi) add(static_cast<unsigned char>(b));
          }
          i += 3;
        } else {
          const auto b = static_cast<unsigned char>(p[i]);
          add(b);
          if (nocase) add(other_case(b));
          ++i;
        }
      }
      if (i < p.size()) ++i;  // the ']' (an unterminated class runs to the end)
      if (negate)
        for (auto& w : set) w = ~w;
      classes_.push_back(set);
      elements_.push_back({elem_class, 0, 0, static_cast<std::uint32_t>(classes_.size() - 1)});
    } else {
      char lit = c;
      if (c == '\\' && i + 1 < p.size()) lit = p[++i];
      const auto b = static_cast<unsigned char>(lit);
      elements_.push_back({elem_literal, b, nocase ? other_case(b) : b, 0});
      ++i;
    }
    if (elements_.size() > max_elements) {  // longer than any key: matches nothing
      never_ = true;
      elements_ = {};
      classes_ = {};
      return;
    }
  }
  star_ = !stars.empty();
  literals_.reserve(elements_.size());
  for (const auto& el : elements_) literals_.push_back(static_cast<char>(el.a));
  auto add_piece = [&](std::size_t b, std::size_t e) {
    piece pc{b, e, true};
    for (std::size_t k = b; k < e && pc.is_plain; ++k)
      pc.is_plain = elements_[k].kind == elem_literal && elements_[k].a == elements_[k].b;
    pieces_.push_back(pc);
  };
  if (!star_) {
    add_piece(0, elements_.size());
    return;
  }
  add_piece(0, stars.front());
  for (std::size_t k = 1; k < stars.size(); ++k) add_piece(stars[k - 1], stars[k]);
  add_piece(stars.back(), elements_.size());
}

bool glob_pattern::match_at(const piece& pc, std::string_view s, std::size_t at,
                            std::uint64_t& steps) const {
  for (std::size_t k = pc.begin; k < pc.end; ++k) {
    ++steps;
    const auto& el = elements_[k];
    const auto c = static_cast<unsigned char>(s[at + k - pc.begin]);
    switch (el.kind) {
      case elem_any:
        break;
      case elem_literal:
        if (c != el.a && c != el.b) return false;
        break;
      default:
        if (!((classes_[el.cls][c >> 6] >> (c & 63)) & 1)) return false;
    }
  }
  return true;
}

bool glob_pattern::match(std::string_view s, std::uint64_t* steps_out) const {
  std::uint64_t steps = 0;
  auto done = [&](bool r) {
    if (steps_out != nullptr) *steps_out = steps;
    return r;
  };
  if (never_) return done(false);
  if (!star_) {
    const auto& pc = pieces_.front();
    return done(pc.end - pc.begin == s.size() && match_at(pc, s, 0, steps));
  }
  const auto& head = pieces_.front();
  const auto& tail = pieces_.back();
  const std::size_t head_n = head.end - head.begin, tail_n = tail.end - tail.begin;
  if (head_n + tail_n > s.size()) return done(false);
  if (!match_at(head, s, 0, steps) || !match_at(tail, s, s.size() - tail_n, steps))
    return done(false);
  // The pieces between stars, each at its leftmost fit in what is left: if a
  // match exists, the one that places every piece leftmost is one.
  std::size_t pos = head_n;
  const std::size_t end = s.size() - tail_n;
  const std::uint64_t budget = 64 * (std::uint64_t{s.size()} + pattern_size_) + 4096;
  for (std::size_t k = 1; k + 1 < pieces_.size(); ++k) {
    const auto& pc = pieces_[k];
    const std::size_t n = pc.end - pc.begin;
    if (n > end - pos) return done(false);
    if (pc.is_plain) {
      const void* hit = ::memmem(s.data() + pos, end - pos, literals_.data() + pc.begin, n);
      steps += n;  // memmem's own work is linear in what it searched
      if (hit == nullptr) {
        steps += end - pos;
        return done(false);
      }
      const auto at = static_cast<std::size_t>(static_cast<const char*>(hit) - s.data());
      steps += at - pos;
      pos = at + n;
      continue;
    }
    std::size_t at = pos;
    while (!match_at(pc, s, at, steps)) {
      if (at == end - n || steps > budget) return done(false);
      ++at;
    }
    pos = at + n;
  }
  return done(true);
}

bool glob_match(std::string_view p, std::string_view s, bool nocase) {
  return glob_pattern(p, nocase).match(s);
}

}  // namespace conveyor::kv
