#include "suite/bisect_search.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace dmpcheck::run {

SearchResult bisect_search(size_t points, bool commits, const std::function<const SearchSeen&(size_t)>& visit,
                           const std::function<bool()>& interrupted) {
  SearchResult r;
  if (points < 2) return r;
  size_t& lo = r.lo;
  size_t& hi = r.hi;
  lo = 0;
  hi = points - 1;
  while (lo < hi && !visit(lo).ran && !commits) r.untested.push_back(lo++);
  if (lo >= hi || !visit(lo).ran) return r;
  while (hi > lo && !visit(hi).ran && !commits) r.untested.push_back(hi--);
  if (lo >= hi) return r;
  r.ran = true;
  r.hi_behaves = visit(hi).ran;
  if (r.hi_behaves && visit(lo).obs == visit(hi).obs) return r;
  std::vector<bool> skipped(points, false);
  std::map<std::vector<std::string>, size_t> skipped_errors;  // an error seen, and where first
  for (;;) {
    if (interrupted()) return r;
    // The untried point nearest the middle of what is left.
    std::optional<size_t> mid;
    const double middle = (static_cast<double>(lo) + static_cast<double>(hi)) / 2;
    for (size_t i = lo + 1; i < hi; ++i) {
      if (skipped[i]) continue;
      if (!mid || std::abs(static_cast<double>(i) - middle) < std::abs(static_cast<double>(*mid) - middle)) mid = i;
    }
    if (!mid) break;
    const SearchSeen& s = visit(*mid);
    if (!s.ran && commits && !r.hi_behaves) {
      hi = *mid;  // the commits that do not import begin here or earlier
      continue;
    }
    const bool decides =
        s.ran && (!commits || !s.error || s.obs == visit(lo).obs || (r.hi_behaves && s.obs == visit(hi).obs));
    if (!decides) {
      if (s.ran && commits && !r.hi_behaves) {
        const auto it = skipped_errors.find(s.obs);
        if (it != skipped_errors.end() && it->second > lo && it->second < hi) {
          // Two commits fail alike: that error is what the commits change to; the older of the
          // two is the new end, and both decided after all.
          const size_t older = std::min(it->second, *mid);
          r.untested.erase(std::remove(r.untested.begin(), r.untested.end(), it->second), r.untested.end());
          skipped[it->second] = false;
          hi = older;
          r.hi_behaves = true;
          continue;
        }
        skipped_errors[s.obs] = *mid;
      }
      skipped[*mid] = true;
      r.untested.push_back(*mid);
      continue;
    }
    if (s.obs == visit(lo).obs) {
      lo = *mid;
    } else {
      hi = *mid;
      r.hi_behaves = true;
    }
  }
  return r;
}

}  // namespace dmpcheck::run
