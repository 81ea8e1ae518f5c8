// Attaching the model folder's tokenizer (tokenizer.json) and chat template to an Engine.
// A folder without tokenizer.json still runs on token ids; a broken tokenizer.json is an error.
#include <filesystem>

#include "chat/chat_template.h"
#include "core/error.h"
#include "runtime/engine_impl.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash {

void load_tokenizer_into(Engine::Impl& im, const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json")) return;
  im.tok = std::shared_ptr<Tokenizer>(Tokenizer::from_dir(model_dir).release());
  try {
    im.chat = std::make_shared<ChatTemplate>(ChatTemplate::from_model_dir(model_dir));
  } catch (const Error& e) {
    im.chat_error = e.what();  // reported when --chat asks for it
  }
}

}  // namespace nf4flash
