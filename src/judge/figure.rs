//! The figures an expected failure states as data, and what kind of failure each stands
//! for (read off a trial's evidence by [`super::expected::measured`]).

use super::verdict::Reason;
use crate::spec::OutputName;

/// A measured figure an expected-failure entry names in its `expect:` map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Figure {
    /// `roofline_over_baseline`: the derived roofline over jax_baseline's (a speed failure).
    RooflineOverBaseline,
    /// `peak_over_floor`: the compiled peak over the floor (a memory failure).
    PeakOverFloor,
    /// `drift_over_bound`: a trajectory's worst drift over the bound of its required
    /// precision class's loop (a trajectory failure).
    DriftOverBound,
    /// `undeclared_matmuls`: f32 matmuls the platform computes below f32 that the
    /// implementation did not declare (a precision failure).
    UndeclaredMatmuls,
    /// An output's name (`dlm_head`, `dhidden`, ...): its norm-wise relative error against
    /// the oracle (a gate failure).
    RelativeError(OutputName),
    /// `non_finite_<output>` (`non_finite_loss`, ...): how many of the output's elements
    /// are NaN or ±inf (a gate failure no error norm measures).
    NonFinite(OutputName),
}

/// `non_finite_<output>` of each output, in [`OutputName::ALL`]'s order.
const NON_FINITE_NAMES: [&str; 9] = [
    "non_finite_loss",
    "non_finite_per_token_logp",
    "non_finite_per_token_loss",
    "non_finite_kl",
    "non_finite_clipped",
    "non_finite_entropy",
    "non_finite_dlogits",
    "non_finite_dhidden",
    "non_finite_dlm_head",
];

impl Figure {
    /// Every name a figure may have, for messages.
    pub const NAMES: &'static str = "roofline_over_baseline, peak_over_floor, drift_over_bound, undeclared_matmuls, an output's name (loss, per_token_logp, per_token_loss, kl, clipped, entropy, dlogits, dhidden, dlm_head), or non_finite_<output> (non_finite_loss, ...)";

    /// The figure of a name in `expect:`.
    pub fn parse(name: &str) -> Option<Figure> {
        Some(match name {
            "roofline_over_baseline" => Figure::RooflineOverBaseline,
            "peak_over_floor" => Figure::PeakOverFloor,
            "drift_over_bound" => Figure::DriftOverBound,
            "undeclared_matmuls" => Figure::UndeclaredMatmuls,
            other if other.starts_with("non_finite_") => {
                let i = NON_FINITE_NAMES.iter().position(|n| *n == other)?;
                Figure::NonFinite(OutputName::ALL[i])
            }
            other => {
                Figure::RelativeError(OutputName::ALL.into_iter().find(|o| o.name() == other)?)
            }
        })
    }

    /// Its name in `expect:`.
    pub fn name(self) -> &'static str {
        match self {
            Figure::RooflineOverBaseline => "roofline_over_baseline",
            Figure::PeakOverFloor => "peak_over_floor",
            Figure::DriftOverBound => "drift_over_bound",
            Figure::UndeclaredMatmuls => "undeclared_matmuls",
            Figure::RelativeError(o) => o.name(),
            Figure::NonFinite(o) => {
                NON_FINITE_NAMES[OutputName::ALL.iter().position(|x| *x == o).unwrap_or(0)]
            }
        }
    }

    /// The kind of failure the figure measures.
    pub fn reason(self) -> Reason {
        match self {
            Figure::RooflineOverBaseline => Reason::Speed,
            Figure::PeakOverFloor => Reason::Memory,
            Figure::DriftOverBound => Reason::Trajectory,
            Figure::UndeclaredMatmuls => Reason::Precision,
            Figure::RelativeError(_) | Figure::NonFinite(_) => Reason::Gate,
        }
    }
}

/// An expected figure: one value, or the range `[least, most]` the figure spans over the
/// trials an entry covers (several cases, say).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// One value.
    One(f64),
    /// The least and the most.
    Range([f64; 2]),
}

impl Expect {
    /// The least and the most the figure may be before the margin.
    pub fn bounds(self) -> (f64, f64) {
        match self {
            Expect::One(v) => (v, v),
            Expect::Range([a, b]) => (a, b),
        }
    }

    /// Whether `got` is within the figure, widened by `margin` (a fraction) at each end.
    pub fn admits(self, got: f64, margin: f64) -> bool {
        let (lo, hi) = self.bounds();
        got.is_finite() && got >= lo * (1.0 - margin) && got <= hi * (1.0 + margin)
    }

    /// Why the figure is not usable, if it is not: each value finite and > 0, a range
    /// in order.
    pub fn check(self) -> Result<(), String> {
        let (lo, hi) = self.bounds();
        if !(lo.is_finite() && hi.is_finite() && lo > 0.0) {
            return Err(format!(
                "must be a finite number > 0 (or [least, most]), not {}",
                self
            ));
        }
        if lo > hi {
            return Err(format!("is a range [least, most] out of order: {self}"));
        }
        Ok(())
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let one = |x: f64| {
            if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e4) {
                format!("{x:.3e}")
            } else {
                format!("{x:.3}")
            }
        };
        match *self {
            Expect::One(v) => f.write_str(&one(v)),
            Expect::Range([a, b]) => write!(f, "[{}, {}]", one(a), one(b)),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Expect {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(f64),
            Range([f64; 2]),
            Other(serde_yaml_ng::Value),
        }
        match Raw::deserialize(d)? {
            Raw::One(v) => Ok(Expect::One(v)),
            Raw::Range(r) => Ok(Expect::Range(r)),
            Raw::Other(v) => Err(D::Error::custom(format!(
                "a figure's value is a number (`2.4e-3`) or `[least, most]`, not {}",
                serde_yaml_ng::to_string(&v).unwrap_or_default().trim()
            ))),
        }
    }
}
