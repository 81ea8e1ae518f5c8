// Request parsing of `nf4flash serve` (openai_request.h): every field checked for type and range,
// the first problem reported with the field's name.
#include "serve/openai_request.h"

#include <cmath>
#include <set>

namespace nf4flash::serve {

using nlohmann::json;

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json ApiError::to_json() const {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

namespace {

// Thrown inside the parser, turned into the ApiError result at its boundary.
struct Bad {
  std::string param, message;
};
[[noreturn]] void bad(const std::string& param, const std::string& message) { throw Bad{param, message}; }

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number";
    default: return "an integer";
  }
}

double number(const json& v, const std::string& name, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) bad(name, "'" + name + "' must be a number, not " + type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    char b[160];
    std::snprintf(b, sizeof b, "'%s' is %g; it must be %s %g and <= %g", name.c_str(), x, lo_open ? ">" : ">=", lo, hi);
    bad(name, b);
  }
  return x;
}

int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) {
    // 5.0 is an integer in JSON's number model (Python clients send it so)
    if (!(v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>())))
      bad(name, "'" + name + "' must be an integer, not " + type_name(v));
  }
  const double d = v.get<double>();
  if (d < double(lo) || d > double(hi))
    bad(name, "'" + name + "' is " + v.dump() + "; it must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return v.is_number_float() ? int64_t(d) : v.get<int64_t>();
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, "'" + name + "' must be a boolean, not " + type_name(v));
  return v.get<bool>();
}

std::string string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, "'" + name + "' must be a string, not " + type_name(v));
  return v.get<std::string>();
}

// content: a string, or an array of text parts (joined), or null for an assistant turn
std::string content_text(const json& c, const std::string& name) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
      const json& p = c[i];
      const std::string pn = name + "[" + std::to_string(i) + "]";
      if (!p.is_object()) bad(pn, "'" + pn + "' must be an object {\"type\": \"text\", \"text\": ...}");
      if (!p.contains("type") || p["type"] != "text")
        bad(pn + ".type", "'" + pn + ".type' must be \"text\" (this server takes text only)");
      if (!p.contains("text")) bad(pn + ".text", "'" + pn + ".text' is missing");
      out += string(p["text"], pn + ".text");
    }
    return out;
  }
  bad(name, "'" + name + "' must be a string or an array of text parts, not " + type_name(c));
}

json parse_messages(const json& m) {
  if (!m.is_array()) bad("messages", std::string("'messages' must be an array, not ") + type_name(m));
  if (m.empty()) bad("messages", "'messages' must hold at least one message");
  json out = json::array();
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    const json& x = m[i];
    if (!x.is_object()) bad(name, "'" + name + "' must be an object, not " + type_name(x));
    if (!x.contains("role")) bad(name + ".role", "'" + name + ".role' is missing");
    const std::string role = string(x["role"], name + ".role");
    static const std::set<std::string> roles = {"system", "user", "assistant", "tool", "developer"};
    if (!roles.count(role))
      bad(name + ".role", "'" + name + ".role' is '" + role + "'; one of system, developer, user, assistant, tool");
    json o = {{"role", role == "developer" ? "system" : role}};
    if (x.contains("content") && !x["content"].is_null()) o["content"] = content_text(x["content"], name + ".content");
    else if (role != "assistant") bad(name + ".content", "'" + name + ".content' is missing");
    else o["content"] = "";
    for (const auto& [k, v] : x.items()) {
      if (k == "role" || k == "content") continue;
      if (k == "name") o["name"] = string(v, name + ".name");
      else bad(name + "." + k, "'" + name + "." + k + "' is not supported");
    }
    out.push_back(o);
  }
  return out;
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    if (v.get<std::string>().empty()) bad("stop", "'stop' must not be an empty string");
    return {v.get<std::string>()};
  }
  if (!v.is_array()) bad("stop", std::string("'stop' must be a string or an array of strings, not ") + type_name(v));
  if (v.size() > size_t(kMaxStopStrings)) bad("stop", "'stop' holds " + std::to_string(v.size()) + " strings; at most 16");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string s = string(v[i], "stop[" + std::to_string(i) + "]");
    if (s.empty()) bad("stop", "'stop[" + std::to_string(i) + "]' must not be empty");
    out.push_back(s);
  }
  return out;
}

json parse_object(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", std::string("the body must be a JSON object, not ") + type_name(j));
  return j;
}
ApiError to_error(const Bad& b) {
  ApiError e;
  e.message = b.message;
  e.param = b.param;
  return e;
}

