// The run report page. Everything on it is computed here from the files the
// trainer leaves in the run directory; nothing is fetched when it is viewed.
//
// One helper draws every line plot (line_plot) and one every histogram
// (bar_chart); both share the frame (axes with "nice" 1/2/5 x 10^k ticks or
// decades, grid, titles, legend) so all plots read alike. Each <svg> states
// how many series and points it drew (data-series, data-points), so a test
// can tell a plot that has data from an empty frame without parsing SVG.
#include "tool/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/file_io.h"
#include "engine/core/output_file.h"
#include "train/run_record.h"

namespace vqddp {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Tableau 10: distinct in print and for the common colour-vision deficiencies.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kMaxBars = 512;  // more bars than that are thinner than a pixel at our width

// Safe in HTML text, attribute values and SVG alike.
std::string esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Counts and steps print whole ("32940", where {:.4g} would print
// "3.294e+04"); everything else with 4 significant digits.
std::string num(double v) {
  if (std::isfinite(v) && v == std::round(v) && std::abs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

std::string base64(std::string_view bytes) {
  static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kDigits[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// ---- plots ----------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<double> xs, ys;
  bool dashed = false;
  int color = -1;  // palette index; -1: the series' position in the plot
};

struct PlotSpec {
  std::string label;  // what the plot shows, for screen readers and the "no data" note
  std::string x_title, y_title;
  std::vector<Series> series = {};
  bool log_y_if_wide = false;  // log scale when every y > 0 and they span more than 10x
  int width = 640, height = 260;  // without the legend, which adds rows on top
};

// One axis: its range in data units (log10 of them on a log axis) and the
// values that get a tick, grid line and label.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;
  double frac(double v) const { return ((log ? std::log10(v) : v) - lo) / (hi - lo); }
};

// `widen` extends the range to the ticks around the data (a y axis that
// starts and ends on a label); otherwise the range is the data's and only
// ticks inside it are kept (steps run from the first logged to the last).
Axis make_axis(double lo, double hi, bool log, bool widen) {
  Axis a;
  a.log = log;
  if (log) {
    a.lo = std::floor(std::log10(lo));
    a.hi = std::max(std::ceil(std::log10(hi)), a.lo + 1);
    int stride = static_cast<int>(std::ceil((a.hi - a.lo) / 6));  // at most ~6 decade labels
    for (double e = a.lo; e <= a.hi; e += stride) a.ticks.push_back(std::pow(10.0, e));
    return a;
  }
  // One value, or values equal but for rounding (ticks a few ulps apart
  // would read as one label repeated): centre them in a small range.
  if (hi - lo <= 1e-9 * std::max(std::abs(lo), std::abs(hi))) {
    double mid = (lo + hi) / 2, pad = mid == 0 ? 1 : std::abs(mid) * 0.1;
    lo = mid - pad;
    hi = mid + pad;
  }
  double raw = (hi - lo) / 4, mag = std::pow(10.0, std::floor(std::log10(raw))), r = raw / mag;
  double step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  // The epsilon keeps a bound that is a multiple of step (0.3 / 0.1) from
  // gaining a tick beyond it through rounding.
  double i0 = std::floor(lo / step + 1e-9), i1 = std::ceil(hi / step - 1e-9);
  a.lo = widen ? i0 * step : lo;
  a.hi = widen ? i1 * step : hi;
  for (int i = 0; i <= static_cast<int>(i1 - i0); ++i) {
    double t = (i0 + i) * step;  // an integer multiple, so 0 is exactly 0
    if (t >= a.lo - 1e-9 * step && t <= a.hi + 1e-9 * step) a.ticks.push_back(t);
  }
  return a;
}

// Where the plot area of one <svg> lies, in pixels.
struct Frame {
  Axis x, y;
  int width = 0, height = 0;
  double left = 0, right = 0, top = 0, bottom = 0;
  double px(double v) const { return left + x.frac(v) * (right - left); }
  double py(double v) const { return bottom - y.frac(v) * (bottom - top); }
};

constexpr double kLeft = 64, kRight = 16, kTop = 10, kBottom = 44, kLegendRow = 16;

// Legend entries flow left to right in rows above the plot area; sets
// `height` to the rows' total. Takes series whose colours are resolved. A
// plot of one series needs none: its y axis title names it.
std::string legend_svg(const std::vector<Series>& series, int width, double& height) {
  height = 0;
  if (series.size() < 2) return "";
  std::string out;
  double x = kLeft, y = kTop + 8;
  for (const Series& s : series) {
    double w = 34 + 6.5 * s.name.size();  // swatch, gap and an estimate of the text's width at 11px
    if (x + w > width - kRight && x > kLeft) {
      x = kLeft;
      y += kLegendRow;
    }
    const char* color = kPalette[s.color % std::size(kPalette)];
    out += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)", x, y - 4,
                       x + 22, y - 4, color, s.dashed ? R"( stroke-dasharray="5 3")" : "");
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}">{}</text>)", x + 26, y, esc(s.name));
    x += w;
  }
  height = y - kTop + 6;
  return out;
}

