// libFuzzer target: the chat-template engine (templates come from downloaded models). The input is
// a template source, rendered over a fixed conversation; it must render or throw nf4flash::Error.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json messages = nlohmann::json::parse(
      R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}])");
  try {
    nf4flash::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size), "<s>", "</s>");
    (void)t.apply(messages, true);
  } catch (const nf4flash::Error&) {
  }
  return 0;
}
