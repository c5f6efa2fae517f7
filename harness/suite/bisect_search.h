// The search of a bisection, apart from running anything: over points ordered oldest first, each
// visited at most once through a callback, it narrows [lo, hi] to the first point that behaves
// differently from the oldest.  `dmpcheck bisect` and `dmpcheck releases --commits` run it over
// releases and commits (suite/releases.cc); the unit tests over made-up observations.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace dmpcheck::run {

// What one point showed, as the search weighs it.
struct SearchSeen {
  bool ran = false;              // it ran (a release installed, a commit that imports)
  bool error = false;            // one of its cells ended in an error no named behaviour expects
  std::vector<std::string> obs;  // one behaviour per cell, compared between points
};

struct SearchResult {
  bool ran = false;              // the old end ran (and some point after it): there was a search
  size_t lo = 0, hi = 0;         // hi = lo + 1 where the change was found; else what is left between
  bool hi_behaves = false;       // hi ran and showed a behaviour (else: the first commit that does not import)
  std::vector<size_t> untested;  // points tried that decided nothing
};

// Releases (`commits` false): a point that does not run is passed over (at an end, the next one
// inward is tried).  Commits (`commits` true): the newer ones may not import over the environment;
// where the new end does not, the first that does not import is searched for as well.  Among
// commits, a point whose error is neither end's behaviour decides nothing and is skipped, as
// `git bisect skip` does -- unless two commits show the same error while the new end shows no
// behaviour: then that error is the behaviour the commits change to, and its first commit is
// searched for (without this, a range whose newer half all fails the same way was walked one
// commit at a time).  `interrupted` stops the search where it is.
SearchResult bisect_search(size_t points, bool commits, const std::function<const SearchSeen&(size_t)>& visit,
                           const std::function<bool()>& interrupted);

}  // namespace dmpcheck::run