// The <svg> around `marks` (the data's shapes, in the pixels of `f`): grid,
// frame, tick labels, axis titles and legend.
std::string plot_svg(const Frame& f, const PlotSpec& spec, const std::string& legend, const std::string& marks,
                     int series, int points) {
  std::string out = fmt::format(
      R"(<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(data-series="{2}" data-points="{3}" role="img" aria-label="{4}"><title>{4}</title>)",
      f.width, f.height, series, points, esc(spec.label));
  for (double t : f.x.ticks) {
    double x = f.px(t);
    out += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}"/>)", x, f.top, f.bottom);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", x, f.bottom + 14, num(t));
  }
  for (double t : f.y.ticks) {
    double y = f.py(t);
    out += fmt::format(R"(<line class="grid" x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}"/>)", f.left, y, f.right);
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end">{}</text>)", f.left - 5, y + 4, num(t));
  }
  out += fmt::format(R"(<rect class="frame" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}"/>)", f.left, f.top,
                     f.right - f.left, f.bottom - f.top);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)", (f.left + f.right) / 2,
                     f.bottom + 34, esc(spec.x_title));
  out += fmt::format(R"svg(<text transform="translate(14,{:.1f}) rotate(-90)" text-anchor="middle">{}{}</text>)svg",
                     (f.top + f.bottom) / 2, esc(spec.y_title), f.y.log ? " (log scale)" : "");
  return out + legend + marks + "</svg>";
}

Frame make_frame(const PlotSpec& spec, Axis x, Axis y, double legend_height) {
  Frame f{std::move(x), std::move(y), spec.width, static_cast<int>(std::ceil(spec.height + legend_height))};
  f.left = kLeft;
  f.right = spec.width - kRight;
  f.top = kTop + legend_height;
  f.bottom = f.height - kBottom;
  return f;
}

std::string no_data(const std::string& label) { return fmt::format(R"(<p class="note">{}: no data</p>)", esc(label)); }

// Beyond this a coordinate is not drawn: the span of two such values
// overflows a double (1e308 - -1e308), and the pixels would be NaN.
constexpr double kMaxPlotted = 1e300;

// Every line plot of the page. Points with a non-finite coordinate, or one
// beyond +-kMaxPlotted, are skipped; a series of one point is drawn as a dot; a plot without any
// point is a "no data" note instead of an empty frame.
std::string line_plot(const PlotSpec& spec) {
  std::vector<Series> drawn;  // the series with points, finite ones only
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  int points = 0;
  for (size_t i = 0; i < spec.series.size(); ++i) {
    const Series& s = spec.series[i];
    Series d{s.name, {}, {}, s.dashed, s.color < 0 ? static_cast<int>(i) : s.color};
    for (size_t k = 0; k < std::min(s.xs.size(), s.ys.size()); ++k) {
      if (!(std::abs(s.xs[k]) <= kMaxPlotted) || !(std::abs(s.ys[k]) <= kMaxPlotted)) continue;
      d.xs.push_back(s.xs[k]);
      d.ys.push_back(s.ys[k]);
      x0 = std::min(x0, s.xs[k]);
      x1 = std::max(x1, s.xs[k]);
      y0 = std::min(y0, s.ys[k]);
      y1 = std::max(y1, s.ys[k]);
    }
    points += static_cast<int>(d.xs.size());
    if (!d.xs.empty()) drawn.push_back(std::move(d));
  }
  if (drawn.empty()) return no_data(spec.label);
  bool log = spec.log_y_if_wide && y0 > 0 && y1 > 10 * y0;
  double legend_height = 0;
  std::string legend = legend_svg(drawn, spec.width, legend_height);
  Frame f = make_frame(spec, make_axis(x0, x1, false, false), make_axis(y0, y1, log, true), legend_height);
  std::string marks;
  for (const Series& s : drawn) {
    const char* color = kPalette[s.color % std::size(kPalette)];
    if (s.xs.size() == 1) {
      marks += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)", f.px(s.xs[0]), f.py(s.ys[0]), color);
      continue;
    }
    marks += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5"{} points=")", color,
                         s.dashed ? R"( stroke-dasharray="5 3")" : "");
    for (size_t k = 0; k < s.xs.size(); ++k) marks += fmt::format("{}{:.1f},{:.1f}", k ? " " : "", f.px(s.xs[k]), f.py(s.ys[k]));
    marks += R"("/>)";
  }
  return plot_svg(f, spec, legend, marks, static_cast<int>(drawn.size()), points);
}

