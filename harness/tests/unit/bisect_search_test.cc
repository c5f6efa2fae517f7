// The bisection's search over made-up observations: which points it visits and where it stops.
#include "suite/bisect_search.h"

#include <set>

#include <gtest/gtest.h>

namespace dmpcheck::run {
namespace {

// One point per letter: B the old behaviour, F the new one, E an error neither end names, X a
// commit that does not import, E/G two different errors.
struct Line {
  std::vector<SearchSeen> seen;
  std::set<size_t> visited;
  explicit Line(const std::string& letters) {
    for (char c : letters) {
      SearchSeen s;
      s.ran = c != 'X';
      s.error = c == 'E' || c == 'G';
      if (s.ran) s.obs = {std::string(1, c)};
      seen.push_back(s);
    }
  }
  SearchResult search(bool commits) {
    return bisect_search(
        seen.size(), commits,
        [this](size_t i) -> const SearchSeen& {
          visited.insert(i);
          return seen[i];
        },
        [] { return false; });
  }
};

TEST(BisectSearch, FindsTheFirstPointThatBehavesDifferentlyInLogSteps) {
  Line line(std::string(40, 'B') + std::string(60, 'F'));
  const SearchResult r = line.search(true);
  ASSERT_TRUE(r.ran);
  EXPECT_EQ(r.lo, 39u);
  EXPECT_EQ(r.hi, 40u);
  EXPECT_TRUE(r.hi_behaves);
  EXPECT_LE(line.visited.size(), 9u);
}

TEST(BisectSearch, AnErrorBetweenABugAndItsFixIsSkippedNotNamed) {
  // A broken stretch (E) between the bug (B) and the fix (F): the fix is what is asked for.
  Line line(std::string(30, 'B') + std::string(10, 'E') + std::string(60, 'F'));
  const SearchResult r = line.search(true);
  ASSERT_TRUE(r.ran);
  EXPECT_TRUE(r.hi_behaves);
  EXPECT_EQ(line.seen[r.hi].obs, std::vector<std::string>{"F"});
  EXPECT_EQ(line.seen[r.lo].obs, std::vector<std::string>{"B"});
}

TEST(BisectSearch, ARepeatedErrorBeforeCommitsThatDoNotImportIsTheChangeFoundInLogSteps) {
  // What `releases --commits` met over 1.0.0..1.2.0: the bug, then 250 commits that all fail the
  // same way (the EmbeddingCollection on CPU), then commits that do not import over the older
  // environment.  It used to skip the failing ones one by one.
  Line line(std::string(100, 'B') + std::string(250, 'E') + std::string(50, 'X'));
  const SearchResult r = line.search(true);
  ASSERT_TRUE(r.ran);
  EXPECT_TRUE(r.hi_behaves);
  EXPECT_EQ(r.lo, 99u);
  EXPECT_EQ(r.hi, 100u);
  EXPECT_LE(line.visited.size(), 14u) << "the failing commits were walked";
  EXPECT_TRUE(r.untested.empty());
}

TEST(BisectSearch, OneErrorAloneStillDecidesNothing) {
  // A single failing commit among the old behaviour, then commits that do not import: no change
  // of behaviour is named; the first commit that does not import is.
  Line line(std::string(30, 'B') + "E" + std::string(10, 'B') + std::string(20, 'X'));
  const SearchResult r = line.search(true);
  ASSERT_TRUE(r.ran);
  EXPECT_TRUE(line.visited.count(30)) << "the failing commit was not met";
  EXPECT_FALSE(r.hi_behaves);
  EXPECT_EQ(r.hi, 41u);
  EXPECT_EQ(r.lo, 40u);
}

TEST(BisectSearch, TwoDifferentErrorsDoNotMakeABehaviour) {
  Line line(std::string(10, 'B') + "EG" + std::string(10, 'X'));
  const SearchResult r = line.search(true);
  ASSERT_TRUE(r.ran);
  EXPECT_TRUE(line.visited.count(10) && line.visited.count(11));
  EXPECT_FALSE(r.hi_behaves);
  EXPECT_EQ(r.hi, 12u);
}

TEST(BisectSearch, ReleasesThatAreNotInstalledArePassedOverAtTheEnds) {
  Line line("XBBFFX");
  const SearchResult r = line.search(false);
  ASSERT_TRUE(r.ran);
  EXPECT_EQ(r.lo, 2u);
  EXPECT_EQ(r.hi, 3u);
  EXPECT_EQ(std::set<size_t>(r.untested.begin(), r.untested.end()), (std::set<size_t>{0, 5}));
}

}  // namespace
}  // namespace dmpcheck::run
