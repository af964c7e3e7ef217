//! What an implementation returns: SPEC outputs as f32 host tensors.

use crate::spec::OutputName;
use std::collections::{BTreeMap, BTreeSet};

/// One output tensor on the host, widened to f32 (bf16/f16 widen exactly).
#[derive(Debug, Clone, PartialEq)]
pub struct OutTensor {
    /// Dimensions, row-major ([] for the scalar loss).
    pub shape: Vec<usize>,
    /// Elements.
    pub data: Vec<f32>,
}

/// Every output an implementation produced for one case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outputs {
    /// By SPEC name.
    pub tensors: BTreeMap<OutputName, OutTensor>,
    /// Outputs the implementation declares it does not produce (a partial kernel's
    /// entropy): absent from `tensors`, reported "not provided", never gated.
    pub not_provided: BTreeSet<OutputName>,
}

impl Outputs {
    /// Adds an output.
    pub fn insert(&mut self, name: OutputName, shape: Vec<usize>, data: Vec<f32>) {
        self.tensors.insert(name, OutTensor { shape, data });
    }

    /// An output by name.
    pub fn get(&self, name: OutputName) -> Option<&OutTensor> {
        self.tensors.get(&name)
    }
}
