// Unicode pieces the tokenizer needs: NFC (utf8proc) behind a quick check that skips strings
// already in NFC, and the White_Space / word-character tests HF's added-token flags use.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace lily::unicode {

// True if s (valid UTF-8) is certainly in NFC without calling utf8proc: every code point is
// "NFC-inert" (no decomposition change, combining class 0, never the second half of a
// canonical composition). False means "maybe not": run the full normalizer.
bool nfc_quick_check(std::string_view s);

// NFC of valid UTF-8 s, as HF tokenizers computes it (its Unicode data is older than
// utf8proc's; see kHfUnassigned). nfc_into returns false, leaving out alone, when s is
// already NFC by the quick check; otherwise writes the result to out.
bool nfc_into(std::string_view s, std::string& out);
std::string nfc(std::string_view s);

// Unicode White_Space property (Rust's char::is_whitespace and regex \s).
bool is_white_space(uint32_t cp);

// Word character as in Rust regex \w (Alphabetic, marks, Nd, Pc, Join_Control); approximates
// Alphabetic with letters, Nl and the circled letters. Used only for `single_word` tokens.
bool is_word_char(uint32_t cp);

}  // namespace lily::unicode
