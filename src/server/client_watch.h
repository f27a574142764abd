// Whether the client of a request has gone away, without writing to it. cpp-httplib 0.11 gives a
// handler no access to its socket (and a non-streaming response must not write before its status
// is known), so the socket is found once by its two addresses among the process's descriptors,
// and polled for the peer's hang-up (POLLRDHUP/POLLHUP); data the client may have sent is left
// unread. Linux only; where the socket is not found, gone() stays false.
#pragma once
#include <string>

namespace lily {

class ClientWatch {
 public:
  ClientWatch(const std::string& remote_addr, int remote_port, const std::string& local_addr, int local_port);
  bool found() const { return fd_ >= 0; }
  bool gone() const;  // the peer closed its end

 private:
  int fd_ = -1;
};

}  // namespace lily
