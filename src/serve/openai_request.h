// The OpenAI-compatible request bodies `nf4flash serve` accepts, parsed and validated into
// generation parameters, and the error JSON it answers with. Pure functions of the body text (no
// engine): the fuzz target and the unit tests drive them directly.
//
// POST /v1/chat/completions: messages (non-empty array of {role: string, content: string | array
//   of {type: "text", text}}), model (optional string), max_tokens | max_completion_tokens (int
//   >= 0), temperature (0..2), top_p (0 < p <= 1), top_k (int >= 0), min_p (0..1), seed (int),
//   stop (string or up to 16 non-empty strings), stream (bool), stream_options {include_usage},
//   logprobs (bool), top_logprobs (0..20, needs logprobs), n (1..16), repetition_penalty (> 0),
//   presence_penalty / frequency_penalty (only 0), user (string, ignored).
// POST /v1/completions: prompt (string, or an array of token ids) instead of messages; echo false.
// Unknown fields are refused by name (a typo must not be silently ignored), as are wrong types.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nf4flash/options.h"

namespace nf4flash::serve {

// JSON text for a reply: bytes that are not UTF-8 (a client's body echoed in an error, a byte-level
// token decoded alone) become U+FFFD instead of an exception.
std::string json_text(const nlohmann::json& j);

// An error reply: HTTP status and OpenAI's {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or empty
  std::string code;   // e.g. "invalid_api_key", "context_length_exceeded"; empty: null
  nlohmann::json to_json() const;
};

enum class Endpoint { Chat, Completion };

struct GenRequest {
  Endpoint endpoint = Endpoint::Chat;
  std::string model;
  nlohmann::json messages;                  // Chat: the validated messages (content as one string)
  std::optional<std::string> prompt;        // Completion: text, or
  std::vector<int32_t> prompt_ids;          // Completion: token ids
  std::optional<int64_t> max_tokens;        // unset: the server's default
  // unset: the server's defaults (its sampling flags)
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  int n = 1;
};

constexpr int kMaxStopStrings = 16;
constexpr int kMaxChoices = 16;
constexpr int kMaxTopLogprobs = 20;

// These sampling parameters over `defaults` (the fields the request left unset keep them).
SamplingParams merged_sampling(const GenRequest& r, const SamplingParams& defaults);

// Parses a request body; an ApiError (400) names the field at fault.
struct ParseResult {
  std::optional<GenRequest> request;
  std::optional<ApiError> error;
};
ParseResult parse_gen_request(const std::string& body, Endpoint endpoint);

// POST /tokenize {"content": string, "add_special": bool?} and POST /detokenize {"tokens": [int]}.
struct TokenizeRequest {
  std::string content;
  bool add_special = true;
};
std::optional<ApiError> parse_tokenize(const std::string& body, TokenizeRequest* out);
std::optional<ApiError> parse_detokenize(const std::string& body, std::vector<int32_t>* out);

}  // namespace nf4flash::serve
