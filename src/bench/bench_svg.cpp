// Hand-written SVG for a bench run (see bench_svg.h): TTFT vs prompt length and decode tok/s vs
// context depth, one series per configuration, axes with ticks, and a legend; over several
// --gpu-layers values, the offload cliff below them (bench_cliff.h).
#include "bench/bench_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <vector>

#include "bench/bench_cliff.h"
#include "core/error.h"
#include "runtime/placement.h"

namespace nf4flash {

namespace {

constexpr int kPanelW = 480, kPanelH = 360, kTitleH = 34;
constexpr int kMl = 72, kMr = 20, kMt = 36, kMb = 52;  // plot margins inside a panel
constexpr int kLegendRowH = 18;
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char* const kDashes[] = {"", "6,3", "2,2", "8,3,2,3"};

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string tick_label(double v) {
  char b[32];
  if (v >= 1000 && std::fmod(v, 1024) == 0 && v >= 4096) std::snprintf(b, sizeof b, "%.0fk", v / 1024);
  else if (std::fabs(v) >= 100 || v == std::floor(v)) std::snprintf(b, sizeof b, "%.0f", v);
  else if (std::fabs(v) >= 1) std::snprintf(b, sizeof b, "%.1f", v);
  else std::snprintf(b, sizeof b, "%.2g", v);
  return b;
}

double nice_ceil(double v) {  // 1, 2, 2.5, 5 x 10^k at or above v
  if (v <= 0) return 1;
  const double e = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * e >= v * (1 - 1e-9)) return m * e;
  return 10 * e;
}

struct Point {
  double x, y, lo, hi;
  std::string note;  // the marker's tooltip ("" : "x: y")
};
// <g class="cls" attr="key" stroke=color fill=color><title>title</title> polyline, whiskers, markers</g>
struct Series {
  std::string cls, attr, key, title, color, dash;
  std::vector<Point> pts;
};

// A configuration's series: colored by its index, dashed when the cache is off.
Series config_series(const ConfigResult& c) {
  const int k = c.config.index;
  return {"series",          "data-config", std::to_string(k), cat(k, ": ", c.config.label()), kColors[(k - 1) % 10],
          !c.config.use_cache ? "5,4" : kDashes[((k - 1) / 10) % 4], {}};
}

// x: ticks at the measured values on a log2 scale past 4x (default), or a fixed linear range with
// fixed ticks; y: from 0, or log10 when the values span more than log_y_over (0: never).
struct Axes {
  bool fixed_x = false;
  double x_lo = 0, x_hi = 1;
  std::vector<double> x_ticks;
  std::string x_suffix;  // appended to the x tick labels
  double log_y_over = 0;
};

class Panel {
 public:
  Panel(int x0, int y0, std::string title, std::string xlabel, std::string ylabel, std::vector<Series> series,
        Axes axes = {})
      : x0_(x0), y0_(y0), title_(std::move(title)), xlabel_(std::move(xlabel)), ylabel_(std::move(ylabel)),
        series_(std::move(series)), axes_(std::move(axes)) {
    std::set<double> xs;
    double ymax = 0, ymin = 0;
    for (const Series& s : series_)
      for (const Point& p : s.pts) {
        xs.insert(p.x);
        ymax = std::max(ymax, std::max(p.y, p.hi));
        for (double v : {p.y, p.lo})
          if (v > 0 && (ymin == 0 || v < ymin)) ymin = v;
      }
    xs_.assign(xs.begin(), xs.end());
    ymax_ = nice_ceil(ymax * 1.05);
    log_x_ = !axes_.fixed_x && xs_.size() >= 2 && xs_.front() > 0 && xs_.back() / xs_.front() > 4;
    log_y_ = axes_.log_y_over > 0 && ymin > 0 && ymax / ymin > axes_.log_y_over;
    if (log_y_) {
      ylo_ = std::pow(10.0, std::floor(std::log10(ymin)));
      ymax_ = std::pow(10.0, std::ceil(std::log10(ymax)));
      if (ymax_ <= ylo_) ymax_ = ylo_ * 10;
    }
  }

