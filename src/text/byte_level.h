// The GPT-2 ByteLevel alphabet: each byte is shown as one printable code point (bytes that are
// printable Latin-1 map to themselves, the others to U+0100 + n in byte order).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lily::byte_level {

// Code point that stands for byte b.
uint32_t byte_to_cp(uint8_t b);
// Byte that code point cp stands for, if cp is in the alphabet.
std::optional<uint8_t> cp_to_byte(uint32_t cp);
// Maps a byte-level string (valid UTF-8) to raw bytes; nullopt if a code point is outside
// the alphabet.
std::optional<std::string> decode(std::string_view s);

}  // namespace lily::byte_level
