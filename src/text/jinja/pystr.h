// Python str semantics over UTF-8 std::string: code-point indexing, Unicode whitespace, case
// mapping (utf8proc) and the str methods chat templates call (strip, split, find, ...).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace lily::jinja::pystr {

std::u32string decode(const std::string& s);  // invalid bytes become U+FFFD
std::string encode(const std::u32string& s);
void append_utf8(std::string& out, char32_t cp);
size_t length(const std::string& s);  // code points

bool is_space(char32_t c);  // str.isspace() per character
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);

// strip family; chars == nullopt strips whitespace.
std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
std::string title(const std::string& s);
std::string capitalize(const std::string& s);
// split / rsplit; sep == nullopt splits on whitespace runs. Throws on an empty separator.
std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, long maxsplit);
std::vector<std::string> rsplit(const std::string& s, const std::optional<std::string>& sep, long maxsplit);
std::vector<std::string> splitlines(const std::string& s, bool keepends);
std::string replace(const std::string& s, const std::string& old, const std::string& with, long count);
// find / rfind return a code-point index or -1; count counts non-overlapping occurrences.
long find(const std::string& s, const std::string& sub, bool reverse);
long count(const std::string& s, const std::string& sub);
bool starts_with(const std::string& s, const std::string& p);
bool ends_with(const std::string& s, const std::string& p);
// HTML escaping as markupsafe.escape does it.
std::string html_escape(const std::string& s);

}  // namespace lily::jinja::pystr
