// Where a data set's rows come from. Training asks for rows by number
// (the sampler's (source, row) pairs, a validation chunk's range) and never
// holds a whole source: a source of audio windows (data/audio_windows.h)
// decodes each row from its file when it is asked for, so memory does not
// grow with the corpus; images and tests' synthetic rows are a table in
// memory. One interface, so the sampler, the trainer and validation have
// one path whatever the rows' origin.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"

namespace vqddp {

class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  virtual int64_t rows() const = 0;
  virtual int64_t dim() const = 0;  // floats per row
  // Row `row` (< rows()) into out[0, dim()). Safe from several threads at
  // once (the prefetching readers call it side by side). Throws an Error
  // naming the file when the row's origin cannot give it.
  virtual void read(int64_t row, float* out) const = 0;
  // `crc` (a CRC32C, engine/core/file_io.h) extended by what identifies the
  // rows: their count and width, and their content or its stand-in (an
  // audio source's files' headers, sizes and first and last bytes), never a
  // path, so nodes that mount one corpus at other paths agree.
  virtual uint32_t fingerprint(uint32_t crc) const = 0;
  // The next row that may be readable after `row` failed (rows() when
  // none is left): row + 1, or past every row of the same file.
  virtual int64_t next_origin(int64_t row) const { return row + 1; }
};

// A source's rows, shared: held by value in a Dataset. From a host float
// tensor (M, F) implicitly, whose rows are then held in memory.
class DataRows {
 public:
  DataRows() = default;
  DataRows(Tensor rows);  // NOLINT: implicit, a table in memory is the common case in code
  explicit DataRows(std::shared_ptr<const ExampleSource> source) : source_(std::move(source)) {}

  bool defined() const { return source_ != nullptr; }
  int64_t rows() const { return source_ ? source_->rows() : 0; }
  int64_t dim() const { return source_ ? source_->dim() : 0; }
  void read(int64_t row, float* out) const { source_->read(row, out); }
  // Row `row`, or where it cannot be read (an Error) and `skip` is set, the
  // next row that can, in row order from the next file on (next_origin),
  // wrapping around; an Error when none can. Returns whether `row` was
  // replaced. A replacement depends on the files alone, so every rank (and
  // a 1-rank run) replaces a row alike.
  bool read_or_next(int64_t row, float* out, bool skip) const;
  // Rows [begin, end) as a host tensor (end - begin, dim()), each by
  // read_or_next; `skipped` (if given) counts the rows replaced.
  Tensor read_range(int64_t begin, int64_t end, bool skip = false, int64_t* skipped = nullptr) const;
  uint32_t fingerprint(uint32_t crc) const;
  const ExampleSource* source() const { return source_.get(); }

 private:
  std::shared_ptr<const ExampleSource> source_;
};

}  // namespace vqddp
