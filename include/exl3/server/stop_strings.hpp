// Stop strings over streamed text: generation must end as soon as any stop string is complete
// (the one that completes first; of two ending together, the longer), and the stop string itself
// (and anything after it) must never reach the client.
// Text arrives in pieces (one per token); a piece can end with the beginning of a stop string
// that the next piece completes, so the matcher holds back the longest tail that is still a
// prefix of some stop string and releases it once it can no longer start a match.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace exl3::server {

class StopStringMatcher {
 public:
  // Empty strings are not allowed (the caller validates; they would match everywhere).
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  struct Result {
    std::string text;   // safe to send now
    bool stopped = false;  // a stop string was found: `text` ends just before it
  };
  // Adds `piece` to the held text.
  Result push(std::string_view piece);
  // Releases whatever is held (generation ended for another reason).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace exl3::server
