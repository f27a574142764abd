// ClientWatch: see client_watch.h.
#include "server/client_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace lily {

namespace {

// "addr:port" of a socket end, in the textual form httplib reports.
bool endpoint(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (!inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

bool same_end(const std::string& a, int ap, const std::string& b, int bp) {
  if (ap != bp) return false;
  if (a == b) return true;
  // An IPv4 peer on a dual-stack socket reads as ::ffff:a.b.c.d on one side.
  auto strip = [](const std::string& s) { return s.rfind("::ffff:", 0) == 0 ? s.substr(7) : s; };
  return strip(a) == strip(b);
}

}  // namespace

ClientWatch::ClientWatch(const std::string& remote_addr, int remote_port, const std::string& local_addr, int local_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (!end || *end || fd < 0 || fd == dirfd(d)) continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer {}, self {};
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    std::string pa, sa;
    int pp = 0, sp = 0;
    if (!endpoint(peer, pa, pp) || !endpoint(self, sa, sp)) continue;
    if (same_end(pa, pp, remote_addr, remote_port) && same_end(sa, sp, local_addr, local_port)) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(d);
}

bool ClientWatch::gone() const {
  if (fd_ < 0) return false;
  pollfd p {};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace lily
