// Compiled against the run layer (by the `layering` tests only): a release is above the ranks and
// the wire, so this include must fail to resolve.
#include "release/torchrec_systems.h"
