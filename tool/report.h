// `vqddp report RUN_DIR`: a run's report as one self-contained HTML page
// (RUN_DIR/report.html) for people training neural audio codecs and
// VQ-VAEs: loss, learning rate, validation, codebook use over time, code
// usage histograms, held-out clips to listen to, and the config. Plots are
// inline SVG drawn here and clips are embedded as data: URLs, with no
// JavaScript and no external files, so the page can be mailed, attached to
// an issue or opened offline years later and still show everything.
#pragma once

#include <string>

namespace vqddp {

// The page, built from RUN_DIR/run.json and RUN_DIR/metrics.jsonl (both
// required; errors name the missing or malformed file), and, where present,
// RUN_DIR/code_usage.json and RUN_DIR/clips/clip_<i>_{original,decoded}.wav.
// Lines of metrics.jsonl that are not JSON objects with a "step" (a run
// killed mid-write) are skipped. Every drawn plot is an
// <svg class="plot" data-series="S" data-points="P"> with S, P > 0; a plot
// without data is a "no data" note instead.
std::string render_report(const std::string& run_dir);

// Writes render_report(run_dir) to RUN_DIR/report.html atomically (a reader
// never sees half a page) and returns that path.
std::string write_report(const std::string& run_dir);

}  // namespace vqddp
