// The settings read once (common/settings.h): each variable read, a bad value refused naming it,
// and ScopedSettings putting back what was there.
#include "common/settings.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace dmpcheck {
namespace {

using Environment = std::map<std::string, std::string>;

TEST(Settings, EachVariableIsReadIntoItsSetting) {
  const Settings s = Settings::from_environment(Environment{{"DMPCHECK_TORCHREC_REPO", "/srv/torchrec"},
                                                            {"DMPCHECK_TORCHREC_ENVS", "/srv/envs"},
                                                            {"DMPCHECK_RANKS", "exec"},
                                                            {"DMPCHECK_WARM_INTERPRETERS", "0"},
                                                            {"DMPCHECK_KEEP_EXCHANGE", ""}});
  EXPECT_EQ(s.torchrec_repo, "/srv/torchrec");
  EXPECT_EQ(s.torchrec_envs, "/srv/envs");
  EXPECT_TRUE(s.exec_ranks);
  EXPECT_EQ(s.warm_interpreters, 0);
  EXPECT_FALSE(s.warm_prestart.has_value());
  EXPECT_TRUE(s.keep_exchange);  // set, even empty
  // Unset, each has its default: the environments under XDG_CACHE_HOME, else HOME's .cache.
  const Settings defaults = Settings::from_environment(Environment{{"HOME", "/home/u"}});
  EXPECT_EQ(defaults.torchrec_envs, "/home/u/.cache/dmpcheck/torchrec");
  EXPECT_FALSE(defaults.exec_ranks || defaults.keep_exchange || defaults.install_releases);
  EXPECT_EQ(Settings::from_environment(Environment{{"XDG_CACHE_HOME", "/c"}}).torchrec_envs, "/c/dmpcheck/torchrec");
}

TEST(Settings, AValueThatIsNotWhatItShouldBeIsRefusedNamingItsVariable) {
  EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "DMPCHECK_RANKS='sometimes': expected exec or fork", [] {
    Settings::from_environment(Environment{{"DMPCHECK_RANKS", "sometimes"}});
  }));
  for (const char* bad : {"-1", "two", "3x", ""}) {
    const Environment environment{{"DMPCHECK_WARM_PRESTART", bad}};
    if (*bad == '\0') {
      EXPECT_FALSE(Settings::from_environment(environment).warm_prestart.has_value());  // empty: not set
    } else {
      EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "DMPCHECK_WARM_PRESTART=", [&] {
        Settings::from_environment(environment);
      })) << bad;
    }
  }
}

TEST(Settings, ScopedSettingsPutBackTheSettingsBefore) {
  const std::string before = settings().torchrec_repo;
  {
    Settings changed = settings();
    changed.torchrec_repo = before + "/elsewhere";
    const ScopedSettings scoped(changed);
    EXPECT_EQ(settings().torchrec_repo, before + "/elsewhere");
  }
  EXPECT_EQ(settings().torchrec_repo, before);
}

TEST(Settings, ARepositoryThatGitWouldReadAsAnOptionOrAHelperIsRefusedBeforeGitRuns) {
  // Each as the flag and as the variable: git never sees them.
  for (const char* bad : {"-h", "--upload-pack=touch /tmp/planted", "fd::3", "ext::sh -c touch% /tmp/planted",
                          "ftp://example.org/torchrec.git", "/path/with\nnewline"}) {
    EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, std::string("--torchrec-repo '") + bad + "'", [&] {
      check_torchrec_repo(bad, "--torchrec-repo");
    })) << bad;
    EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "DMPCHECK_TORCHREC_REPO", [&] {
      Settings::from_environment(Environment{{"DMPCHECK_TORCHREC_REPO", bad}});
    })) << bad;
  }
  for (const char* good : {"/srv/torchrec", "../shared/torchrec.bundle", "https://github.com/pytorch/torchrec",
                           "ssh://git@example.org/torchrec.git", "git@github.com:pytorch/torchrec.git",
                           "file:///srv/torchrec.git", "torchrec-main"}) {
    EXPECT_NO_THROW(check_torchrec_repo(good, "--torchrec-repo")) << good;
  }
}

}  // namespace
}  // namespace dmpcheck
