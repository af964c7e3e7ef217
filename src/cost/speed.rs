//! Speed as conformance: an implementation's roofline time against jax_baseline's on the
//! same case and generation (`max_roofline_over_baseline`), and on TPU chips the measured
//! time against the roofline (efficiency). Both sides' figures are derived
//! ([`super::DerivedCost`]), never declared.

use super::roofline::{human_time, Roofline};
use super::DerivedCost;
use crate::precision_class::PrecisionClass;
use serde::{Deserialize, Serialize};

/// The implementation every speed budget is judged against (with the options of the
/// trial's precision class, [`SpeedClass`]).
pub const BASELINE: &str = "jax_baseline";

/// The precision class a trial's speed is compared within (docs/spec.md, "Precision
/// classes"): the class its entry must reach on the case's dtype, and that class's own
/// baseline, jax_baseline computing dz as the class does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeedClass {
    /// The class.
    pub class: PrecisionClass,
    /// The name of the class's baseline (a configured jax_baseline entry with the
    /// class's `dz_precision`, else `jax_baseline@speed-baseline[-CLASS]`).
    pub baseline: String,
}

/// A speed budget's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedReport {
    /// The configured bound on roofline / baseline roofline.
    pub max_roofline_over_baseline: f64,
    /// Generation both rooflines are for.
    pub generation: String,
    /// This implementation's roofline time, seconds.
    pub roofline_s: f64,
    /// jax_baseline's roofline time on the same case and generation, seconds.
    pub baseline_roofline_s: f64,
    /// roofline_s / baseline_roofline_s.
    pub ratio: f64,
    /// The class the ratio is within and its baseline (absent in records from before the
    /// classes, and for a sweep's plain jax_baseline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<SpeedClass>,
    /// The class the module's own matmuls allow (its precision manifest), when looser
    /// than `class`: the comparison is then not within a class, and fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_class: Option<PrecisionClass>,
    /// ratio ≤ the bound, and the module in its class.
    pub passed: bool,
    /// One line: both times and their inputs (FLOPs, bytes), the ratio and the budget.
    pub message: String,
}

fn inputs(cost: &DerivedCost, r: &Roofline) -> String {
    let mm = cost
        .matmul_equivalents
        .map(|m| format!("{m:.2} logits-matmuls, "))
        .unwrap_or_default();
    let steps = if cost.grid_steps > 0.0 {
        format!(
            " + {:.0} grid steps = {}",
            cost.grid_steps,
            human_time(r.steps_s)
        )
    } else {
        String::new()
    };
    format!(
        "{} ({mm}{:.4e} MXU FLOP weighted, {:.4e} HBM B; {}-bound{steps})",
        human_time(r.time_s),
        cost.work.matmul_pass_flops,
        cost.work.hbm_bytes,
        if r.mxu_s >= r.hbm_s { "MXU" } else { "HBM" }
    )
}

/// What a speed budget is judged on: an implementation's derived cost and roofline and
/// jax_baseline's on the same case and generation (measured by the backend; the judge
/// compares them with the bound, [`judge`]).
#[derive(Debug, Clone)]
pub struct SpeedMeasure {
    /// This implementation's derived cost.
    pub own: DerivedCost,
    /// Its roofline.
    pub own_roofline: Roofline,
    /// jax_baseline's derived cost on the case.
    pub baseline: DerivedCost,
    /// Its roofline on the same generation.
    pub baseline_roofline: Roofline,
    /// The class compared within, and its baseline (whose cost `baseline` is).
    pub class: SpeedClass,
    /// The class the module's precision manifest gives (None: no manifest).
    pub manifest_class: Option<PrecisionClass>,
}

impl SpeedMeasure {
    /// Judges the measure against the bound `max` ([`judge`]) within its class: a module
    /// whose manifest puts it below the class it is compared in fails, whatever its ratio.
    pub fn judge(&self, max: f64) -> SpeedReport {
        let mut r = judge_against(
            max,
            (&self.own, &self.own_roofline),
            (&self.baseline, &self.baseline_roofline),
            &format!(
                "{} (the {} class's baseline)",
                self.class.baseline, self.class.class
            ),
        );
        let below = self.manifest_class.filter(|&m| m < self.class.class);
        if let Some(m) = below {
            r.passed = false;
            r.message.push_str(&format!(
                "; but its precision manifest (its matmuls and the options it names) makes it class {m}, below the {} class it is compared in: OUT OF CLASS",
                self.class.class
            ));
        }
        r.class = Some(self.class.clone());
        r.manifest_class = below;
        r
    }
}

/// Judges `own` against jax_baseline's roofline with the bound `max`.
pub fn judge(
    max: f64,
    own: (&DerivedCost, &Roofline),
    baseline: (&DerivedCost, &Roofline),
) -> SpeedReport {
    judge_against(max, own, baseline, BASELINE)
}