  void draw(std::ostringstream& o) const {
    const int pl = x0_ + kMl, pr = x0_ + kPanelW - kMr, pt = y0_ + kMt, pb = y0_ + kPanelH - kMb;
    o << "<g class=\"panel\">\n";
    o << "<text x=\"" << x0_ + kPanelW / 2 << "\" y=\"" << y0_ + 20
      << "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" << xml_escape(title_) << "</text>\n";
    // grid + y ticks
    for (double v : y_ticks()) {
      const double y = py(v);
      o << "<line x1=\"" << pl << "\" y1=\"" << fmt(y) << "\" x2=\"" << pr << "\" y2=\"" << fmt(y)
        << "\" stroke=\"#e0e0e0\"/>\n";
      o << "<text x=\"" << pl - 6 << "\" y=\"" << fmt(y + 4) << "\" text-anchor=\"end\">" << tick_label(v)
        << "</text>\n";
    }
    // x ticks at the measured values (or the fixed ones)
    for (double v : axes_.fixed_x ? axes_.x_ticks : xs_) {
      const double x = px(v);
      o << "<line x1=\"" << fmt(x) << "\" y1=\"" << pb << "\" x2=\"" << fmt(x) << "\" y2=\"" << pb + 5
        << "\" stroke=\"#333\"/>\n";
      o << "<text x=\"" << fmt(x) << "\" y=\"" << pb + 18 << "\" text-anchor=\"middle\">" << tick_label(v)
        << axes_.x_suffix << "</text>\n";
    }
    // axes
    o << "<line x1=\"" << pl << "\" y1=\"" << pb << "\" x2=\"" << pr << "\" y2=\"" << pb << "\" stroke=\"#333\"/>\n";
    o << "<line x1=\"" << pl << "\" y1=\"" << pt << "\" x2=\"" << pl << "\" y2=\"" << pb << "\" stroke=\"#333\"/>\n";
    o << "<text x=\"" << (pl + pr) / 2 << "\" y=\"" << pb + 38 << "\" text-anchor=\"middle\">" << xml_escape(xlabel_)
      << (log_x_ ? " (log scale)" : "") << "</text>\n";
    o << "<text x=\"" << x0_ + 16 << "\" y=\"" << (pt + pb) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 "
      << x0_ + 16 << " " << (pt + pb) / 2 << ")\">" << xml_escape(ylabel_) << (log_y_ ? " (log scale)" : "")
      << "</text>\n";
    if (series_.empty())
      o << "<text x=\"" << (pl + pr) / 2 << "\" y=\"" << (pt + pb) / 2
        << "\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n";
    for (const Series& s : series_) draw_series(o, s);
    o << "</g>\n";
  }

 private:
  double px(double v) const {
    const int pl = x0_ + kMl, pr = x0_ + kPanelW - kMr;
    const double pad = 24;
    double t;
    if (axes_.fixed_x) t = (v - axes_.x_lo) / (axes_.x_hi - axes_.x_lo);
    else if (xs_.size() < 2) return (pl + pr) / 2.0;
    else if (log_x_) t = (std::log2(v) - std::log2(xs_.front())) / (std::log2(xs_.back()) - std::log2(xs_.front()));
    else t = (v - xs_.front()) / (xs_.back() - xs_.front());
    return pl + pad + t * (pr - pl - 2 * pad);
  }
  double py(double v) const {
    const int pt = y0_ + kMt, pb = y0_ + kPanelH - kMb;
    if (log_y_) {
      const double l = std::log10(std::max(v, ylo_));
      return pb - (l - std::log10(ylo_)) / (std::log10(ymax_) - std::log10(ylo_)) * (pb - pt);
    }
    return pb - (v / ymax_) * (pb - pt);
  }

  // linear: 0 to ymax in fifths; log: each decade, with 2x and 5x when it spans at most two decades
  std::vector<double> y_ticks() const {
    std::vector<double> t;
    if (!log_y_) {
      for (int i = 0; i <= 5; ++i) t.push_back(ymax_ * i / 5);
      return t;
    }
    const bool fine = ymax_ / ylo_ <= 100 * (1 + 1e-9);
    for (double d = ylo_; d <= ymax_ * (1 + 1e-9); d *= 10) {
      t.push_back(d);
      if (fine && d * 10 <= ymax_ * (1 + 1e-9)) {
        t.push_back(2 * d);
        t.push_back(5 * d);
      }
    }
    return t;
  }

