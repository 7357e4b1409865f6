// Python's multi-character case mappings (Unicode SpecialCasing, unconditional part): the
// characters whose str.upper() or str.title() is longer than one character. Everything else maps
// one to one, and utf8proc's simple mappings agree with Python's there. Generated from Python
// 3.11 (Unicode 14) with
//   [c for c in range(0x110000) if len(chr(c).upper()) > 1 or len(chr(c).title()) > 1]
// writing chr(c).upper() and chr(c).title() as UTF-8.
#include "unicode.hpp"

#include <algorithm>
#include <array>

namespace exl3::jinja::uni {

namespace {

struct Special {
  uint32_t cp;
  const char* upper;  // str.upper(), UTF-8
  const char* title;  // str.title() of the character alone, UTF-8
};

constexpr std::array<Special, 102> kSpecial = {{
    {0x00DF, "\x53\x53", "\x53\x73"},                                  // U+0053 U+0053
    {0x0149, "\xca\xbc\x4e", "\xca\xbc\x4e"},                          // U+02BC U+004E
    {0x01F0, "\x4a\xcc\x8c", "\x4a\xcc\x8c"},                          // U+004A U+030C
    {0x0390, "\xce\x99\xcc\x88\xcc\x81", "\xce\x99\xcc\x88\xcc\x81"},  // U+0399 U+0308 U+0301
    {0x03B0, "\xce\xa5\xcc\x88\xcc\x81", "\xce\xa5\xcc\x88\xcc\x81"},  // U+03A5 U+0308 U+0301
    {0x0587, "\xd4\xb5\xd5\x92", "\xd4\xb5\xd6\x82"},                  // U+0535 U+0552
    {0x1E96, "\x48\xcc\xb1", "\x48\xcc\xb1"},                          // U+0048 U+0331
    {0x1E97, "\x54\xcc\x88", "\x54\xcc\x88"},                          // U+0054 U+0308
    {0x1E98, "\x57\xcc\x8a", "\x57\xcc\x8a"},                          // U+0057 U+030A
    {0x1E99, "\x59\xcc\x8a", "\x59\xcc\x8a"},                          // U+0059 U+030A
    {0x1E9A, "\x41\xca\xbe", "\x41\xca\xbe"},                          // U+0041 U+02BE
    {0x1F50, "\xce\xa5\xcc\x93", "\xce\xa5\xcc\x93"},                  // U+03A5 U+0313
    {0x1F52, "\xce\xa5\xcc\x93\xcc\x80", "\xce\xa5\xcc\x93\xcc\x80"},  // U+03A5 U+0313 U+0300
    {0x1F54, "\xce\xa5\xcc\x93\xcc\x81", "\xce\xa5\xcc\x93\xcc\x81"},  // U+03A5 U+0313 U+0301
    {0x1F56, "\xce\xa5\xcc\x93\xcd\x82", "\xce\xa5\xcc\x93\xcd\x82"},  // U+03A5 U+0313 U+0342
    {0x1F80, "\xe1\xbc\x88\xce\x99", "\xe1\xbe\x88"},                  // U+1F08 U+0399
    {0x1F81, "\xe1\xbc\x89\xce\x99", "\xe1\xbe\x89"},                  // U+1F09 U+0399
    {0x1F82, "\xe1\xbc\x8a\xce\x99", "\xe1\xbe\x8a"},                  // U+1F0A U+0399
    {0x1F83, "\xe1\xbc\x8b\xce\x99", "\xe1\xbe\x8b"},                  // U+1F0B U+0399
    {0x1F84, "\xe1\xbc\x8c\xce\x99", "\xe1\xbe\x8c"},                  // U+1F0C U+0399
    {0x1F85, "\xe1\xbc\x8d\xce\x99", "\xe1\xbe\x8d"},                  // U+1F0D U+0399
    {0x1F86, "\xe1\xbc\x8e\xce\x99", "\xe1\xbe\x8e"},                  // U+1F0E U+0399
    {0x1F87, "\xe1\xbc\x8f\xce\x99", "\xe1\xbe\x8f"},                  // U+1F0F U+0399
    {0x1F88, "\xe1\xbc\x88\xce\x99", "\xe1\xbe\x88"},                  // U+1F08 U+0399
    {0x1F89, "\xe1\xbc\x89\xce\x99", "\xe1\xbe\x89"},                  // U+1F09 U+0399
    {0x1F8A, "\xe1\xbc\x8a\xce\x99", "\xe1\xbe\x8a"},                  // U+1F0A U+0399
    {0x1F8B, "\xe1\xbc\x8b\xce\x99", "\xe1\xbe\x8b"},                  // U+1F0B U+0399
    {0x1F8C, "\xe1\xbc\x8c\xce\x99", "\xe1\xbe\x8c"},                  // U+1F0C U+0399
    {0x1F8D, "\xe1\xbc\x8d\xce\x99", "\xe1\xbe\x8d"},                  // U+1F0D U+0399
    {0x1F8E, "\xe1\xbc\x8e\xce\x99", "\xe1\xbe\x8e"},                  // U+1F0E U+0399
    {0x1F8F, "\xe1\xbc\x8f\xce\x99", "\xe1\xbe\x8f"},                  // U+1F0F U+0399
    {0x1F90, "\xe1\xbc\xa8\xce\x99", "\xe1\xbe\x98"},                  // U+1F28 U+0399
    {0x1F91, "\xe1\xbc\xa9\xce\x99", "\xe1\xbe\x99"},                  // U+1F29 U+0399
    {0x1F92, "\xe1\xbc\xaa\xce\x99", "\xe1\xbe\x9a"},                  // U+1F2A U+0399
    {0x1F93, "\xe1\xbc\xab\xce\x99", "\xe1\xbe\x9b"},                  // U+1F2B U+0399
    {0x1F94, "\xe1\xbc\xac\xce\x99", "\xe1\xbe\x9c"},                  // U+1F2C U+0399
    {0x1F95, "\xe1\xbc\xad\xce\x99", "\xe1\xbe\x9d"},                  // U+1F2D U+0399
    {0x1F96, "\xe1\xbc\xae\xce\x99", "\xe1\xbe\x9e"},                  // U+1F2E U+0399
    {0x1F97, "\xe1\xbc\xaf\xce\x99", "\xe1\xbe\x9f"},                  // U+1F2F U+0399
    {0x1F98, "\xe1\xbc\xa8\xce\x99", "\xe1\xbe\x98"},                  // U+1F28 U+0399
    {0x1F99, "\xe1\xbc\xa9\xce\x99", "\xe1\xbe\x99"},                  // U+1F29 U+0399
    {0x1F9A, "\xe1\xbc\xaa\xce\x99", "\xe1\xbe\x9a"},                  // U+1F2A U+0399
    {0x1F9B, "\xe1\xbc\xab\xce\x99", "\xe1\xbe\x9b"},                  // U+1F2B U+0399
    {0x1F9C, "\xe1\xbc\xac\xce\x99", "\xe1\xbe\x9c"},                  // U+1F2C U+0399
    {0x1F9D, "\xe1\xbc\xad\xce\x99", "\xe1\xbe\x9d"},                  // U+1F2D U+0399
    {0x1F9E, "\xe1\xbc\xae\xce\x99", "\xe1\xbe\x9e"},                  // U+1F2E U+0399
    {0x1F9F, "\xe1\xbc\xaf\xce\x99", "\xe1\xbe\x9f"},                  // U+1F2F U+0399
    {0x1FA0, "\xe1\xbd\xa8\xce\x99", "\xe1\xbe\xa8"},                  // U+1F68 U+0399
    {0x1FA1, "\xe1\xbd\xa9\xce\x99", "\xe1\xbe\xa9"},                  // U+1F69 U+0399
    {0x1FA2, "\xe1\xbd\xaa\xce\x99", "\xe1\xbe\xaa"},                  // U+1F6A U+0399
    {0x1FA3, "\xe1\xbd\xab\xce\x99", "\xe1\xbe\xab"},                  // U+1F6B U+0399
    {0x1FA4, "\xe1\xbd\xac\xce\x99", "\xe1\xbe\xac"},                  // U+1F6C U+0399
    {0x1FA5, "\xe1\xbd\xad\xce\x99", "\xe1\xbe\xad"},                  // U+1F6D U+0399
    {0x1FA6, "\xe1\xbd\xae\xce\x99", "\xe1\xbe\xae"},                  // U+1F6E U+0399
    {0x1FA7, "\xe1\xbd\xaf\xce\x99", "\xe1\xbe\xaf"},                  // U+1F6F U+0399
    {0x1FA8, "\xe1\xbd\xa8\xce\x99", "\xe1\xbe\xa8"},                  // U+1F68 U+0399
    {0x1FA9, "\xe1\xbd\xa9\xce\x99", "\xe1\xbe\xa9"},                  // U+1F69 U+0399
    {0x1FAA, "\xe1\xbd\xaa\xce\x99", "\xe1\xbe\xaa"},                  // U+1F6A U+0399
    {0x1FAB, "\xe1\xbd\xab\xce\x99", "\xe1\xbe\xab"},                  // U+1F6B U+0399
    {0x1FAC, "\xe1\xbd\xac\xce\x99", "\xe1\xbe\xac"},                  // U+1F6C U+0399
    {0x1FAD, "\xe1\xbd\xad\xce\x99", "\xe1\xbe\xad"},                  // U+1F6D U+0399
    {0x1FAE, "\xe1\xbd\xae\xce\x99", "\xe1\xbe\xae"},                  // U+1F6E U+0399
    {0x1FAF, "\xe1\xbd\xaf\xce\x99", "\xe1\xbe\xaf"},                  // U+1F6F U+0399
    {0x1FB2, "\xe1\xbe\xba\xce\x99", "\xe1\xbe\xba\xcd\x85"},          // U+1FBA U+0399
    {0x1FB3, "\xce\x91\xce\x99", "\xe1\xbe\xbc"},                      // U+0391 U+0399
    {0x1FB4, "\xce\x86\xce\x99", "\xce\x86\xcd\x85"},                  // U+0386 U+0399
    {0x1FB6, "\xce\x91\xcd\x82", "\xce\x91\xcd\x82"},                  // U+0391 U+0342
    {0x1FB7, "\xce\x91\xcd\x82\xce\x99", "\xce\x91\xcd\x82\xcd\x85"},  // U+0391 U+0342 U+0399
    {0x1FBC, "\xce\x91\xce\x99", "\xe1\xbe\xbc"},                      // U+0391 U+0399
    {0x1FC2, "\xe1\xbf\x8a\xce\x99", "\xe1\xbf\x8a\xcd\x85"},          // U+1FCA U+0399
    {0x1FC3, "\xce\x97\xce\x99", "\xe1\xbf\x8c"},                      // U+0397 U+0399
    {0x1FC4, "\xce\x89\xce\x99", "\xce\x89\xcd\x85"},                  // U+0389 U+0399
    {0x1FC6, "\xce\x97\xcd\x82", "\xce\x97\xcd\x82"},                  // U+0397 U+0342
    {0x1FC7, "\xce\x97\xcd\x82\xce\x99", "\xce\x97\xcd\x82\xcd\x85"},  // U+0397 U+0342 U+0399
    {0x1FCC, "\xce\x97\xce\x99", "\xe1\xbf\x8c"},                      // U+0397 U+0399
    {0x1FD2, "\xce\x99\xcc\x88\xcc\x80", "\xce\x99\xcc\x88\xcc\x80"},  // U+0399 U+0308 U+0300
    {0x1FD3, "\xce\x99\xcc\x88\xcc\x81", "\xce\x99\xcc\x88\xcc\x81"},  // U+0399 U+0308 U+0301
    {0x1FD6, "\xce\x99\xcd\x82", "\xce\x99\xcd\x82"},                  // U+0399 U+0342
    {0x1FD7, "\xce\x99\xcc\x88\xcd\x82", "\xce\x99\xcc\x88\xcd\x82"},  // U+0399 U+0308 U+0342
    {0x1FE2, "\xce\xa5\xcc\x88\xcc\x80", "\xce\xa5\xcc\x88\xcc\x80"},  // U+03A5 U+0308 U+0300
    {0x1FE3, "\xce\xa5\xcc\x88\xcc\x81", "\xce\xa5\xcc\x88\xcc\x81"},  // U+03A5 U+0308 U+0301
    {0x1FE4, "\xce\xa1\xcc\x93", "\xce\xa1\xcc\x93"},                  // U+03A1 U+0313
    {0x1FE6, "\xce\xa5\xcd\x82", "\xce\xa5\xcd\x82"},                  // U+03A5 U+0342
    {0x1FE7, "\xce\xa5\xcc\x88\xcd\x82", "\xce\xa5\xcc\x88\xcd\x82"},  // U+03A5 U+0308 U+0342
    {0x1FF2, "\xe1\xbf\xba\xce\x99", "\xe1\xbf\xba\xcd\x85"},          // U+1FFA U+0399
    {0x1FF3, "\xce\xa9\xce\x99", "\xe1\xbf\xbc"},                      // U+03A9 U+0399
    {0x1FF4, "\xce\x8f\xce\x99", "\xce\x8f\xcd\x85"},                  // U+038F U+0399
    {0x1FF6, "\xce\xa9\xcd\x82", "\xce\xa9\xcd\x82"},                  // U+03A9 U+0342
    {0x1FF7, "\xce\xa9\xcd\x82\xce\x99", "\xce\xa9\xcd\x82\xcd\x85"},  // U+03A9 U+0342 U+0399
    {0x1FFC, "\xce\xa9\xce\x99", "\xe1\xbf\xbc"},                      // U+03A9 U+0399
    {0xFB00, "\x46\x46", "\x46\x66"},                                  // U+0046 U+0046
    {0xFB01, "\x46\x49", "\x46\x69"},                                  // U+0046 U+0049
    {0xFB02, "\x46\x4c", "\x46\x6c"},                                  // U+0046 U+004C
    {0xFB03, "\x46\x46\x49", "\x46\x66\x69"},                          // U+0046 U+0046 U+0049
    {0xFB04, "\x46\x46\x4c", "\x46\x66\x6c"},                          // U+0046 U+0046 U+004C
    {0xFB05, "\x53\x54", "\x53\x74"},                                  // U+0053 U+0054
    {0xFB06, "\x53\x54", "\x53\x74"},                                  // U+0053 U+0054
    {0xFB13, "\xd5\x84\xd5\x86", "\xd5\x84\xd5\xb6"},                  // U+0544 U+0546
    {0xFB14, "\xd5\x84\xd4\xb5", "\xd5\x84\xd5\xa5"},                  // U+0544 U+0535
    {0xFB15, "\xd5\x84\xd4\xbb", "\xd5\x84\xd5\xab"},                  // U+0544 U+053B
    {0xFB16, "\xd5\x8e\xd5\x86", "\xd5\x8e\xd5\xb6"},                  // U+054E U+0546
    {0xFB17, "\xd5\x84\xd4\xbd", "\xd5\x84\xd5\xad"},                  // U+0544 U+053D
}};

}  // namespace

const char* special_upper(uint32_t cp, bool title) {
  const auto it = std::lower_bound(kSpecial.begin(), kSpecial.end(), cp,
                                   [](const Special& s, uint32_t c) { return s.cp < c; });
  if (it == kSpecial.end() || it->cp != cp) return nullptr;
  return title ? it->title : it->upper;
}

}  // namespace exl3::jinja::uni
