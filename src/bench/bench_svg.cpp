// Hand-written SVG for a bench run (see bench_svg.h): TTFT vs prompt length and decode tok/s vs
// context depth, one series per configuration, axes with ticks, and a legend.
#include "bench/bench_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

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
};
struct Series {
  int config = 0;
  std::string label;
  bool dashed = false;
  std::vector<Point> pts;
};

class Panel {
 public:
  Panel(int x0, int y0, std::string title, std::string xlabel, std::string ylabel, std::vector<Series> series)
      : x0_(x0), y0_(y0), title_(std::move(title)), xlabel_(std::move(xlabel)), ylabel_(std::move(ylabel)),
        series_(std::move(series)) {
    std::set<double> xs;
    double ymax = 0;
    for (const Series& s : series_)
      for (const Point& p : s.pts) {
        xs.insert(p.x);
        ymax = std::max(ymax, std::max(p.y, p.hi));
      }
    xs_.assign(xs.begin(), xs.end());
    ymax_ = nice_ceil(ymax * 1.05);
    log_x_ = xs_.size() >= 2 && xs_.front() > 0 && xs_.back() / xs_.front() > 4;
  }

  void draw(std::ostringstream& o) const {
    const int pl = x0_ + kMl, pr = x0_ + kPanelW - kMr, pt = y0_ + kMt, pb = y0_ + kPanelH - kMb;
    o << "<g class=\"panel\">\n";
    o << "<text x=\"" << x0_ + kPanelW / 2 << "\" y=\"" << y0_ + 20
      << "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" << xml_escape(title_) << "</text>\n";
    // grid + y ticks
    for (int i = 0; i <= 5; ++i) {
      const double v = ymax_ * i / 5;
      const double y = py(v);
      o << "<line x1=\"" << pl << "\" y1=\"" << fmt(y) << "\" x2=\"" << pr << "\" y2=\"" << fmt(y)
        << "\" stroke=\"#e0e0e0\"/>\n";
      o << "<text x=\"" << pl - 6 << "\" y=\"" << fmt(y + 4) << "\" text-anchor=\"end\">" << tick_label(v)
        << "</text>\n";
    }
    // x ticks at the measured values
    for (double v : xs_) {
      const double x = px(v);
      o << "<line x1=\"" << fmt(x) << "\" y1=\"" << pb << "\" x2=\"" << fmt(x) << "\" y2=\"" << pb + 5
        << "\" stroke=\"#333\"/>\n";
      o << "<text x=\"" << fmt(x) << "\" y=\"" << pb + 18 << "\" text-anchor=\"middle\">" << tick_label(v)
        << "</text>\n";
    }
    // axes
    o << "<line x1=\"" << pl << "\" y1=\"" << pb << "\" x2=\"" << pr << "\" y2=\"" << pb << "\" stroke=\"#333\"/>\n";
    o << "<line x1=\"" << pl << "\" y1=\"" << pt << "\" x2=\"" << pl << "\" y2=\"" << pb << "\" stroke=\"#333\"/>\n";
    o << "<text x=\"" << (pl + pr) / 2 << "\" y=\"" << pb + 38 << "\" text-anchor=\"middle\">" << xml_escape(xlabel_)
      << (log_x_ ? " (log scale)" : "") << "</text>\n";
    o << "<text x=\"" << x0_ + 16 << "\" y=\"" << (pt + pb) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 "
      << x0_ + 16 << " " << (pt + pb) / 2 << ")\">" << xml_escape(ylabel_) << "</text>\n";
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
    if (xs_.size() < 2) return (pl + pr) / 2.0;
    double t;
    if (log_x_) t = (std::log2(v) - std::log2(xs_.front())) / (std::log2(xs_.back()) - std::log2(xs_.front()));
    else t = (v - xs_.front()) / (xs_.back() - xs_.front());
    return pl + pad + t * (pr - pl - 2 * pad);
  }
  double py(double v) const {
    const int pt = y0_ + kMt, pb = y0_ + kPanelH - kMb;
    return pb - (v / ymax_) * (pb - pt);
  }

  void draw_series(std::ostringstream& o, const Series& s) const {
    const std::string color = kColors[(s.config - 1) % 10];
    const std::string dash = s.dashed ? "5,4" : kDashes[((s.config - 1) / 10) % 4];
    o << "<g class=\"series\" data-config=\"" << s.config << "\" stroke=\"" << color << "\" fill=\"" << color << "\">\n";
    o << "<title>" << s.config << ": " << xml_escape(s.label) << "</title>\n";
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
      o << "<circle cx=\"" << fmt(x) << "\" cy=\"" << fmt(py(p.y)) << "\" r=\"3.5\"><title>" << tick_label(p.x) << ": "
        << tick_label(p.y) << "</title></circle>\n";
    }
    o << "</g>\n";
  }

  int x0_, y0_;
  std::string title_, xlabel_, ylabel_;
  std::vector<Series> series_;
  std::vector<double> xs_;
  double ymax_ = 1;
  bool log_x_ = false;
};

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
    Series a{c.config.index, c.config.label(), !c.config.use_cache, {}};
    Series b = a;
    for (const PrefillCell& p : c.prefill)
      if (p.error.empty() && !p.ttft_ms.runs.empty())
        a.pts.push_back({double(p.prompt), p.ttft_ms.median, p.ttft_ms.min, p.ttft_ms.max});
    for (const DecodeCell& d : c.decode)
      if (d.error.empty() && !d.tok_s.runs.empty()) b.pts.push_back({double(d.ctx), d.tok_s.median, d.tok_s.min, d.tok_s.max});
    std::sort(a.pts.begin(), a.pts.end(), [](const Point& x, const Point& y) { return x.x < y.x; });
    std::sort(b.pts.begin(), b.pts.end(), [](const Point& x, const Point& y) { return x.x < y.x; });
    if (!a.pts.empty()) ttft.push_back(a);
    if (!b.pts.empty()) dec.push_back(b);
  }
  const int n_legend = static_cast<int>(r.configs.size());
  const int legend_rows = (n_legend + 1) / 2;
  const int width = 2 * kPanelW, height = kTitleH + kPanelH + 16 + legend_rows * kLegendRowH + 12;
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
  o << "</g>\n</svg>\n";
  return o.str();
}

}  // namespace nf4flash
