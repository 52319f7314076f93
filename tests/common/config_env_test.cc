// Environment substitution in config text: one config file serves compose
// and Kubernetes, each filling in its own host names.
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

class ExpandEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("PST_TEST_HOST", "ps-0.ps.default.svc", 1);
    setenv("PST_TEST_EMPTY", "", 1);
    unsetenv("PST_TEST_UNSET");
  }
  void TearDown() override {
    unsetenv("PST_TEST_HOST");
    unsetenv("PST_TEST_EMPTY");
  }
};

TEST_F(ExpandEnvironmentTest, ReplacesVariablesAndDefaults) {
  struct Case {
    std::string text;
    std::string expanded;
  };
  std::vector<Case> cases = {
      {"no variables at all", "no variables at all"},
      {"ps: \"${PST_TEST_HOST}:50051\"", "ps: \"ps-0.ps.default.svc:50051\""},
      {"ps: \"${PST_TEST_HOST:-localhost}:1\"", "ps: \"ps-0.ps.default.svc:1\""},
      {"workers: ${PST_TEST_UNSET:-2}", "workers: 2"},
      {"workers: ${PST_TEST_EMPTY:-3}", "workers: 3"},
      {"workers: ${PST_TEST_UNSET:-}", "workers: "},
      {"cost: $$5 and $ alone", "cost: $5 and $ alone"},
      {"${PST_TEST_HOST}${PST_TEST_UNSET:-x}", "ps-0.ps.default.svcx"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<std::string> expanded = ExpandEnvironment(c.text, "cfg");
    ASSERT_TRUE(expanded.ok()) << expanded.status();
    EXPECT_EQ(*expanded, c.expanded);
  }
}

TEST_F(ExpandEnvironmentTest, MistakesNameTheLine) {
  struct Case {
    std::string text;
    std::string message;
  };
  std::vector<Case> cases = {
      {"a\nworkers: ${PST_TEST_UNSET}", "cfg:2: environment variable PST_TEST_UNSET is not set"},
      {"a\nb\nps: \"${PST_TEST_EMPTY}\"", "cfg:3: environment variable PST_TEST_EMPTY is not set"},
      {"ps: \"${PST_TEST_HOST\"\n}", "cfg:1: \"${\" must start ${NAME}"},
      {"ps: \"${1ABC}\"", "cfg:1: \"${\" must start"},
      {"ps: \"${}\"", "cfg:1: \"${\" must start"},
      {"ps: \"${NO_CLOSE", "cfg:1: \"${\" must start"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<std::string> expanded = ExpandEnvironment(c.text, "cfg");
    ASSERT_FALSE(expanded.ok());
    EXPECT_EQ(expanded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(expanded.status().message()), HasSubstr(c.message));
  }
}

TEST_F(ExpandEnvironmentTest, ParseConfigExpandsBeforeParsing) {
  setenv("PST_TEST_WORKERS", "5", 1);
  absl::StatusOr<JobConfig> config = ParseConfig(
      "cluster { ps: \"${PST_TEST_HOST}:50051\" workers: ${PST_TEST_WORKERS:-2} }", "cfg");
  unsetenv("PST_TEST_WORKERS");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->cluster().ps(0), "ps-0.ps.default.svc:50051");
  EXPECT_EQ(config->cluster().workers(), 5);
}

TEST(SecurityConfigTest, TlsAndAuthMistakesAreNamed) {
  struct Case {
    std::string cluster;
    std::string message;
  };
  std::vector<Case> cases = {
      {"tls { cert: \"c.pem\" key: \"k.pem\" }", "cluster.tls.ca is empty"},
      {"auth { token_env: \"T\" }", "cluster.auth needs cluster.tls"},
      {"tls { ca: \"ca.pem\" } auth { }", "exactly one of token_file and token_env"},
      {"tls { ca: \"ca.pem\" } auth { token_env: \"T\" token_file: \"f\" }",
       "exactly one of token_file and token_env"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cluster);
    absl::StatusOr<JobConfig> config = ParseConfig(
        "cluster { ps: \"127.0.0.1:1\" workers: 1 " + c.cluster +
            " } training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} } "
            "dataset { quadratic { examples: 4 } } }",
        "cfg");
    ASSERT_TRUE(config.ok()) << config.status();
    ApplyDefaults(&*config);
    absl::Status status = ValidateConfig(*config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
