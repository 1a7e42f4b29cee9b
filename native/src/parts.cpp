#include "ddl/parts.hpp"

#include <algorithm>
#include <cstring>

namespace ddl {

PartsCopies::PartsCopies(bool gather, char* staged, const char* src, char* dst, size_t elem, int64_t piece,
                         std::vector<int64_t> counts, std::vector<int64_t> positions, int rank)
    : gather_(gather), staged_(staged), src_(src), dst_(dst), elem_(elem), piece_(piece), counts_(std::move(counts)),
      positions_(std::move(positions)), rank_(static_cast<size_t>(rank)) {
  int64_t at = 0;
  for (int64_t n : counts_) starts_.push_back(at), at += n;
}

int64_t PartsCopies::length(size_t block, size_t r) const {
  return std::clamp<int64_t>(counts_[r] - static_cast<int64_t>(block) * piece_, 0, piece_);
}

void PartsCopies::piece_in(size_t block, size_t r, const char* flat, int64_t first) {
  const int64_t p = static_cast<int64_t>(counts_.size());
  char* to = staged_ + static_cast<size_t>((static_cast<int64_t>(block) * p + positions_[r]) * piece_) * elem_;
  const int64_t n = length(block, r);
  if (n > 0) std::memcpy(to, flat + static_cast<size_t>(first + static_cast<int64_t>(block) * piece_) * elem_,
                         static_cast<size_t>(n) * elem_);
  if (n < piece_) std::memset(to + static_cast<size_t>(n) * elem_, 0, static_cast<size_t>(piece_ - n) * elem_);
}

void PartsCopies::piece_out(size_t block, size_t r, char* flat, int64_t first) {
  const int64_t p = static_cast<int64_t>(counts_.size());
  const char* from =
      staged_ + static_cast<size_t>((static_cast<int64_t>(block) * p + positions_[r]) * piece_) * elem_;
  const int64_t n = length(block, r);
  // (memmove: an allgather in place has this rank's part of dst as its src, the same bytes)
  if (n > 0) std::memmove(flat + static_cast<size_t>(first + static_cast<int64_t>(block) * piece_) * elem_, from,
                          static_cast<size_t>(n) * elem_);
}

bool PartsCopies::ready(size_t block) {
  for (; filled_ <= block; ++filled_) {
    if (gather_) {
      piece_in(filled_, rank_, src_, 0);
    } else {
      for (size_t r = 0; r < counts_.size(); ++r) piece_in(filled_, r, src_, starts_[r]);
    }
  }
  return true;
}

void PartsCopies::finished(size_t block) {
  if (gather_) {
    for (size_t r = 0; r < counts_.size(); ++r) piece_out(block, r, dst_, starts_[r]);
  } else {
    piece_out(block, rank_, dst_, 0);
  }
}

}  // namespace ddl