// A histogram of `heights` (bar b covers x in [b, b+1) * x_max / bars),
// with a y axis from 0; spec.series is unused. The bars are one filled
// outline, not a rect each: adjacent anti-aliased rects leave hairline
// seams between them, and the outline is a third of the bytes.
std::string bar_chart(const PlotSpec& spec, const std::vector<double>& heights, double x_max) {
  if (heights.empty()) return no_data(spec.label);
  double top = std::min(*std::max_element(heights.begin(), heights.end()), kMaxPlotted);
  // All-zero counts still get an axis from 0 up, not one centred on 0.
  Frame f = make_frame(spec, make_axis(0, x_max, false, false), make_axis(0, top > 0 ? top : 1, false, true), 0);
  double n = static_cast<double>(heights.size());
  std::string marks = fmt::format(R"(<polygon fill="{}" points="{:.1f},{:.1f})", kPalette[0], f.px(0), f.bottom);
  for (size_t b = 0; b < heights.size(); ++b) {
    double y = f.py(std::clamp(heights[b], 0.0, kMaxPlotted));
    marks += fmt::format(" {:.1f},{:.1f} {:.1f},{:.1f}", f.px(b * x_max / n), y, f.px((b + 1) * x_max / n), y);
  }
  marks += fmt::format(R"( {:.1f},{:.1f}"/>)", f.px(x_max), f.bottom);
  return plot_svg(f, spec, "", marks, 1, static_cast<int>(heights.size()));
}

// ---- the run's files ------------------------------------------------------

// What the report reads and embeds, it reads only from regular files inside
// the run directory: a symbolic link (clips/x.wav -> ~/secret.txt) or a
// path that leads out of the directory would put another file's bytes into
// a page that is meant to be sent to people. nullopt where nothing is
// there; an Error where something is there that is not such a file.
std::optional<std::string> run_file(const fs::path& dir, const fs::path& relative) {
  const fs::path p = dir / relative;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (!fs::exists(st)) return std::nullopt;
  VQDDP_CHECK(!fs::is_symlink(st), "{}: is a symbolic link; the report embeds only regular files of the run "
              "directory, never what a link points to", p.string());
  VQDDP_CHECK(fs::is_regular_file(st), "{}: is not a regular file", p.string());
  const fs::path root = fs::canonical(dir, ec), real = fs::canonical(p, ec);
  const auto [end, _] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  VQDDP_CHECK(!ec && end == root.end(), "{}: lies outside the run directory {} (through a linked directory); the "
              "report embeds only files inside it", p.string(), dir.string());
  return p.string();
}

std::string require_run_file(const fs::path& dir, const char* name, const char* when) {
  std::optional<std::string> p = run_file(dir, name);
  VQDDP_CHECK(p.has_value(), "{}: not found: {} is written by vqddp train {} (is {} a run directory?)",
              (dir / name).string(), name, when, dir.string());
  return *p;
}

json read_json_object(const std::string& path, const char* what) {
  json j = json::parse(read_file(path, int64_t{1} << 30, what), nullptr, false);
  VQDDP_CHECK(j.is_object(), "{}: malformed: not a JSON object", path);
  return j;
}

// The lines of metrics.jsonl (train/run_record.h), split into training and
// validation lines, each kind in step order.
struct Metrics {
  std::vector<TrainLine> train;
  std::vector<ValidationLine> validation;
  int64_t last_step = 0;
};

