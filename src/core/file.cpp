// See file.h.
#include "core/file.h"

#include <fstream>
#include <sstream>

namespace lily {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errorf("{}: cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return errorf("{}: read error", path);
  return ss.str();
}

}  // namespace lily