GenRequest parse(const std::string& body, Endpoint ep) {
  const json j = parse_object(body);
  GenRequest r;
  r.endpoint = ep;
  const char* body_field = ep == Endpoint::Chat ? "messages" : "prompt";
  if (!j.contains(body_field)) bad(body_field, std::string("'") + body_field + "' is missing");
  bool have_max = false;
  for (const auto& [k, v] : j.items()) {
    if (k == "messages" && ep == Endpoint::Chat) r.messages = parse_messages(v);
    else if (k == "prompt" && ep == Endpoint::Completion) {
      if (v.is_string()) r.prompt = v.get<std::string>();
      else if (v.is_array() && !v.empty() && v[0].is_number()) {
        for (size_t i = 0; i < v.size(); ++i)
          r.prompt_ids.push_back(int32_t(integer(v[i], "prompt[" + std::to_string(i) + "]", 0, INT32_MAX)));
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        r.prompt = v[0].get<std::string>();
      } else {
        bad("prompt", std::string("'prompt' must be a string, a one-string array or an array of token ids, not ") +
                          (v.is_array() ? "that array" : type_name(v)));
      }
      if (r.prompt && r.prompt->empty()) bad("prompt", "'prompt' must not be empty");
    } else if (k == "model") r.model = string(v, k);
    else if (k == "max_tokens" || k == "max_completion_tokens") {
      if (v.is_null()) continue;
      const int64_t m = integer(v, k, 0, int64_t(1) << 30);
      if (have_max && r.max_tokens && *r.max_tokens != m)
        bad(k, "'max_tokens' and 'max_completion_tokens' disagree");
      r.max_tokens = m;
      have_max = true;
    } else if (k == "temperature") { if (!v.is_null()) r.temperature = float(number(v, k, 0, 2)); }
    else if (k == "top_p") { if (!v.is_null()) r.top_p = float(number(v, k, 0, 1, true)); }
    else if (k == "min_p") { if (!v.is_null()) r.min_p = float(number(v, k, 0, 1)); }
    else if (k == "top_k") { if (!v.is_null()) r.top_k = int(integer(v, k, 0, 1 << 20)); }
    else if (k == "repetition_penalty") { if (!v.is_null()) r.repetition_penalty = float(number(v, k, 0, 100, true)); }
    else if (k == "seed") { if (!v.is_null()) r.seed = uint64_t(integer(v, k, INT64_MIN / 2, INT64_MAX / 2)); }
    else if (k == "stop") r.stop = parse_stop(v);
    else if (k == "stream") { if (!v.is_null()) r.stream = boolean(v, k); }
    else if (k == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) bad(k, std::string("'stream_options' must be an object, not ") + type_name(v));
      for (const auto& [sk, sv] : v.items()) {
        if (sk == "include_usage") r.include_usage = boolean(sv, "stream_options.include_usage");
        else bad("stream_options." + sk, "'stream_options." + sk + "' is not supported");
      }
    } else if (k == "logprobs") {
      if (v.is_null()) continue;
      if (ep == Endpoint::Completion) {
        r.logprobs = true;
        r.top_logprobs = int(integer(v, k, 0, kMaxTopLogprobs));
      } else {
        r.logprobs = boolean(v, k);
      }
    } else if (k == "top_logprobs" && ep == Endpoint::Chat) {
      if (!v.is_null()) r.top_logprobs = int(integer(v, k, 0, kMaxTopLogprobs));
    } else if (k == "n") { if (!v.is_null()) r.n = int(integer(v, k, 1, kMaxChoices)); }
    else if (k == "presence_penalty" || k == "frequency_penalty") {
      if (!v.is_null() && number(v, k, -2, 2) != 0)
        bad(k, "'" + k + "' is not supported (only 0); use 'repetition_penalty'");
    } else if (k == "user") { if (!v.is_null()) string(v, k); }
    else if (k == "echo" && ep == Endpoint::Completion) {
      if (!v.is_null() && boolean(v, k)) bad(k, "'echo' true is not supported");
    } else {
      bad(k, "unknown field '" + k + "'");
    }
  }
  if (r.top_logprobs > 0 && !r.logprobs && ep == Endpoint::Chat) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (r.include_usage && !r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
  return r;
}

}  // namespace

SamplingParams merged_sampling(const GenRequest& r, const SamplingParams& d) {
  SamplingParams s = d;
  if (r.temperature) s.temperature = *r.temperature;
  if (r.top_p) s.top_p = *r.top_p;
  if (r.min_p) s.min_p = *r.min_p;
  if (r.top_k) s.top_k = *r.top_k;
  if (r.repetition_penalty) s.repeat_penalty = *r.repetition_penalty;
  if (r.seed) s.seed = *r.seed;
  return s;
}

ParseResult parse_gen_request(const std::string& body, Endpoint endpoint) {
  ParseResult out;
  try {
    out.request = parse(body, endpoint);
  } catch (const Bad& b) {
    ApiError e;
    e.message = b.message;
    e.param = b.param;
    out.error = e;
  }
  return out;
}


std::optional<ApiError> parse_tokenize(const std::string& body, TokenizeRequest* out) {
  try {
    const json j = parse_object(body);
    if (!j.contains("content")) bad("content", "'content' is missing");
    for (const auto& [k, v] : j.items()) {
      if (k == "content") out->content = string(v, k);
      else if (k == "add_special") out->add_special = boolean(v, k);
      else if (k == "model") string(v, k);
      else bad(k, "unknown field '" + k + "'");
    }
  } catch (const Bad& b) {
    return to_error(b);
  }
  return std::nullopt;
}

std::optional<ApiError> parse_detokenize(const std::string& body, std::vector<int32_t>* out) {
  try {
    const json j = parse_object(body);
    if (!j.contains("tokens")) bad("tokens", "'tokens' is missing");
    for (const auto& [k, v] : j.items()) {
      if (k == "tokens") {
        if (!v.is_array()) bad(k, std::string("'tokens' must be an array of token ids, not ") + type_name(v));
        for (size_t i = 0; i < v.size(); ++i)
          out->push_back(int32_t(integer(v[i], "tokens[" + std::to_string(i) + "]", 0, INT32_MAX)));
      } else if (k == "model") {
        string(v, k);
      } else {
        bad(k, "unknown field '" + k + "'");
      }
    }
  } catch (const Bad& b) {
    return to_error(b);
  }
  return std::nullopt;
}

}  // namespace nf4flash::serve
