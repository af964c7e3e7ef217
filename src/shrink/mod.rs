//! Shrinking a failing trial: the smallest case (and trajectory length) that still fails
//! the same way (docs/shrink.md).
//!
//! The parts: [`subject`] (what is shrunk: a case and, for a trajectory, its steps),
//! [`reduce`] (the smaller candidates of a subject, axis by axis), [`signature`] (how a
//! trial failed, and whether a candidate's outcome fails the same way), [`search`] (the
//! greedy, deterministic search and the boundaries it finds). Running a candidate is the
//! caller's: the search takes a function from subject to [`search::Observation`].

pub mod reduce;
pub mod search;
pub mod signature;
pub mod subject;

pub use search::{shrink, Boundary, Event, Limits, Observation, Report};
pub use signature::Signature;
pub use subject::Subject;