Metrics read_metrics(const std::string& path) {
  std::string text = read_file(path, int64_t{1} << 30, "a metrics log");
  Metrics m;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.find('\n', pos), text.size());
    json line = json::parse(std::string_view(text).substr(pos, end - pos), nullptr, false);
    pos = end + 1;
    // A line without a step (cut off by a kill, or not a metrics line) is neither.
    if (auto v = validation_line_from_json(line)) {
      m.last_step = std::max(m.last_step, v->step);
      m.validation.push_back(std::move(*v));
    } else if (auto t = train_line_from_json(line)) {
      m.last_step = std::max(m.last_step, t->step);
      m.train.push_back(std::move(*t));
    }
  }
  VQDDP_CHECK(!m.train.empty() || !m.validation.empty(),
              "{}: no usable line (each is a JSON object with a \"step\"): has the run logged its first step?", path);
  auto by_step = [](const auto& a, const auto& b) { return a.step < b.step; };
  std::stable_sort(m.train.begin(), m.train.end(), by_step);
  std::stable_sort(m.validation.begin(), m.validation.end(), by_step);
  return m;
}

// A series of `get(line)` against step over `lines`, skipping lines without it.
template <class Line, class Get>
Series collect(const std::vector<Line>& lines, std::string name, Get get, bool dashed = false, int color = -1) {
  Series s{std::move(name), {}, {}, dashed, color};
  for (const Line& line : lines) {
    if (std::optional<double> v = get(line)) {
      s.xs.push_back(static_cast<double>(line.step));
      s.ys.push_back(*v);
    }
  }
  return s;
}

// Layer i's statistic `stat` of a line, when the line has that layer.
template <class Line>
std::optional<double> layer_stat(const Line& line, size_t i, bool perplexity) {
  if (i >= line.layers.size()) return std::nullopt;
  const LayerUse& u = line.layers[i];
  if (perplexity) return u.perplexity;
  if (u.codes_used) return static_cast<double>(*u.codes_used);
  return std::nullopt;
}

size_t layer_count(const Metrics& m) {
  size_t n = 0;
  for (const TrainLine& l : m.train) n = std::max(n, l.layers.size());
  for (const ValidationLine& l : m.validation) n = std::max(n, l.layers.size());
  return n;
}