/// Judges `own` against the roofline of the baseline called `name` with the bound `max`.
fn judge_against(
    max: f64,
    own: (&DerivedCost, &Roofline),
    baseline: (&DerivedCost, &Roofline),
    name: &str,
) -> SpeedReport {
    let ratio = own.1.time_s / baseline.1.time_s;
    let passed = ratio.is_finite() && ratio <= max;
    let message = format!(
        "speed: roofline {} / {name} {} = {ratio:.3}× on {}; budget {max}×: {}",
        inputs(own.0, own.1),
        inputs(baseline.0, baseline.1),
        own.1.generation,
        if passed { "within" } else { "OVER BUDGET" }
    );
    SpeedReport {
        max_roofline_over_baseline: max,
        generation: own.1.generation.clone(),
        roofline_s: own.1.time_s,
        baseline_roofline_s: baseline.1.time_s,
        ratio,
        class: None,
        manifest_class: None,
        passed,
        message,
    }
}

/// Measured time against the roofline on real chips (`pjrt-tpu`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Median measured time, seconds.
    pub measured_s: f64,
    /// Roofline time, seconds.
    pub roofline_s: f64,
    /// measured / roofline (≥ 1 unless the model over-counts).
    pub measured_over_roofline: f64,
}

impl Efficiency {
    /// From a measured median and a roofline; None when either is not a positive number.
    pub fn of(measured_s: f64, roofline: &Roofline) -> Option<Efficiency> {
        (measured_s > 0.0 && roofline.time_s > 0.0 && measured_s.is_finite()).then(|| Efficiency {
            measured_s,
            roofline_s: roofline.time_s,
            measured_over_roofline: measured_s / roofline.time_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::roofline::{generation_of_topology, roofline};
    use crate::cost::Work;

    fn cost(flops: f64, bytes: f64) -> DerivedCost {
        DerivedCost {
            work: Work {
                matmul_flops: flops,
                matmul_pass_flops: flops,
                hbm_bytes: bytes,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_just_over_its_speed_budget_fails_and_just_under_passes() {
        let g = generation_of_topology("v6e:2x2").unwrap();
        let base = cost(0.0, 76.5e9);
        let rb = roofline(&base, g);
        for (bytes, pass) in [
            (76.5e9 * 1.0009, true),
            (76.5e9 * 1.0011, false),
            (102.4e9, false),
            (8e9, true),
        ] {
            let own = cost(0.0, bytes);
            let r = judge(1.001, (&own, &roofline(&own, g)), (&base, &rb));
            assert_eq!(r.passed, pass, "{}", r.message);
            assert!((r.ratio - bytes / 76.5e9).abs() < 1e-12);
            assert!(
                r.message.contains("jax_baseline") && r.message.contains("HBM B"),
                "{}",
                r.message
            );
            assert_eq!(r.message.contains("OVER BUDGET"), !pass);
        }
        // Grid steps are named with their time.
        let stepped = DerivedCost {
            grid_steps: 1000.0,
            ..cost(0.0, 76.5e9)
        };
        let r = judge(1.0, (&stepped, &roofline(&stepped, g)), (&base, &rb));
        assert!(
            r.message.contains("+ 1000 grid steps = 430.0µs"),
            "{}",
            r.message
        );
        // A NaN time never passes.
        let nan = cost(0.0, f64::NAN);
        assert!(!judge(10.0, (&nan, &roofline(&nan, g)), (&base, &rb)).passed);
    }

    /// Within its class a measure passes on its ratio; a module whose manifest gives a
    /// looser class than the one it is compared in fails at any ratio.
    #[test]
    fn a_speed_measure_is_judged_within_its_class() {
        let g = generation_of_topology("v6e:2x2").unwrap();
        let base = cost(0.0, 76.5e9);
        let own = cost(0.0, 70e9);
        let m = |manifest| SpeedMeasure {
            own_roofline: roofline(&own, g),
            own: own.clone(),
            baseline_roofline: roofline(&base, g),
            baseline: base.clone(),
            class: SpeedClass {
                class: PrecisionClass::Bf16x3,
                baseline: "jax_baseline@x3dlm".into(),
            },
            manifest_class: manifest,
        };
        for manifest in [
            None,
            Some(PrecisionClass::F32),
            Some(PrecisionClass::Bf16x3),
        ] {
            let r = m(manifest).judge(1.0);
            assert!(r.passed, "{}", r.message);
            assert!(
                r.message
                    .contains("/ jax_baseline@x3dlm (the bf16x3 class's baseline) "),
                "{}",
                r.message
            );
            assert_eq!(r.manifest_class, None);
            assert_eq!(r.class.as_ref().unwrap().class, PrecisionClass::Bf16x3);
        }
        let r = m(Some(PrecisionClass::Bf16)).judge(1.0);
        assert!(!r.passed && r.ratio < 1.0, "{}", r.message);
        assert_eq!(r.manifest_class, Some(PrecisionClass::Bf16));
        assert!(r.message.contains("makes it class bf16"), "{}", r.message);
    }

    #[test]
    fn efficiency_is_measured_over_roofline() {
        let g = generation_of_topology("v6e:2x2").unwrap();
        let r = roofline(&cost(0.0, 1.638e9), g); // 1 ms
        let e = Efficiency::of(2.5e-3, &r).unwrap();
        assert!((e.measured_over_roofline - 2.5).abs() < 1e-9, "{e:?}");
        assert!(Efficiency::of(0.0, &r).is_none() && Efficiency::of(f64::NAN, &r).is_none());
    }
}