  void draw_series(std::ostringstream& o, const Series& s) const {
    const std::string& color = s.color;
    const std::string& dash = s.dash;
    o << "<g class=\"" << s.cls << "\" " << s.attr << "=\"" << xml_escape(s.key) << "\" stroke=\"" << color
      << "\" fill=\"" << color << "\">\n";
    o << "<title>" << xml_escape(s.title) << "</title>\n";
    if (s.pts.size() >= 2) {
      o << "<polyline fill=\"none\" stroke-width=\"2\"" << (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"")
        << " points=\"";
      for (size_t i = 0; i < s.pts.size(); ++i) o << (i ? " " : "") << fmt(px(s.pts[i].x)) << "," << fmt(py(s.pts[i].y));
      o << "\"/>\n";
    }
    for (const Point& p : s.pts) {
      const double x = px(p.x);
      if (p.hi > p.lo)
        o << "<line x1=\"" << fmt(x) << "\" y1=\"" << fmt(py(p.lo)) << "\" x2=\"" << fmt(x) << "\" y2=\""
          << fmt(py(p.hi)) << "\" stroke-width=\"1\"/>\n";
      o << "<circle cx=\"" << fmt(x) << "\" cy=\"" << fmt(py(p.y)) << "\" r=\"3.5\"><title>"
        << (p.note.empty() ? tick_label(p.x) + ": " + tick_label(p.y) : xml_escape(p.note)) << "</title></circle>\n";
    }
    o << "</g>\n";
  }

  int x0_, y0_;
  std::string title_, xlabel_, ylabel_;
  std::vector<Series> series_;
  Axes axes_;
  std::vector<double> xs_;
  double ymax_ = 1, ylo_ = 1;  // ylo_: the bottom of a log y axis
  bool log_x_ = false, log_y_ = false;
};

// Rows the cliff's quant legend takes; 0 when there is no cliff (one --gpu-layers value).
int cliff_legend_rows(const BenchResult& r) {
  return r.spec.gpu_layers.size() > 1 ? static_cast<int>(r.spec.quants.size() + 1) / 2 : 0;
}

// The offload cliff from y0 down: decode tok/s and TTFT against the percentage of the weights on the
// CPU backend, one series per quant (<g class="cliff-series" data-quant="nf4 dq">), log y axes past
// 20x, and a legend of the quants.
void draw_cliff(std::ostringstream& o, const BenchResult& r, int y0) {
  const BenchCliff cl = bench_cliff(r);
  std::vector<Series> dec, ttft;
  std::vector<bool> ok(cl.quants.size(), false);
  for (size_t qi = 0; qi < cl.quants.size(); ++qi) {
    const std::string& name = cl.quants[qi].name;
    Series d{"cliff-series", "data-quant", name, name, kColors[qi % 10], "", {}};
    Series t = d;
    for (size_t row = 0; row < cl.gpu_layers.size(); ++row) {
      const CliffCell& c = cl.cells[row][qi];
      if (!c.config || std::isnan(c.offloaded)) continue;
      const double x = 100.0 * c.offloaded;
      const std::string at = cat(name, ", GPU layers ", cl.row_label(row), ", ", fmt(x), "% offloaded: ");
      if (c.decode && c.decode->error.empty() && !c.decode->tok_s.runs.empty()) {
        const BenchStat& st = c.decode->tok_s;
        d.pts.push_back({x, st.median, st.min, st.max, at + tick_label(st.median) + " tok/s"});
      }
      if (c.prefill && c.prefill->error.empty() && !c.prefill->ttft_ms.runs.empty()) {
        const BenchStat& st = c.prefill->ttft_ms;
        t.pts.push_back({x, st.median, st.min, st.max, at + tick_label(st.median) + " ms"});
      }
    }
    for (Series* s : {&d, &t})
      std::stable_sort(s->pts.begin(), s->pts.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
    ok[qi] = !d.pts.empty() || !t.pts.empty();
    if (!d.pts.empty()) dec.push_back(d);
    if (!t.pts.empty()) ttft.push_back(t);
  }
  Axes ax;
  ax.fixed_x = true;
  ax.x_lo = 0;
  ax.x_hi = 100;
  ax.x_ticks = {0, 25, 50, 75, 100};
  ax.x_suffix = "%";
  ax.log_y_over = 20;
  const std::string xlabel = "weights offloaded to the CPU backend";
  o << "<g class=\"cliff\">\n";
  Panel(0, y0, cat("Offload cliff: decode speed (", std::max(0, r.spec.n_gen - 1), " tokens @ ctx ", cl.depth, ")"),
        xlabel, "decode tokens/s (higher is better)", dec, ax)
      .draw(o);
  Panel(kPanelW, y0, cat("Offload cliff: time to first token (", cl.prompt, " tokens)"), xlabel,
        "TTFT (ms, lower is better)", ttft, ax)
      .draw(o);
  o << "<g class=\"cliff-legend\">\n";
  const int ly0 = y0 + kPanelH + 16;
  for (size_t qi = 0; qi < cl.quants.size(); ++qi) {
    const int lx = static_cast<int>(qi % 2) * kPanelW + 24, ly = ly0 + static_cast<int>(qi / 2) * kLegendRowH;
    const std::string color = ok[qi] ? kColors[qi % 10] : "#999999";
    o << "<g class=\"cliff-legend-item\" data-quant=\"" << xml_escape(cl.quants[qi].name) << "\">";
    o << "<line x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 24 << "\" y2=\"" << ly << "\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>";
    o << "<text x=\"" << lx + 30 << "\" y=\"" << ly + 4 << "\"" << (ok[qi] ? "" : " fill=\"#999999\"") << ">quant "
      << xml_escape(cl.quants[qi].name) << (ok[qi] ? "" : " (error)") << "</text></g>\n";
  }
  o << "</g>\n</g>\n";
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (c < 0x20 && c != '\n' && c != '\t') o += ' ';  // not allowed in XML 1.0
        else o += static_cast<char>(c);
    }
  }
  return o;
}

