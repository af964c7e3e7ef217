//! One set of case axes as written in YAML: every field optional, each a value or a list.

use super::profiles::{AdvPattern, DataProfile, MaskPattern, TierName};
use crate::spec::{DType, IsLevel, Level, LogitsDtype, LossType};
use serde::Deserialize;

/// A single value or a list of values (`v: 2049` or `v: [2049, 32001]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// `key: value`
    One(T),
    /// `key: [a, b, ...]`
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// The values as a list.
    pub fn values(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

macro_rules! axes {
    ($($(#[$m:meta])* $field:ident : $t:ty),+ $(,)?) => {
        /// Case axes: used for `defaults`, `fixed`, `product`, `zip` and `cases` entries.
        /// Unknown keys are errors (with file, line and key).
        #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Axes {
            $($(#[$m])* pub $field: Option<OneOrMany<$t>>,)+
        }

        /// One concrete choice for every axis that was set.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct Point {
            $(#[allow(missing_docs)] pub $field: Option<$t>,)+
        }

        impl Axes {
            /// Names of the keys that are set.
            pub fn keys(&self) -> Vec<&'static str> {
                let mut k = Vec::new();
                $(if self.$field.is_some() { k.push(stringify!($field)); })+
                k
            }

            /// Number of values of each set key, in `keys()` order.
            pub fn lens(&self) -> Vec<usize> {
                let mut l = Vec::new();
                $(if let Some(v) = &self.$field { l.push(v.values().len()); })+
                l
            }

            /// The cartesian product of the set axes (one empty point when none is set).
            pub fn product(&self) -> Vec<Point> {
                let mut out = vec![Point::default()];
                $(if let Some(vals) = &self.$field {
                    let vals = vals.values();
                    out = out.into_iter().flat_map(|p| vals.iter().map(move |v| {
                        let mut q = p.clone();
                        q.$field = Some(v.clone());
                        q
                    })).collect();
                })+
                out
            }

            /// The i-th value of every set axis (for `zip`; lengths checked by the caller).
            pub fn nth(&self, i: usize) -> Point {
                Point { $($field: self.$field.as_ref().map(|v| v.values()[i].clone()),)+ }
            }
        }

        impl Point {
            /// Fields of `other` that are set override those of `self`.
            pub fn merged(&self, other: &Point) -> Point {
                Point { $($field: other.$field.clone().or_else(|| self.$field.clone()),)+ }
            }

            /// Keys set in both points.
            pub fn overlap(&self, other: &Point) -> Vec<&'static str> {
                let mut k = Vec::new();
                $(if self.$field.is_some() && other.$field.is_some() { k.push(stringify!($field)); })+
                k
            }
        }
    };
}

axes!(
    /// logits | fused
    level: Level,
    /// f32 | bf16 | f16
    dtype: DType,
    /// Batch size.
    b: usize,
    /// Sequence length.
    t: usize,
    /// Vocabulary size.
    v: usize,
    /// Hidden size (fused).
    h: usize,
    /// τ.
    temperature: f64,
    /// ε_low.
    epsilon_low: f64,
    /// ε_high.
    epsilon_high: f64,
    /// β.
    beta: f64,
    /// δ (`null` = unset).
    delta: Option<f64>,
    /// grpo | bnpo | dr_grpo.
    loss_type: LossType,
    /// L for dr_grpo (`null` = T).
    max_completion_length: Option<usize>,
    /// token | sequence.
    importance_sampling_level: IsLevel,
    /// f32 | input (fused).
    logits_dtype: LogitsDtype,
    /// Data profile.
    profile: DataProfile,
    /// Mask pattern.
    mask: MaskPattern,
    /// Advantage pattern.
    advantages: AdvPattern,
    /// Tolerance tier.
    tier: TierName,
);
