// bitsandbytes 4-bit checkpoint reading/writing and quantization_config (see bnb_checkpoint.h).
#include "io/bnb_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "quant/blockwise.h"
#include "quant/codebook.h"

namespace nf4flash {

using nlohmann::json;

// ---- names and number spelling -------------------------------------------------------------

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F32: return "float32";
    case DType::U8: return "uint8";
    case DType::I8: return "int8";
    default: return std::string(dtype_name(t));
  }
}

bool dtype_from_torch_name(const std::string& s0, DType* out) {
  std::string s = s0.rfind("torch.", 0) == 0 ? s0.substr(6) : s0;
  if (s == "bfloat16") *out = DType::BF16;
  else if (s == "float16" || s == "half") *out = DType::F16;
  else if (s == "float32" || s == "float") *out = DType::F32;
  else if (s == "uint8") *out = DType::U8;
  else if (s == "int8") *out = DType::I8;
  else return false;
  return true;
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);  // shortest round trip: "-d.ddde+XX"
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (static_cast<int>(ip.size()) < exp + 1) ip += '0';
      std::string fp = static_cast<int>(digits.size()) > exp + 1 ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return sign + out;
}

// ---- quantization_config -------------------------------------------------------------------

bool has_bnb_quant_config(const json& config) {
  if (!config.is_object() || !config.contains("quantization_config")) return false;
  const json& q = config["quantization_config"];
  return q.is_object() && q.value("quant_method", std::string()) == "bitsandbytes";
}

BnbQuantConfig parse_bnb_quant_config(const json& config) {
  const json& q = config.is_object() && config.contains("quantization_config")
                      ? config["quantization_config"]
                      : config;
  if (!q.is_object()) fail("quantization_config is not a JSON object");
  const std::string method = q.value("quant_method", std::string());
  if (method != "bitsandbytes")
    fail("quantization_config.quant_method is \"", method, "\"; only \"bitsandbytes\" is supported");
  auto get_bool = [&](const char* key, bool dflt) {
    if (!q.contains(key) || q[key].is_null()) return dflt;
    if (!q[key].is_boolean()) fail("quantization_config.", key, " must be true or false");
    return q[key].get<bool>();
  };
  BnbQuantConfig c;
  c.load_in_8bit = get_bool("load_in_8bit", get_bool("_load_in_8bit", false));
  c.load_in_4bit = get_bool("load_in_4bit", get_bool("_load_in_4bit", false));
  if (c.load_in_8bit)
    fail("quantization_config: 8-bit bitsandbytes checkpoints (load_in_8bit) are not supported");
  if (!c.load_in_4bit) fail("quantization_config: bitsandbytes config without load_in_4bit");
  const std::string qt = q.contains("bnb_4bit_quant_type") && q["bnb_4bit_quant_type"].is_string()
                             ? q["bnb_4bit_quant_type"].get<std::string>()
                             : "fp4";
  if (!quant_type_from_name(qt, &c.quant_type) || c.quant_type == QuantType::None)
    fail("quantization_config.bnb_4bit_quant_type \"", qt, "\" is unknown (expected nf4 or fp4)");
  c.double_quant = get_bool("bnb_4bit_use_double_quant", false);
  if (q.contains("bnb_4bit_compute_dtype") && !q["bnb_4bit_compute_dtype"].is_null()) {
    const json& v = q["bnb_4bit_compute_dtype"];
    if (!v.is_string() || !dtype_from_torch_name(v.get<std::string>(), &c.compute_dtype) ||
        (c.compute_dtype != DType::F32 && c.compute_dtype != DType::F16 &&
         c.compute_dtype != DType::BF16))
      fail("quantization_config.bnb_4bit_compute_dtype ", v.dump(), " is not supported");
  }
  if (q.contains("bnb_4bit_quant_storage") && !q["bnb_4bit_quant_storage"].is_null()) {
    const json& v = q["bnb_4bit_quant_storage"];
    if (!v.is_string() || !dtype_from_torch_name(v.get<std::string>(), &c.quant_storage))
      fail("quantization_config.bnb_4bit_quant_storage ", v.dump(), " is not supported");
  }
  if (q.contains("bnb_4bit_blocksize") && !q["bnb_4bit_blocksize"].is_null()) {
    if (!q["bnb_4bit_blocksize"].is_number_integer())
      fail("quantization_config.bnb_4bit_blocksize must be an integer");
    c.blocksize = q["bnb_4bit_blocksize"].get<int>();
    if (!valid_blocksize_4bit(c.blocksize))
      fail("quantization_config.bnb_4bit_blocksize ", c.blocksize,
           " is not one of 32, 64, 128, 256, 512, 1024, 2048, 4096");
  }
  if (q.contains("llm_int8_skip_modules") && !q["llm_int8_skip_modules"].is_null()) {
    const json& v = q["llm_int8_skip_modules"];
    if (!v.is_array()) fail("quantization_config.llm_int8_skip_modules must be a list");
    for (const json& s : v) {
      if (!s.is_string()) fail("quantization_config.llm_int8_skip_modules must list strings");
      c.skip_modules.push_back(s.get<std::string>());
    }
  }
  return c;
}

