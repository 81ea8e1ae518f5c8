// An engine's part in a tensor-parallel group (runtime/engine_tp.h).
#include "runtime/engine_tp.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/presets.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "parallel/nccl_group.h"
#include "parallel/tp_process.h"
#include "runtime/engine_impl.h"

namespace nf4flash {

namespace {

using nlohmann::json;

constexpr const char* kPresetPrefix = "preset:";

json options_json(const LoadOptions& o) {
  return json{{"model_dir", o.model_dir}, {"quant", int(o.quant)}, {"double_quant", o.double_quant},
              {"blocksize", o.blocksize}, {"quant_lm_head", o.quant_lm_head}, {"compute", int(o.compute)},
              {"attn", int(o.attn)}, {"use_cache", o.use_cache}, {"graphs", o.graphs}, {"tf32", o.tf32},
              {"ctx_size", o.ctx_size}, {"threads", o.threads}, {"ubatch", o.ubatch}, {"tp", o.tp}};
}

LoadOptions options_from(const json& j) {
  LoadOptions o;
  o.model_dir = j.at("model_dir").get<std::string>();
  o.quant = QuantChoice(j.at("quant").get<int>());
  o.double_quant = j.at("double_quant").get<bool>();
  o.blocksize = j.at("blocksize").get<int>();
  o.quant_lm_head = j.at("quant_lm_head").get<bool>();
  o.compute = ComputeDType(j.at("compute").get<int>());
  o.attn = AttnChoice(j.at("attn").get<int>());
  o.use_cache = j.at("use_cache").get<bool>();
  o.graphs = j.at("graphs").get<bool>();
  o.tf32 = j.at("tf32").get<bool>();
  o.ctx_size = j.at("ctx_size").get<int64_t>();
  o.threads = j.at("threads").get<int>();
  o.ubatch = j.at("ubatch").get<int64_t>();
  o.tp = j.at("tp").get<int>();
  o.load_tokenizer = false;
  return o;
}

}  // namespace

TpEngine::~TpEngine() {
  if (rank != 0 || !comm) return;
  try {
    // without a leader rank 0's load failed after the others started theirs: they stop once loaded
    tp_stop(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: tensor parallel: the other ranks could not be stopped: %s\n", e.what());
  }
}

std::unique_ptr<TpEngine> tp_engine_begin(const LoadOptions& o, const Plan& plan, const std::string& source,
                                          const TpFollowerLoad* follower) {
  auto t = std::make_unique<TpEngine>();
  if (follower) {
    TpProcess* g = tp_process_if_joined();
    NF4FLASH_CHECK(g, "tensor parallel: a follower's engine outside a group");
    t->rank = g->env.rank;
    t->world = g->env.world;
    t->local_rank = g->env.local_rank;
    t->control = g->control.get();
    t->nccl_id = follower->nccl_id;
    return t;
  }
  if (o.gpu_layers != kAllLayers || o.max_vram > 0)
    fail("--tp ", o.tp, " with --gpu-layers / --max-vram: tensor parallel keeps every layer on the GPUs");
  if (source.rfind("synthetic:", 0) == 0)
    fail("--tp ", o.tp, ": a reshaped synthetic model cannot be sent to the other ranks (use a preset or a folder)");
  TpProcess& g = tp_process(o.tp);
  t->rank = 0;
  t->world = g.env.world;
  t->local_rank = g.env.local_rank;
  t->control = g.control.get();
  if (plan.device == Device::CUDA) t->nccl_id = nccl_unique_id();
  json msg{{"source", source}, {"options", options_json(o)}, {"device", plan.device == Device::CUDA ? "cuda" : "cpu"},
           {"nccl_id", t->nccl_id}};
  const std::string text = msg.dump();
  std::vector<uint8_t> bytes(text.begin(), text.end());
  t->control->broadcast_bytes(bytes);
  return t;
}

void tp_engine_connect(TpEngine& t, Backend& be) {
  if (be.device() == Device::CUDA) {
    t.owned = make_nccl_communicator(be, t.rank, t.world, t.nccl_id);
    t.comm = t.owned.get();
  } else {
    t.comm = t.control;
  }
}

void tp_engine_finish(TpEngine& t, Decoder& dec, Backend& be, bool graphs) {
  t.runner = std::make_unique<TpStepRunner>(dec, be);
  t.runner->set_graphs(graphs);
  if (t.rank == 0) t.leader = std::make_unique<TpLeader>(*t.comm, *t.runner);
}

int run_tp_worker(bool quiet) {
  TpProcess& g = tp_process_from_env();
  auto say = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "tp rank %d/%d: %s\n", g.env.rank, g.env.world, s.c_str());
  };
  say(cat("joined rank 0 at ", g.env.master_addr, ":", g.env.master_port));
  for (;;) {
    std::vector<uint8_t> bytes;
    g.control->broadcast_bytes(bytes);
    const std::string text(bytes.begin(), bytes.end());
    if (text == "exit") {
      say("rank 0 is done");
      return 0;
    }
    json msg;
    try {
      msg = json::parse(text);
    } catch (const json::exception& e) {
      fail("tensor parallel: rank 0 sent a malformed load message: ", e.what());
    }
    const std::string source = msg.at("source").get<std::string>();
    LoadOptions o = options_from(msg.at("options"));
    o.device = msg.at("device").get<std::string>() == "cuda" ? DeviceChoice::CUDA : DeviceChoice::CPU;
    TpFollowerLoad f;
    f.nccl_id = msg.at("nccl_id").get<std::vector<uint8_t>>();
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Engine::Impl> im;
    if (source.rfind(kPresetPrefix, 0) == 0) {
      const std::string name = source.substr(std::char_traits<char>::length(kPresetPrefix));
      const ModelConfig cfg = preset_config(name);
      im = build_engine(o, cfg, make_synthetic_store(cfg, name), source, nullptr, nullptr, &f);
    } else {
      ModelConfig cfg = load_model_config(o.model_dir);
      im = build_engine(o, cfg, WeightStore::open_dir(o.model_dir), o.model_dir, nullptr, nullptr, &f);
    }
    say(cat("loaded ", source, " (shard ", g.env.rank, " of ", g.env.world, ", ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s)"));
    const int64_t n = tp_follow(*im->tp->comm, *im->tp->runner);
    say(cat("ran ", n, " forwards of ", source));
  }
}

}  // namespace nf4flash
