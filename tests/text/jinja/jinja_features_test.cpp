// One Jinja construct per snippet, each rendered by transformers' jinja2 environment
// (data/make_chat_template_golden.py, "features"): the interpreter must print the same bytes, or
// fail where jinja2 fails with the same message.
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/jinja.hpp"
#include "tokenizer_test_util.hpp"

using json = nlohmann::ordered_json;

namespace {

json golden() {
  std::ifstream f(exl3::test::tokenizer_data_dir() / "golden_chat_templates.json");
  return json::parse(f);
}

}  // namespace

TEST(JinjaFeatures, MatchJinja2) {
  const json g = golden();
  ASSERT_GE(g["features"].size(), 30u);
  for (const auto& f : g["features"]) {
    const std::string name = f["name"];
    SCOPED_TRACE(name);
    std::string got, err;
    try {
      got = exl3::jinja::Template(f["template"].get<std::string>(), name).render(f["context"]);
    } catch (const exl3::Error& e) {
      err = e.what();
    }
    if (f.contains("error")) {
      EXPECT_THAT(err, ::testing::HasSubstr(f["error"].get<std::string>())) << "rendered: " << got;
    } else {
      EXPECT_EQ(err, "");
      EXPECT_EQ(got, f["expected"].get<std::string>());
    }
  }
}
