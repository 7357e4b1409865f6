// Stop-string matching over streamed text (see stop_strings.hpp).
#include "exl3/server/stop_strings.hpp"

#include <algorithm>

namespace exl3::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

StopStringMatcher::Result StopStringMatcher::push(std::string_view piece) {
  held_ += piece;
  Result r;
  // Generation ends at the stop string that completes first (ties: the longer one, which starts
  // earlier). Waiting for a longer stop string that started earlier but is not complete yet would
  // mean generating past a stop string that is already there. Held text never contains a complete
  // stop string from earlier pushes (it would have stopped), so every match ends in the new piece
  // and the result does not depend on how the text was cut into pieces.
  size_t first = std::string::npos, first_end = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < first_end || (end == first_end && at < first)) {
      first = at;
      first_end = end;
    }
  }
  if (first != std::string::npos) {
    r.text = held_.substr(0, first);
    r.stopped = true;
    held_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  r.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace exl3::server
