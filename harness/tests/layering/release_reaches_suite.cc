// Compiled against the release layer (by the `layering` tests only): what runs many cells is above
// a cell, so this include must fail to resolve.
#include "suite/cells.h"
