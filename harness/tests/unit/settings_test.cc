// The settings read once (common/settings.h): each variable read, a bad value refused naming it,
// and ScopedSettings putting back what was there.
#include "common/settings.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "test_util.h"

namespace dmpcheck {
namespace {

// Sets `name` for one test, then puts back what was there.
class Variable {
 public:
  Variable(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    ::setenv(name, value, 1);
  }
  ~Variable() {
    if (before_.empty()) {
      ::unsetenv(name_);
    } else {
      ::setenv(name_, before_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string before_;
};

TEST(Settings, EachVariableIsReadIntoItsSetting) {
  const Variable repo("DMPCHECK_TORCHREC_REPO", "/srv/torchrec");
  const Variable envs("DMPCHECK_TORCHREC_ENVS", "/srv/envs");
  const Variable ranks("DMPCHECK_RANKS", "exec");
  const Variable warm("DMPCHECK_WARM_INTERPRETERS", "0");
  const Variable keep("DMPCHECK_KEEP_EXCHANGE", "");
  const Settings s = Settings::from_environment();
  EXPECT_EQ(s.torchrec_repo, "/srv/torchrec");
  EXPECT_EQ(s.torchrec_envs, "/srv/envs");
  EXPECT_TRUE(s.exec_ranks);
  EXPECT_EQ(s.warm_interpreters, 0);
  EXPECT_FALSE(s.warm_prestart.has_value());
  EXPECT_TRUE(s.keep_exchange);  // set, even empty
}

TEST(Settings, AValueThatIsNotWhatItShouldBeIsRefusedNamingItsVariable) {
  {
    const Variable ranks("DMPCHECK_RANKS", "sometimes");
    EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "DMPCHECK_RANKS='sometimes': expected exec or fork",
                                     [] { Settings::from_environment(); }));
  }
  for (const char* bad : {"-1", "two", "3x", ""}) {
    const Variable warm("DMPCHECK_WARM_PRESTART", bad);
    if (*bad == '\0') {
      EXPECT_FALSE(Settings::from_environment().warm_prestart.has_value());  // empty: not set
    } else {
      EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput, "DMPCHECK_WARM_PRESTART=", [] {
        Settings::from_environment();
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

}  // namespace
}  // namespace dmpcheck
