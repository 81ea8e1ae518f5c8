// The batched-engine benchmark (bench_batch.h): B requests at once through a BatchRunner, timed
// per step and per token; reported as JSON, Markdown and SVG.
#include "bench/bench_batch.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <sstream>

#include "bench/bench_svg.h"
#include "core/error.h"
#include "runtime/batch_runner.h"

namespace nf4flash {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(t - t0).count();
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

BatchBenchCell run_cell(Engine& e, const BatchBenchSpec& spec, int B, int n_gen, uint64_t seed,
                        const BatchBenchProgress& progress) {
  BatchBenchCell c;
  c.batch = B;
  const int64_t V = e.vocab_size();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(1, int32_t(std::min<int64_t>(V - 1, 32000)));
  std::map<int64_t, std::vector<double>> tok_ms;  // per request: ms of each token since the start
  BatchRunnerOptions o;
  o.block_size = spec.block_size;
  o.sched.max_seqs_per_step = B;
  o.sched.max_tokens_per_step = std::max<int64_t>(spec.max_tokens_per_step, B);
  o.sched.max_context = spec.prompt + n_gen;
  Clock::time_point t0;
  o.on_token = [&](int64_t id, int32_t) {
    tok_ms[id].push_back(ms_since(t0, Clock::now()));
    return true;
  };
  BatchRunner r(e, o);
  c.kv_blocks_total = r.pool().n_blocks();
  c.kv_tokens_total = c.kv_blocks_total * spec.block_size;
  t0 = Clock::now();
  for (int i = 0; i < B; ++i) {
    BatchRequest q;
    q.id = i;
    for (int64_t k = 0; k < spec.prompt; ++k) q.prompt.push_back(tok(rng));
    q.gen.max_new_tokens = n_gen;
    q.gen.ignore_eos = true;
    const SubmitResult s = r.submit(std::move(q));
    NF4FLASH_CHECK(s.ok(), "bench --batch: request ", i, ": ", s.error);
  }
  double decode_ms = 0;
  int64_t decode_tokens = 0, done = 0;
  Clock::time_point last_report = t0;
  while (r.has_work()) {
    const Clock::time_point a = Clock::now();
    done += int64_t(r.step().size());
    const Clock::time_point b = Clock::now();
    ++c.steps;
    c.kv_blocks_peak = std::max<int64_t>(c.kv_blocks_peak, r.pool().n_blocks() - r.pool().available_blocks());
    const BatchRunner::StepInfo& si = r.last_step();
    if (si.decode_only) {
      decode_ms += ms_since(a, b);
      decode_tokens += si.sampled;
      ++c.decode_steps;
    }
    if (progress && ms_since(last_report, b) > 1000) {
      progress(cat("batch ", B, ": ", done, "/", B, " done, step ", c.steps));
      last_report = b;
    }
  }
  c.wall_s = ms_since(t0, Clock::now()) / 1e3;
  std::vector<double> ttft, per_seq;
  for (const auto& [id, ts] : tok_ms) {
    c.generated += int64_t(ts.size());
    ttft.push_back(ts.front());
    if (ts.size() > 1 && ts.back() > ts.front()) per_seq.push_back(double(ts.size() - 1) / (ts.back() - ts.front()) * 1e3);
  }
  c.ttft_ms_median = median(ttft);
  c.ttft_ms_max = ttft.empty() ? 0 : *std::max_element(ttft.begin(), ttft.end());
  c.per_seq_decode_tok_s = median(per_seq);
  c.agg_decode_tok_s = decode_ms > 0 ? double(decode_tokens) / decode_ms * 1e3 : 0;
  c.decode_step_ms = c.decode_steps ? decode_ms / double(c.decode_steps) : 0;
  c.e2e_tok_s = c.wall_s > 0 ? double(c.generated) / c.wall_s : 0;
  return c;
}
}  // namespace

