// Compiled as part of the dmp layer (by the `layering` test only): dmp sits below run, so this
// include must fail to resolve.  If it compiles, the layers are no longer enforced.
#include "run/launcher.h"
