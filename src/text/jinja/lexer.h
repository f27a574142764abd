// Jinja lexer: template text -> flat token stream, applying jinja2's whitespace rules as HF
// configures them (trim_blocks, lstrip_blocks, {%- -%} / {{- -}} / {#- -#}, {%+ +%}, raw blocks,
// newline normalisation and dropping one trailing newline).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lily::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string value;  // Text data, name, decoded string literal, or operator spelling
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

// Throws jinja::Error naming the line on malformed input (unterminated tag, string, bad char).
std::vector<Token> lex(const std::string& source);

}  // namespace lily::jinja
