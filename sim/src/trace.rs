//! Trace readers (being built, issue 6).
