// StopStringMatcher against the plain definition on random texts cut into random pieces: the
// released text is the text up to the stop-string occurrence that ends first (of two ending
// together, the one starting first; all of the text when none occurs), and nothing that could still
// become a stop string is released early.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/server/stop_strings.hpp"
#include "test_support.hpp"

using exl3::server::StopStringMatcher;

namespace {

std::string random_text(std::mt19937_64& rng, size_t n) {
  // A small alphabet so stop strings occur (and almost occur) often.
  static const std::string alphabet = "abc \xC3\xA9";  // includes a two-byte character
  std::string s;
  while (s.size() < n) {
    const size_t i = rng() % 5;
    s += i == 4 ? alphabet.substr(4, 2) : alphabet.substr(i, 1);
  }
  return s;
}

}  // namespace

TEST(StopStrings, MatchesThePlainDefinitionOnRandomStreams) {
  auto rng = exl3::test::make_rng();
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    const size_t nstops = rng() % 3;
    for (size_t i = 0; i < nstops; ++i) stops.push_back(random_text(rng, 1 + rng() % 4));
    const std::string text = random_text(rng, rng() % 40);

    size_t first = std::string::npos, first_end = std::string::npos;
    for (const auto& s : stops) {
      const size_t at = text.find(s);
      if (at == std::string::npos) continue;
      if (at + s.size() < first_end || (at + s.size() == first_end && at < first)) {
        first = at;
        first_end = at + s.size();
      }
    }
    const std::string expected = text.substr(0, first);

    StopStringMatcher m(stops);
    std::string got, fed;
    bool stopped = false;
    size_t pos = 0;
    while (pos < text.size() && !stopped) {
      const size_t len = std::min(text.size() - pos, size_t{1} + rng() % 4);
      const auto r = m.push(std::string_view(text).substr(pos, len));
      pos += len;
      fed = text.substr(0, pos);
      got += r.text;
      stopped = r.stopped;
      // Never ahead of the definition: what is out is a prefix of the expected text.
      ASSERT_EQ(expected.compare(0, got.size(), got), 0) << "trial " << trial;
      if (!stopped) {
        // Held back only what could still start a stop string.
        const std::string held = fed.substr(got.size());
        bool could = held.empty();
        for (const auto& s : stops)
          could = could || (held.size() < s.size() && s.compare(0, held.size(), held) == 0);
        EXPECT_TRUE(could) << "trial " << trial << ": held '" << held << "'";
      }
    }
    if (!stopped) got += m.flush();
    EXPECT_EQ(stopped, first != std::string::npos) << "trial " << trial;
    EXPECT_EQ(got, expected) << "trial " << trial << " text '" << text << "'";
  }
}

TEST(StopStrings, StopsAcrossPiecesAndReleasesFalseStarts) {
  StopStringMatcher m({"</end>"});
  auto r = m.push("hello </e");
  EXPECT_EQ(r.text, "hello ");
  EXPECT_FALSE(r.stopped);
  r = m.push("nx");  // "</enx": not the stop string after all
  EXPECT_EQ(r.text, "</enx");
  r = m.push(" ok </en");
  EXPECT_EQ(r.text, " ok ");
  r = m.push("d> tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

TEST(StopStrings, TheStopThatCompletesFirstWinsOverALongerEarlierStart) {
  // "abc" starts first but "b" completes first: generation must not run on to see whether "abc"
  // completes, and the answer must not depend on how the text is cut.
  StopStringMatcher whole({"abc", "b"});
  auto r = whole.push("xabc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "xa");
  StopStringMatcher pieces({"abc", "b"});
  r = pieces.push("xa");
  EXPECT_EQ(r.text, "x");
  r = pieces.push("b");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
  // Two ending together: the longer one.
  StopStringMatcher tie({"c", "bc"});
  r = tie.push("abcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
}

TEST(StopStrings, NoStopsReleasesEverything) {
  StopStringMatcher m;
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
}
