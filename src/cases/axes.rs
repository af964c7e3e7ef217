//! One set of case axes as written in YAML: every field optional, each a value or a list.

use super::profiles::{AdvPattern, DataProfile, MaskPattern, Sharding, TierName};
use crate::spec::{DType, IsLevel, Level, LogitsDtype, LossType};
use serde::Deserialize;

/// A single value or a list of values (`v: 2049` or `v: [2049, 32001]`).
#[derive(Debug, Clone, PartialEq)]
pub enum OneOrMany<T> {
    /// `key: value`
    One(T),
    /// `key: [a, b, ...]`
    Many(Vec<T>),
}

/// Deserialises a list element by element and a scalar as one value, so the element
/// type's own error ("unknown loss_type `grpoo`, expected ...") reaches the user.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{value, IntoDeserializer, SeqAccess, Visitor};
        use std::marker::PhantomData;
        struct V<T>(PhantomData<T>);
        macro_rules! scalar {
            ($($f:ident: $t:ty),+) => {$(
                fn $f<E: serde::de::Error>(self, x: $t) -> Result<Self::Value, E> {
                    T::deserialize(x.into_deserializer()).map(OneOrMany::One)
                }
            )+};
        }
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    v.push(x);
                }
                Ok(OneOrMany::Many(v))
            }
            fn visit_str<E: serde::de::Error>(self, x: &str) -> Result<Self::Value, E> {
                T::deserialize(value::StrDeserializer::<E>::new(x)).map(OneOrMany::One)
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                T::deserialize(value::UnitDeserializer::<E>::new()).map(OneOrMany::One)
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                self.visit_unit()
            }
            scalar!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A value or `null` (for δ and max_completion_length: `null` means unset).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Maybe<T>(pub Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Maybe<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IntoDeserializer, Visitor};
        use std::marker::PhantomData;
        struct V<T>(PhantomData<T>);
        macro_rules! scalar {
            ($($f:ident: $t:ty),+) => {$(
                fn $f<E: serde::de::Error>(self, x: $t) -> Result<Self::Value, E> {
                    T::deserialize(x.into_deserializer()).map(|v| Maybe(Some(v)))
                }
            )+};
        }
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Maybe<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number or null")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Maybe(None))
            }
            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Maybe(None))
            }
            scalar!(visit_i64: i64, visit_u64: u64, visit_f64: f64);
        }
        d.deserialize_any(V(PhantomData))
    }
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
    delta: Maybe<f64>,
    /// grpo | bnpo | dr_grpo.
    loss_type: LossType,
    /// L for dr_grpo (`null` = T).
    max_completion_length: Maybe<usize>,
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
    /// Only backends that compile without executing (tpu-aot) run the case: no inputs,
    /// oracle or golden values (shapes whose f64 oracle would take hours on a CPU).
    compile_only: bool,
    /// Devices (1, 2, 4, 8); > 1 needs `sharding`.
    devices: usize,
    /// batch | vocab (multi-device cases).
    sharding: Sharding,
);
