// UTF-8 string helpers with Python str semantics for the chat-template engine: code-point
// indexing and slicing, Unicode whitespace (str.isspace), strip/split/replace, ASCII case mapping.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nf4flash::chat {

std::vector<char32_t> utf8_decode(std::string_view s);
void utf8_append(std::string& out, char32_t cp);
std::string utf8_encode(const std::vector<char32_t>& cps);
size_t utf8_length(std::string_view s);  // number of code points

bool py_isspace(char32_t c);
char32_t ascii_upper(char32_t c);
char32_t ascii_lower(char32_t c);
std::string str_upper(std::string_view s);
std::string str_lower(std::string_view s);

// chars empty + null_chars true: strip Unicode whitespace; otherwise strip any code point in chars.
std::string str_strip(std::string_view s, bool left, bool right, const std::string* chars);
// sep == nullptr: split on whitespace runs (Python str.split()).
std::vector<std::string> str_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> str_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::string str_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
std::string str_title(std::string_view s);       // Jinja's title filter
std::string str_capitalize(std::string_view s);  // first upper, rest lower

// Python slice index normalization (PySlice_AdjustIndices); returns the selected indices.
std::vector<int64_t> slice_indices(int64_t len, const int64_t* start, const int64_t* stop, int64_t step);

}  // namespace nf4flash::chat