json bnb_quant_config_json(QuantType type, bool double_quant, DType compute_dtype,
                           const std::vector<std::string>& skip_modules) {
  if (type != QuantType::NF4 && type != QuantType::FP4)
    fail("bitsandbytes quantization_config needs nf4 or fp4, got ", quant_type_name(type));
  json q = json::object();
  q["_load_in_4bit"] = true;
  q["_load_in_8bit"] = false;
  q["bnb_4bit_compute_dtype"] = torch_dtype_name(compute_dtype);
  q["bnb_4bit_quant_storage"] = "uint8";
  q["bnb_4bit_quant_type"] = std::string(quant_type_name(type));
  q["bnb_4bit_use_double_quant"] = double_quant;
  q["llm_int8_enable_fp32_cpu_offload"] = false;
  q["llm_int8_has_fp16_weight"] = false;
  q["llm_int8_skip_modules"] = skip_modules.empty() ? json(nullptr) : json(skip_modules);
  q["llm_int8_threshold"] = 6.0;
  q["load_in_4bit"] = true;
  q["load_in_8bit"] = false;
  q["quant_method"] = "bitsandbytes";
  return q;
}

// ---- reading -------------------------------------------------------------------------------

namespace {

const char* kQsNf4 = ".quant_state.bitsandbytes__nf4";
const char* kQsFp4 = ".quant_state.bitsandbytes__fp4";

template <typename T>
std::vector<T> copy_tensor(const TensorInfo& t) {
  std::vector<T> v(t.nbytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

const TensorInfo& need(const WeightStore& ws, const std::string& weight, const std::string& suffix) {
  const TensorInfo* t = ws.find(weight + suffix);
  if (!t) fail("bitsandbytes weight ", weight, ": missing tensor ", weight + suffix, " in ", ws.source());
  return *t;
}

void need_dtype(const TensorInfo& t, DType want) {
  if (t.dtype != want)
    fail("tensor ", t.name, " has dtype ", dtype_name(t.dtype), ", expected ", dtype_name(want));
}

void need_numel(const TensorInfo& t, int64_t want, const std::string& why) {
  if (t.numel() != want)
    fail("tensor ", t.name, " has shape ", t.shape_str(), " (", t.numel(), " values), expected ",
         want, " (", why, ")");
}

bool same_code(float a, float b) { return a == b; }  // +0 == -0: the sign of zero is irrelevant

}  // namespace

bool is_bnb_quantized(const WeightStore& ws, const std::string& weight_name) {
  return ws.find(weight_name + kQsNf4) != nullptr || ws.find(weight_name + kQsFp4) != nullptr;
}

Quant4Tensor read_bnb_weight(const WeightStore& ws, const std::string& w) {
  const TensorInfo* qs_nf4 = ws.find(w + kQsNf4);
  const TensorInfo* qs_fp4 = ws.find(w + kQsFp4);
  if (qs_nf4 && qs_fp4) fail("bitsandbytes weight ", w, " has both nf4 and fp4 quant_state tensors");
  if (!qs_nf4 && !qs_fp4)
    fail("bitsandbytes weight ", w, ": missing tensor ", w, kQsNf4, " (or __fp4) in ", ws.source());
  const TensorInfo& qs = qs_nf4 ? *qs_nf4 : *qs_fp4;
  const QuantType suffix_type = qs_nf4 ? QuantType::NF4 : QuantType::FP4;
  need_dtype(qs, DType::U8);

  json st;
  try {
    st = json::parse(std::string(reinterpret_cast<const char*>(qs.data), qs.nbytes));
  } catch (const std::exception& e) {
    fail("tensor ", qs.name, " does not hold valid JSON: ", e.what());
  }
  if (!st.is_object()) fail("tensor ", qs.name, " does not hold a JSON object");
  auto field = [&](const char* key) -> const json& {
    if (!st.contains(key)) fail("tensor ", qs.name, ": quant_state has no \"", key, "\"");
    return st[key];
  };

  Quant4Tensor q;
  const json& jt = field("quant_type");
  if (!jt.is_string() || !quant_type_from_name(jt.get<std::string>(), &q.type) ||
      q.type == QuantType::None)
    fail("tensor ", qs.name, ": unknown quant_type ", jt.dump(), " (expected \"nf4\" or \"fp4\")");
  if (q.type != suffix_type)
    fail("tensor ", qs.name, ": quant_type \"", quant_type_name(q.type),
         "\" does not match its name's suffix");
  const json& jb = field("blocksize");
  if (!jb.is_number_integer()) fail("tensor ", qs.name, ": blocksize must be an integer");
  q.blocksize = jb.get<int>();
  if (!valid_blocksize_4bit(q.blocksize))
    fail("tensor ", qs.name, ": blocksize ", q.blocksize,
         " is not one of 32, 64, 128, 256, 512, 1024, 2048, 4096");
  const json& jd = field("dtype");
  if (!jd.is_string() || !dtype_from_torch_name(jd.get<std::string>(), &q.orig_dtype))
    fail("tensor ", qs.name, ": unknown dtype ", jd.dump());
  const json& js = field("shape");
  if (!js.is_array() || js.empty()) fail("tensor ", qs.name, ": shape must be a non-empty list");
  std::vector<int64_t> shape;
  for (const json& d : js) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0)
      fail("tensor ", qs.name, ": bad shape ", js.dump());
    shape.push_back(d.get<int64_t>());
  }
  std::string shape_str = "[";
  for (size_t i = 0; i < shape.size(); ++i) shape_str += (i ? ", " : "") + std::to_string(shape[i]);
  shape_str += "]";
  q.cols = shape.back();
  q.rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) q.rows *= shape[i];
  const int64_t n = q.numel(), nb = q.num_blocks();
  const std::string shape_why = cat("shape ", shape_str, ", blocksize ", q.blocksize);

  // packed codes: any storage dtype, (n + 1) / 2 bytes
  const TensorInfo& packed = need(ws, w, "");
  if (static_cast<int64_t>(packed.nbytes) != (n + 1) / 2)
    fail("tensor ", w, " holds ", packed.nbytes, " bytes of packed 4-bit codes, but quant_state ",
         "shape ", shape_str, " needs ", (n + 1) / 2);
  q.packed = copy_tensor<uint8_t>(packed);

  // code book
  const TensorInfo& qmap = need(ws, w, ".quant_map");
  need_dtype(qmap, DType::F32);
  need_numel(qmap, 16, "16-entry 4-bit code book");
  const auto code = copy_tensor<float>(qmap);
  for (int k = 0; k < 16; ++k) {
    if (!same_code(code[k], code4(q.type)[k]))
      fail("tensor ", qmap.name, " differs from the standard ", quant_type_name(q.type),
           " code book at entry ", k, " (custom code books are not supported)");
    q.code[k] = code[k];
  }

  const TensorInfo& absmax = need(ws, w, ".absmax");
  const TensorInfo* nested_absmax = ws.find(w + ".nested_absmax");
  const bool nested_json = st.contains("nested_offset") || st.contains("nested_blocksize");
  if (static_cast<bool>(nested_absmax) != nested_json)
    fail("bitsandbytes weight ", w, ": ", nested_absmax ? "has" : "lacks", " tensor ", w,
         ".nested_absmax but its quant_state ", nested_json ? "has" : "lacks", " nested fields");
  if (!nested_absmax) {
    need_dtype(absmax, DType::F32);
    need_numel(absmax, nb, shape_why);
    q.absmax = copy_tensor<float>(absmax);
  } else {
    q.double_quant = true;
    need_dtype(absmax, DType::U8);
    need_numel(absmax, nb, shape_why);
    q.absmax_q = copy_tensor<uint8_t>(absmax);
    const json& nbs = field("nested_blocksize");
    if (!nbs.is_number_integer() || nbs.get<int64_t>() <= 0 || nbs.get<int64_t>() > (1 << 20))
      fail("tensor ", qs.name, ": bad nested_blocksize ", nbs.dump());
    q.nested_blocksize = nbs.get<int>();
    const json& off = field("nested_offset");
    if (!off.is_number()) fail("tensor ", qs.name, ": nested_offset must be a number");
    q.offset = static_cast<float>(off.get<double>());
    if (st.contains("nested_dtype") && st["nested_dtype"] != "float32")
      fail("tensor ", qs.name, ": nested_dtype ", st["nested_dtype"].dump(), " is not supported");
    need_dtype(*nested_absmax, DType::F32);
    need_numel(*nested_absmax, (nb + q.nested_blocksize - 1) / q.nested_blocksize,
               cat(nb, " absmax values / nested blocksize ", q.nested_blocksize));
    q.nested_absmax = copy_tensor<float>(*nested_absmax);
    const TensorInfo& nqmap = need(ws, w, ".nested_quant_map");
    need_dtype(nqmap, DType::F32);
    need_numel(nqmap, 256, "256-entry 8-bit code");
    const auto nc = copy_tensor<float>(nqmap);
    std::copy(nc.begin(), nc.end(), q.nested_code.begin());
  }
  validate_quant4(q, w);
  return q;
}