// ---- sections -------------------------------------------------------------

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1000px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.1em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.dir{color:#666;font-family:ui-monospace,monospace;margin-top:0}
table{border-collapse:collapse}th,td{padding:.3em .9em .3em 0;text-align:left;border-bottom:1px solid #eee;vertical-align:middle}
th{font-weight:600;color:#444}
.row{display:flex;flex-wrap:wrap;gap:8px 16px}figure{margin:0 0 1em}figcaption{font-size:.9em;color:#555}
svg.plot{display:block;max-width:100%;height:auto}svg.plot text{font-size:11px;fill:#333}
svg.plot .grid{stroke:#ececec}svg.plot .frame{fill:none;stroke:#aaa}
.note{color:#777;font-style:italic}
pre{background:#f6f8fa;padding:1em;overflow:auto;font-size:.85em;border-radius:4px}
)";

std::string facts_section(const fs::path& dir, const RunFacts& run, const Metrics& m) {
  auto fact = [](const auto& v) { return v ? num(static_cast<double>(*v)) : std::string("unknown"); };
  auto row = [](const char* name, const std::string& value) { return fmt::format("<tr><th>{}</th><td>{}</td></tr>", name, value); };
  auto text = [](const std::string& v) { return v.empty() ? std::string("unknown") : v; };
  std::string out = "<h1>vqddp run report</h1>" + fmt::format(R"(<p class="dir">{}</p><table class="facts">)", esc(dir.string()));
  out += row("description", esc(text(run.description)));
  out += row("ranks", fmt::format("{} ({} backend, {})", fact(run.world_size), esc(text(run.backend)), esc(text(run.device))));
  out += row("steps done", fmt::format("{} of {}", num(static_cast<double>(m.last_step)), fact(run.total_steps)));
  out += row("bits per example", fact(run.bits_per_example));
  if (run.sample_rate.value_or(0) > 0 && run.bitrate)
    out += row("bitrate", fmt::format("{} kbit/s at {} Hz", num(*run.bitrate / 1000), fact(run.sample_rate)));
  std::string sizes;
  for (int64_t k : run.layer_sizes) sizes += (sizes.empty() ? "" : ", ") + (k > 0 ? num(static_cast<double>(k)) : "?");
  out += row("codebook sizes", sizes.empty() ? "unknown" : sizes);
  std::string final = "none yet";
  if (!m.validation.empty()) {
    const ValidationLine& v = m.validation.back();
    final = fmt::format("step {}:", num(static_cast<double>(v.step)));
    for (const auto& [x, name, unit] : {std::tuple{v.mse, "MSE", ""}, std::tuple{v.snr_db, "SNR", " dB"},
                                        std::tuple{v.stoi, "STOI", ""}, std::tuple{v.log_mel_l1, "log-mel L1", ""},
                                        std::tuple{v.stft_distance, "MR-STFT distance", ""}})
      if (x) final += fmt::format(" {} {}{},", name, num(*x), unit);
    final.pop_back();
  }
  return out + row("final validation", final) + "</table>";
}

std::string training_sections(const Metrics& m) {
  auto quantizer = [](const TrainLine& l) -> std::optional<double> {
    if (l.quantizer) return l.quantizer;
    if (!l.loss || !l.recon || l.adversarial) return std::nullopt;  // older lines: what else the loss held
    return *l.loss - *l.recon;
  };
  std::string out = "<h2>Training loss</h2>";
  out += line_plot({.label = "training loss",
                    .x_title = "step",
                    .y_title = "loss",
                    .series = {collect(m.train, "loss", [](const TrainLine& l) { return l.loss; }),
                               collect(m.train, "recon", [](const TrainLine& l) { return l.recon; }),
                               collect(m.train, "quantizer", quantizer)},
                    .log_y_if_wide = true});
  if (std::any_of(m.train.begin(), m.train.end(), [](const TrainLine& l) { return l.adversarial.has_value(); })) {
    out += "<h2>Adversarial losses</h2>";
    out += line_plot({.label = "adversarial losses",
                      .x_title = "step",
                      .y_title = "loss",
                      .series = {collect(m.train, "discriminators", [](const TrainLine& l) { return l.discriminator; }),
                                 collect(m.train, "codec: adversarial", [](const TrainLine& l) { return l.adversarial; }),
                                 collect(m.train, "codec: feature matching", [](const TrainLine& l) { return l.feature; })}});
  }
  out += "<h2>Learning rate</h2>";
  Series lr = collect(m.train, "learning rate", [](const TrainLine& l) { return l.lr; });
  out += lr.xs.empty() ? R"(<p class="note">no "lr" in metrics.jsonl (the run predates its logging)</p>)"
                       : line_plot({.label = "learning rate", .x_title = "step", .y_title = "learning rate", .series = {lr}});
  out += "<h2>Validation</h2>";
  if (m.validation.empty()) return out + R"(<p class="note">no validation lines in metrics.jsonl yet</p>)";
  out += R"(<div class="row">)";
  using Field = std::optional<double> ValidationLine::*;
  auto small = [&](const char* label, Field field, const char* y_title, bool log_if_wide) {
    return line_plot({.label = label,
                      .x_title = "step",
                      .y_title = y_title,
                      .series = {collect(m.validation, y_title, [field](const ValidationLine& l) { return l.*field; })},
                      .log_y_if_wide = log_if_wide,
                      .width = 320,
                      .height = 220});
  };
  out += small("validation SNR", &ValidationLine::snr_db, "SNR (dB)", false);
  if (std::any_of(m.validation.begin(), m.validation.end(), [](const ValidationLine& l) { return l.stoi.has_value(); }))
    out += small("validation STOI", &ValidationLine::stoi, "STOI", false);
  if (std::any_of(m.validation.begin(), m.validation.end(), [](const ValidationLine& l) { return l.log_mel_l1.has_value(); }))
    out += small("validation log-mel L1", &ValidationLine::log_mel_l1, "log-mel L1", false);
  if (std::any_of(m.validation.begin(), m.validation.end(), [](const ValidationLine& l) { return l.stft_distance.has_value(); }))
    out += small("validation MR-STFT distance", &ValidationLine::stft_distance, "MR-STFT distance", false);
  return out + small("validation MSE", &ValidationLine::mse, "MSE", true) + "</div>";
}

// Per layer: training values solid, validation dashed in the layer's colour.
std::string codebook_section(const Metrics& m) {
  std::string out = "<h2>Codebook use over time</h2>";
  size_t layers = layer_count(m);
  for (const auto& [is_perplexity, y_title] : {std::pair{true, "perplexity"}, std::pair{false, "codes used"}}) {
    const bool perplexity = is_perplexity;  // a plain variable for the lambdas below to capture
    PlotSpec spec{.label = fmt::format("{} per layer", y_title), .x_title = "step", .y_title = y_title};
    for (size_t i = 0; i < layers; ++i) {
      int c = static_cast<int>(i);
      spec.series.push_back(collect(m.train, fmt::format("layer {}", i),
                                    [&](const TrainLine& l) { return layer_stat(l, i, perplexity); }, false, c));
      spec.series.push_back(collect(m.validation, fmt::format("layer {}, validation", i),
                                    [&](const ValidationLine& l) { return layer_stat(l, i, perplexity); }, true, c));
    }
    out += line_plot(spec);
  }
  return out;
}

// Rank-frequency plots: sorted by count, a codebook's skew (a few codes
// doing all the work, a tail of dead ones) shows at a glance, as it does
// not in index order.
std::string usage_section(const fs::path& dir) {
  std::string out = "<h2>Code usage at the last validation</h2>";
  std::optional<std::string> found = run_file(dir, "code_usage.json");
  if (!found) return out + R"(<p class="note">no code_usage.json (written at each validation)</p>)";
  const std::string& path = *found;
  const CodeUsage usage = code_usage_from_json(read_json_object(path, "a code usage file"), path);
  out += fmt::format("<p>At step {}.</p>", num(static_cast<double>(usage.step)));
  out += R"(<div class="row">)";
  for (size_t i = 0; i < usage.counts.size(); ++i) {
    std::vector<double> counts(usage.counts[i].begin(), usage.counts[i].end());
    std::sort(counts.begin(), counts.end(), std::greater<>());
    double total = 0, entropy = 0;
    int used = 0;
    for (double c : counts) {
      if (c <= 0) continue;
      total += c;
      ++used;
    }
    for (double c : counts)
      if (c > 0) entropy -= c / total * std::log(c / total);
    size_t k = counts.size(), bars = std::min<size_t>(k, kMaxBars);
    std::vector<double> heights(bars, 0);  // mean count of the codes in each bar
    for (size_t b = 0; b < bars; ++b) {
      size_t from = b * k / bars, to = (b + 1) * k / bars;
      for (size_t c = from; c < to; ++c) heights[b] += counts[c] / static_cast<double>(to - from);
    }
    std::string label = fmt::format("layer {} code counts", i);
    out += fmt::format("<figure>{}<figcaption>layer {}: {} of {} codes used, perplexity {}{}</figcaption></figure>",
                       bar_chart({.label = label,
                                  .x_title = bars < k ? "code rank (mean per bin)" : "code rank",
                                  .y_title = "count",
                                  .width = 480,
                                  .height = 220},
                                 heights, static_cast<double>(k)),
                       i, used, num(static_cast<double>(k)),
                       total > 0 ? num(std::exp(entropy)) : "undefined", total > 0 ? "" : " (no counts)");
  }
  return out + "</div>";
}

std::string clips_section(const fs::path& dir) {
  std::string out = "<h2>Held-out clips</h2>", rows;
  for (int i = 0; i < 4; ++i) {
    std::optional<std::string> original = run_file(dir, fs::path("clips") / fmt::format("clip_{}_original.wav", i));
    std::optional<std::string> decoded = run_file(dir, fs::path("clips") / fmt::format("clip_{}_decoded.wav", i));
    if (!original || !decoded) continue;
    auto player = [](const std::string& p) {
      return fmt::format(R"(<audio controls preload="metadata" src="data:audio/wav;base64,{}"></audio>)",
                         base64(read_file(p, int64_t{64} << 20, "a clip")));
    };
    rows += fmt::format("<tr><td>clip {}</td><td>{}</td><td>{}</td></tr>", i, player(*original), player(*decoded));
  }
  if (rows.empty()) return out + R"(<p class="note">no clips (audio runs write them at validation)</p>)";
  return out + "<table><tr><th></th><th>original</th><th>decoded</th></tr>" + rows + "</table>";
}

}  // namespace

std::string render_report(const std::string& run_dir) {
  fs::path dir(run_dir);
  const std::string run_path = require_run_file(dir, "run.json", "when a run starts");
  const RunFacts run = run_facts_from_json(read_json_object(run_path, "a run description"), run_path);
  Metrics m = read_metrics(require_run_file(dir, "metrics.jsonl", "as the run trains"));
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>vqddp run report: {}</title>"
      "<style>{}</style></head><body>\n",
      esc(dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string()), kStyle);
  out += facts_section(dir, run, m) + "\n" + training_sections(m) + "\n" + codebook_section(m) + "\n";
  out += usage_section(dir) + "\n" + clips_section(dir) + "\n<h2>Config</h2>";
  out += !run.config.is_null() ? "<pre>" + esc(run.config.dump(2)) + "</pre>" : R"(<p class="note">no config in run.json</p>)";
  return out + "\n</body></html>\n";
}

std::string write_report(const std::string& run_dir) {
  std::string path = (fs::path(run_dir) / "report.html").string();
  write_file_atomic(path, render_report(run_dir));
  return path;
}

}  // namespace vqddp
