//! The vLLM performance model, in virtual time (being built, issue 3).
