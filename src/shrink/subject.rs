//! What a shrink search moves through: a case and, for a trajectory trial, its steps.

use crate::cases::Case;

/// A point of the search: the case and, for a trajectory trial, its number of steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject {
    /// The case (its id names it; tier and compile-only are the starting case's).
    pub case: Case,
    /// The trajectory's steps (None for a per-call trial).
    pub steps: Option<usize>,
}

impl Subject {
    /// The case's rows, B·T.
    pub fn rows(&self) -> usize {
        self.case.shape.rows()
    }

    /// B·T·V: the size the search drives down.
    pub fn volume(&self) -> usize {
        self.rows() * self.case.shape.v
    }

    /// One line naming it: the case id, with the steps of a trajectory.
    pub fn describe(&self) -> String {
        match self.steps {
            Some(s) => format!("{} ({s} steps)", self.case.id),
            None => self.case.id.clone(),
        }
    }
}
