//! The memory and compute recommendation for one replica (see issue 2).
