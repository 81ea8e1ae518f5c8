// libFuzzer target: the request bodies `nf4flash serve` takes from the network (JSON to generation
// parameters, /tokenize, /detokenize). Any input must give a request or an ApiError; never crash.
#include <cstdint>
#include <string>
#include <vector>

#include "serve/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  using namespace nf4flash::serve;
  for (Endpoint ep : {Endpoint::Chat, Endpoint::Completion}) {
    const ParseResult r = parse_gen_request(body, ep);
    if (r.error) (void)json_text(r.error->to_json());
    else (void)merged_sampling(*r.request, {});
  }
  TokenizeRequest t;
  (void)parse_tokenize(body, &t);
  std::vector<int32_t> ids;
  (void)parse_detokenize(body, &ids);
  return 0;
}
