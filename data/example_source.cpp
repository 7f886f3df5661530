#include "data/example_source.h"

#include <cstring>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/ops.h"

namespace vqddp {

namespace {

// Rows held in memory: a contiguous host f32 tensor (M, F).
class TableSource final : public ExampleSource {
 public:
  explicit TableSource(Tensor t) : t_(std::move(t)) {
    VQDDP_CHECK(t_.dim() == 2 && t_.dtype() == DType::f32, "a table of examples must be f32 rows (M, F), got {} {}",
                dtype_name(t_.dtype()), fmt::join(t_.shape(), "x"));
    t_ = t_.to(Device::cpu());  // tensors are dense
  }
  int64_t rows() const override { return t_.size(0); }
  int64_t dim() const override { return t_.size(1); }
  void read(int64_t row, float* out) const override {
    VQDDP_CHECK(row >= 0 && row < rows(), "row {} of a table of {} rows", row, rows());
    std::memcpy(out, t_.data<float>() + row * dim(), static_cast<size_t>(dim()) * sizeof(float));
  }
  uint32_t fingerprint(uint32_t crc) const override {
    const int64_t shape[2] = {rows(), dim()};
    crc = crc32c(shape, sizeof shape, crc);
    return crc32c(t_.raw_ptr(), t_.nbytes(), crc);
  }

 private:
  Tensor t_;
};

}  // namespace

DataRows::DataRows(Tensor rows) {
  if (rows.defined()) source_ = std::make_shared<TableSource>(std::move(rows));
}

bool DataRows::read_or_next(int64_t row, float* out, bool skip) const {
  int64_t at = row;
  bool wrapped = false;
  for (;;) {
    try {
      read(at, out);
      return at != row;
    } catch (const Error& e) {
      if (!skip) throw;
      at = source_->next_origin(at);
      if (at >= rows()) {
        at = 0;
        wrapped = true;
      }
      VQDDP_CHECK(!(wrapped && at >= row), "no row of {} can be read (data.bad_files \"skip\"); the last error: {}",
                  rows(), e.what());
    }
  }
}

Tensor DataRows::read_range(int64_t begin, int64_t end, bool skip, int64_t* skipped) const {
  VQDDP_CHECK(0 <= begin && begin <= end && end <= rows(), "rows [{}, {}) of {}", begin, end, rows());
  Tensor t = empty({end - begin, dim()});
  float* p = t.data<float>();
  for (int64_t r = begin; r < end; ++r, p += dim()) {
    const bool replaced = read_or_next(r, p, skip);
    if (skipped) *skipped += replaced;
  }
  return t;
}

uint32_t DataRows::fingerprint(uint32_t crc) const {
  if (!source_) return crc32c("-", 1, crc);
  return source_->fingerprint(crc);
}

}  // namespace vqddp
