// Tokenizer attachment for Engine (the tokenizer library lands separately).
#include "core/error.h"
#include "runtime/engine_impl.h"

namespace nf4flash {

void load_tokenizer_into(Engine::Impl& im, const std::string& model_dir) {}

}  // namespace nf4flash