std::string bench_svg(const BenchResult& r, const std::string& title) {
  std::vector<Series> ttft, dec;
  for (const ConfigResult& c : r.configs) {
    if (!c.error.empty()) continue;
    Series a = config_series(c);
    Series b = a;
    for (const PrefillCell& p : c.prefill)
      if (p.error.empty() && !p.ttft_ms.runs.empty())
        a.pts.push_back({double(p.prompt), p.ttft_ms.median, p.ttft_ms.min, p.ttft_ms.max, {}});
    for (const DecodeCell& d : c.decode)
      if (d.error.empty() && !d.tok_s.runs.empty())
        b.pts.push_back({double(d.ctx), d.tok_s.median, d.tok_s.min, d.tok_s.max, {}});
    std::sort(a.pts.begin(), a.pts.end(), [](const Point& x, const Point& y) { return x.x < y.x; });
    std::sort(b.pts.begin(), b.pts.end(), [](const Point& x, const Point& y) { return x.x < y.x; });
    if (!a.pts.empty()) ttft.push_back(a);
    if (!b.pts.empty()) dec.push_back(b);
  }
  const int n_legend = static_cast<int>(r.configs.size());
  const int legend_rows = (n_legend + 1) / 2;
  const int main_h = kTitleH + kPanelH + 16 + legend_rows * kLegendRowH + 12;
  const int cliff_rows = cliff_legend_rows(r);
  const int width = 2 * kPanelW, height = main_h + (cliff_rows > 0 ? kPanelH + 16 + cliff_rows * kLegendRowH + 12 : 0);
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << width << " " << height << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o << "<title>" << xml_escape(title) << "</title>\n";
  o << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height << "\" fill=\"#ffffff\"/>\n";
  o << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">"
    << xml_escape(title) << "</text>\n";
  Panel(0, kTitleH, "Time to first token", "prompt length (tokens)", "TTFT (ms, lower is better)", ttft).draw(o);
  Panel(kPanelW, kTitleH, cat("Decode speed (", std::max(0, r.spec.n_gen - 1), " tokens, first excluded)"),
        "context depth (tokens)", "decode tokens/s (higher is better)", dec)
      .draw(o);
  o << "<g class=\"legend\">\n";
  const int ly0 = kTitleH + kPanelH + 16;
  for (int i = 0; i < n_legend; ++i) {
    const ConfigResult& c = r.configs[i];
    const int k = c.config.index;
    const int lx = (i % 2) * kPanelW + 24, ly = ly0 + (i / 2) * kLegendRowH;
    const bool ok = c.error.empty();
    const std::string color = ok ? kColors[(k - 1) % 10] : "#999999";
    const std::string dash = !c.config.use_cache ? "5,4" : kDashes[((k - 1) / 10) % 4];
    o << "<g class=\"legend-item\" data-config=\"" << k << "\">";
    o << "<line x1=\"" << lx << "\" y1=\"" << ly << "\" x2=\"" << lx + 24 << "\" y2=\"" << ly << "\" stroke=\"" << color
      << "\" stroke-width=\"2\"" << (dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"") << "/>";
    o << "<text x=\"" << lx + 30 << "\" y=\"" << ly + 4 << "\"" << (ok ? "" : " fill=\"#999999\"") << ">" << k << ": "
      << xml_escape(c.config.label()) << (ok ? "" : " (error)") << "</text></g>\n";
  }
  o << "</g>\n";
  if (cliff_rows > 0) draw_cliff(o, r, main_h);
  o << "</svg>\n";
  return o.str();
}

}  // namespace nf4flash
