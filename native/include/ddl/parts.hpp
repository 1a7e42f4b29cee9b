// A reduce-scatter's or an allgather's staged buffer (ddl.core.parts), filled and emptied block by block:
// block b holds the b-th piece of every rank's part, in position order. Just before a block starts, the pieces
// this rank contributes are copied in (a reduce-scatter's: every rank's part of the input; an allgather's: its
// own part); as soon as the block is done, the pieces this rank keeps are copied out (a reduce-scatter's: its own
// part; an allgather's: every part, into the output in rank order). So the copies overlap the transfers of other
// blocks instead of adding a pass over the whole buffer before and after the run.
#pragma once
#include <cstdint>
#include <vector>

#include "ddl/executor.hpp"

namespace ddl {

class PartsCopies final : public BlockHooks {
 public:
  // gather: an allgather (src: this rank's part; dst: every part in rank order), else a reduce-scatter (src:
  // every part in rank order; dst: this rank's part). counts: elements of each rank's part; positions: each
  // rank's position in a block; piece: elements of one part in one block; elem: bytes of an element.
  PartsCopies(bool gather, char* staged, const char* src, char* dst, size_t elem, int64_t piece,
              std::vector<int64_t> counts, std::vector<int64_t> positions, int rank);
  bool ready(size_t block) override;
  void finished(size_t block) override;

 private:
  // Copies rank r's piece of block b between its place in the rank-ordered buffer `flat` (which starts at
  // `first`: 0 for one part, the part's start for all) and the staged buffer; zeroes the padding going in.
  void piece_in(size_t block, size_t r, const char* flat, int64_t first);
  void piece_out(size_t block, size_t r, char* flat, int64_t first);
  int64_t length(size_t block, size_t r) const;

  bool gather_;
  char* staged_;
  const char* src_;
  char* dst_;
  size_t elem_;
  int64_t piece_;
  std::vector<int64_t> counts_, positions_, starts_;
  size_t rank_;
  size_t filled_ = 0;  // blocks copied in so far (ready() may be asked again for the same block)
};

}  // namespace ddl
