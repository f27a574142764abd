// Whole-file reads for the small text files the loaders parse (config.json, tokenizer.json, chat templates).
#pragma once
#include <string>

#include "core/status.h"

namespace lily {

// The bytes of the file at path; "PATH: cannot open" or "PATH: read error" otherwise.
Result<std::string> read_file(const std::string& path);

}  // namespace lily