// ---- writing -------------------------------------------------------------------------------

std::string bnb_quant_state_json(const Quant4Tensor& q) {
  std::string shape = "[" + std::to_string(q.rows) + ", " + std::to_string(q.cols) + "]";
  std::string s = "{\"quant_type\": \"" + std::string(quant_type_name(q.type)) +
                  "\", \"blocksize\": " + std::to_string(q.blocksize) + ", \"dtype\": \"" +
                  torch_dtype_name(q.orig_dtype) + "\", \"shape\": " + shape;
  if (q.double_quant) {
    s += ", \"nested_blocksize\": " + std::to_string(q.nested_blocksize) +
         ", \"nested_dtype\": \"float32\", \"nested_offset\": " +
         python_float_repr(static_cast<double>(q.offset));
  }
  return s + "}";
}

BnbTensorSet make_bnb_tensor_set(
    const std::vector<std::pair<std::string, const Quant4Tensor*>>& quantized,
    const std::vector<TensorToWrite>& plain) {
  BnbTensorSet out;
  for (const auto& [name, qp] : quantized) {
    const Quant4Tensor& q = *qp;
    validate_quant4(q, name);
    const int64_t nb = q.num_blocks();
    out.tensors.push_back({name, DType::U8, {static_cast<int64_t>(q.packed.size()), 1},
                           q.packed.data(), q.packed.size()});
    if (q.double_quant) {
      out.tensors.push_back({name + ".absmax", DType::U8, {nb}, q.absmax_q.data(), q.absmax_q.size()});
      out.tensors.push_back({name + ".nested_absmax", DType::F32,
                             {static_cast<int64_t>(q.nested_absmax.size())},
                             q.nested_absmax.data(), q.nested_absmax.size() * 4});
      out.tensors.push_back({name + ".nested_quant_map", DType::F32, {256}, q.nested_code.data(),
                             256 * 4});
    } else {
      out.tensors.push_back({name + ".absmax", DType::F32, {nb}, q.absmax.data(), q.absmax.size() * 4});
    }
    out.tensors.push_back({name + ".quant_map", DType::F32, {16}, q.code.data(), 16 * 4});
    const std::string& js = out.owned.emplace_back(bnb_quant_state_json(q));
    out.tensors.push_back({name + ".quant_state.bitsandbytes__" + std::string(quant_type_name(q.type)),
                           DType::U8, {static_cast<int64_t>(js.size())}, js.data(), js.size()});
  }
  for (const TensorToWrite& t : plain) out.tensors.push_back(t);
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const TensorToWrite& a, const TensorToWrite& b) {
                     const size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
                     if (sa != sb) return sa > sb;
                     return a.name < b.name;
                   });
  for (size_t i = 1; i < out.tensors.size(); ++i)
    if (out.tensors[i].name == out.tensors[i - 1].name)
      fail("bitsandbytes checkpoint: tensor ", out.tensors[i].name, " given twice");
  return out;
}

}  // namespace nf4flash