BatchBenchResult run_batch_bench(Engine& e, const BatchBenchSpec& spec, const std::string& model,
                                 const BatchBenchProgress& progress) {
  BatchBenchResult res;
  res.spec = spec;
  res.model = model;
  res.report = e.report();
  NF4FLASH_CHECK(!spec.batches.empty(), "bench --batch: no batch sizes");
  for (int b : spec.batches) NF4FLASH_CHECK(b >= 1 && b <= 4096, "bench --batch: batch size ", b, " outside 1..4096");
  const int largest = *std::max_element(spec.batches.begin(), spec.batches.end());
  for (int w = 0; w < spec.warmup; ++w) {
    if (progress) progress(cat("warm-up: batch ", largest));
    try {
      run_cell(e, spec, largest, std::min(spec.n_gen, 4), spec.seed + 1000 + uint64_t(w), nullptr);
    } catch (const Error&) {
      // the measured cell of that size reports the error
    }
  }
  for (size_t i = 0; i < spec.batches.size(); ++i) {
    const int B = spec.batches[i];
    if (progress) progress(cat("batch ", B));
    try {
      res.cells.push_back(run_cell(e, spec, B, spec.n_gen, spec.seed + i, progress));
    } catch (const Error& err) {
      BatchBenchCell c;
      c.batch = B;
      c.error = err.what();
      res.cells.push_back(c);
    }
  }
  return res;
}

nlohmann::json batch_bench_to_json(const BatchBenchResult& r, const BenchMeta& meta) {
  using nlohmann::json;
  json j = meta_to_json("nf4flash-bench-batch/1", meta);
  j["model"] = r.model;
  j["report"] = report_to_json(r.report);
  const BatchBenchSpec& s = r.spec;
  j["params"] = {{"batches", s.batches},          {"prompt", s.prompt},   {"n_gen", s.n_gen},
                 {"block_size", s.block_size},    {"warmup", s.warmup},   {"seed", s.seed},
                 {"max_tokens_per_step", s.max_tokens_per_step}};
  j["cells"] = json::array();
  for (const BatchBenchCell& c : r.cells) {
    json x = {{"batch", c.batch}, {"status", c.error.empty() ? "ok" : "error"}};
    if (!c.error.empty()) x["error"] = c.error;
    else
      x.update({{"agg_decode_tok_s", c.agg_decode_tok_s},
                {"per_seq_decode_tok_s", c.per_seq_decode_tok_s},
                {"e2e_tok_s", c.e2e_tok_s},
                {"ttft_ms_median", c.ttft_ms_median},
                {"ttft_ms_max", c.ttft_ms_max},
                {"decode_step_ms", c.decode_step_ms},
                {"decode_steps", c.decode_steps},
                {"steps", c.steps},
                {"generated", c.generated},
                {"wall_s", c.wall_s},
                {"kv_blocks_peak", c.kv_blocks_peak},
                {"kv_blocks_total", c.kv_blocks_total},
                {"kv_tokens_total", c.kv_tokens_total}});
    j["cells"].push_back(x);
  }
  return j;
}

