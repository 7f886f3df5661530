// metrics.jsonl of a run: one JSON object per line, each with the "step" it
// describes. Opened when the run starts, so a directory that cannot take it
// fails before any training; on a resume, cut back to the checkpoint's step
// first, so the steps between that checkpoint and the stop (which are
// trained again) are not listed twice.
//
// A write that fails (a full disk) is undone to the last whole line and
// counted, and training goes on: the checkpoint matters more than a
// progress line. The first loss is reported on stderr at once, the total
// when the log closes.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace vqddp {

class MetricsLog {
 public:
  // Opens (creates) `path` for appending; with `resume_step` >= 0, first
  // drops every line whose step is past it, and any line that is not a
  // whole JSON object (cut off by a kill). Errors name the file.
  MetricsLog(std::string path, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void write(const nlohmann::json& line);
  int64_t lost() const { return lost_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t lost_ = 0;
  bool fragment_ = false;  // a failed write left part of a line that could not be cut off
};

}  // namespace vqddp
