//! Replica decisions: the HPA replacement and scale to zero (see issue 4).