std::string batch_bench_markdown(const BatchBenchResult& r, const BenchMeta* meta) {
  std::ostringstream o;
  o << "nf4flash bench --batch: " << r.model << " | " << r.report.backend << " | " << r.report.quant
    << (r.report.double_quant ? " dq" : "") << " | attn " << r.report.attn << " | -p " << r.spec.prompt << " -n "
    << r.spec.n_gen;
  if (meta) o << " | commit " << meta->commit << (meta->commit_dirty ? "+dirty" : "");
  o << "\n\n| batch | aggregate decode tok/s | per-seq decode tok/s | decode step ms | TTFT median ms | TTFT max ms "
       "| end-to-end tok/s | KV blocks peak / pool (tokens) |\n|--:|--:|--:|--:|--:|--:|--:|--|\n";
  for (const BatchBenchCell& c : r.cells) {
    if (!c.error.empty()) {
      o << "| " << c.batch << " | error: " << c.error << " | | | | | | |\n";
      continue;
    }
    o << "| " << c.batch << " | " << format_num(c.agg_decode_tok_s) << " | " << format_num(c.per_seq_decode_tok_s)
      << " | " << format_num(c.decode_step_ms) << " | " << format_num(c.ttft_ms_median) << " | "
      << format_num(c.ttft_ms_max) << " | " << format_num(c.e2e_tok_s) << " | " << c.kv_blocks_peak << " / "
      << c.kv_blocks_total << " (" << c.kv_tokens_total << ") |\n";
  }
  o << "\nAggregate decode: tokens of the steps where every row decodes, over those steps' time; per-seq: each "
       "request's tokens after its first over its first-to-last token time (median); TTFT from submission with "
       "all B requests submitted at once; block size "
    << r.spec.block_size << ".\n";
  return o.str();
}

std::string batch_bench_svg(const BatchBenchResult& r, const std::string& title) {
  // two bar panels over the batch sizes: aggregate decode tok/s, and median TTFT
  constexpr int W = 480, H = 360, ML = 72, MB = 52, MT = 36, MR = 20, TH = 34;
  std::vector<const BatchBenchCell*> ok;
  for (const BatchBenchCell& c : r.cells)
    if (c.error.empty()) ok.push_back(&c);
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * W << "\" height=\"" << H + TH
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << xml_escape(title) << "</text>\n";
  auto panel = [&](int px, const char* name, auto value) {
    double mx = 0;
    for (const BatchBenchCell* c : ok) mx = std::max(mx, value(*c));
    if (mx <= 0) mx = 1;
    const int x0 = px + ML, y0 = TH + MT, w = W - ML - MR, h = H - MT - MB;
    s << "<text x=\"" << px + W / 2 << "\" y=\"" << TH + 20 << "\" text-anchor=\"middle\">" << name << "</text>\n";
    s << "<line x1=\"" << x0 << "\" y1=\"" << y0 + h << "\" x2=\"" << x0 + w << "\" y2=\"" << y0 + h
      << "\" stroke=\"black\"/>\n<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 << "\" y2=\"" << y0 + h
      << "\" stroke=\"black\"/>\n";
    for (int t = 0; t <= 4; ++t) {
      const double v = mx * t / 4;
      const int y = y0 + h - int(h * t / 4);
      s << "<text x=\"" << x0 - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << format_num(v) << "</text>\n";
    }
    const int n = int(ok.size()), bw = n ? w / (2 * n) : 0;
    for (int i = 0; i < n; ++i) {
      const double v = value(*ok[size_t(i)]);
      const int bh = int(h * v / mx), x = x0 + bw / 2 + 2 * bw * i;
      s << "<rect class=\"bar\" x=\"" << x << "\" y=\"" << y0 + h - bh << "\" width=\"" << bw << "\" height=\"" << bh
        << "\" fill=\"#1f77b4\"/>\n<text x=\"" << x + bw / 2 << "\" y=\"" << y0 + h - bh - 4
        << "\" text-anchor=\"middle\">" << format_num(v) << "</text>\n<text x=\"" << x + bw / 2 << "\" y=\""
        << y0 + h + 16 << "\" text-anchor=\"middle\">" << ok[size_t(i)]->batch << "</text>\n";
    }
    s << "<text x=\"" << x0 + w / 2 << "\" y=\"" << y0 + h + 36 << "\" text-anchor=\"middle\">sequences</text>\n";
  };
  panel(0, "aggregate decode tok/s", [](const BatchBenchCell& c) { return c.agg_decode_tok_s; });
  panel(W, "TTFT under load, median ms", [](const BatchBenchCell& c) { return c.ttft_ms_median; });
  s << "</svg>\n";
  return s.str();
}

}  // namespace nf4flash
