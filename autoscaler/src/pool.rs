//! The GPU pool manager: capacity pods and reservations (being built, issue 5).
